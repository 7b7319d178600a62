package store

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// contract is the behaviour every Store implementation must have.
func contract(t *testing.T, open func(t *testing.T) Store) {
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Millisecond)

	t.Run("rows round trip and update", func(t *testing.T) {
		s := open(t)
		if err := s.PutSession(ctx, Session{ID: "s1", Tenant: "a", Created: now, Heartbeat: now, Data: []byte(`{"tags":[]}`)}); err != nil {
			t.Fatal(err)
		}
		if err := s.PutSession(ctx, Session{ID: "s1", Tenant: "a", Created: now, Heartbeat: now.Add(time.Minute), Closed: true}); err != nil {
			t.Fatal(err)
		}
		ss, err := s.Sessions(ctx)
		if err != nil || len(ss) != 1 || !ss[0].Heartbeat.Equal(now.Add(time.Minute)) || !ss[0].Closed || ss[0].Tenant != "a" {
			t.Fatalf("sessions %+v %v", ss, err)
		}
		// A heartbeat moves only the heartbeat, and only forward.
		if err := s.PutSession(ctx, Session{ID: "s2", Tenant: "a", Created: now, Heartbeat: now, Data: []byte(`{"tags":["x"]}`)}); err != nil {
			t.Fatal(err)
		}
		for _, at := range []time.Time{now.Add(2 * time.Minute), now.Add(time.Minute)} {
			if err := s.TouchSession(ctx, "s2", at); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.TouchSession(ctx, "missing", now); err != nil {
			t.Fatalf("touching a missing session: %v", err)
		}
		ss, err = s.Sessions(ctx)
		if err != nil || len(ss) != 2 || ss[1].ID != "s2" || !ss[1].Heartbeat.Equal(now.Add(2*time.Minute)) || string(ss[1].Data) != `{"tags":["x"]}` || ss[1].Closed {
			t.Fatalf("a touched session %+v %v", ss, err)
		}
		if err := s.DeleteSession(ctx, "s2"); err != nil {
			t.Fatal(err)
		}
		if err := s.PutRun(ctx, Run{ID: "s1:train:0", Tenant: "a", SessionID: "s1", BaseModel: "m", Created: now, LastRequest: now, Live: true, Data: []byte(`{"rank":4}`)}); err != nil {
			t.Fatal(err)
		}
		runs, err := s.Runs(ctx)
		if err != nil || len(runs) != 1 || !runs[0].Live || string(runs[0].Data) != `{"rank":4}` {
			t.Fatalf("runs %+v %v", runs, err)
		}
		exp := now.Add(time.Hour)
		if err := s.PutCheckpoint(ctx, Checkpoint{Path: "tinker://x/weights/a", Owner: "a", ModelID: "x", Created: now, ExpiresAt: &exp}); err != nil {
			t.Fatal(err)
		}
		if err := s.PutCheckpoint(ctx, Checkpoint{Path: "tinker://x/weights/b", Owner: "a", ModelID: "x", Created: now, Public: true}); err != nil {
			t.Fatal(err)
		}
		cs, err := s.Checkpoints(ctx)
		if err != nil || len(cs) != 2 || cs[0].ExpiresAt == nil || !cs[0].ExpiresAt.Equal(exp) || cs[1].ExpiresAt != nil || !cs[1].Public {
			t.Fatalf("checkpoints %+v %v", cs, err)
		}
		if err := s.DeleteCheckpoint(ctx, "tinker://x/weights/a"); err != nil {
			t.Fatal(err)
		}
		if cs, _ := s.Checkpoints(ctx); len(cs) != 1 {
			t.Fatalf("after delete: %+v", cs)
		}
		if err := s.PutSampler(ctx, Sampler{ID: "p", Tenant: "a", SessionID: "s1"}); err != nil {
			t.Fatal(err)
		}
		if err := s.DeleteSampler(ctx, "p"); err != nil {
			t.Fatal(err)
		}
		if ps, _ := s.Samplers(ctx); len(ps) != 0 {
			t.Fatalf("samplers after delete: %+v", ps)
		}
		if err := s.DeleteRun(ctx, "s1:train:0"); err != nil {
			t.Fatal(err)
		}
		if runs, _ := s.Runs(ctx); len(runs) != 0 {
			t.Fatalf("runs after delete: %+v", runs)
		}
		if err := s.DeleteSession(ctx, "s1"); err != nil {
			t.Fatal(err)
		}
		if ss, _ := s.Sessions(ctx); len(ss) != 0 {
			t.Fatalf("sessions after delete: %+v", ss)
		}
	})

	t.Run("tenants and placements", func(t *testing.T) {
		s := open(t)
		for _, id := range []string{"t-1", "t-2", "t-1"} {
			if err := s.TouchTenant(ctx, id); err != nil {
				t.Fatal(err)
			}
		}
		if ts, err := s.Tenants(ctx); err != nil || len(ts) != 2 {
			t.Fatalf("tenants %v %v", ts, err)
		}
		_ = s.PutPlacement(ctx, "a", "r1")
		_ = s.PutPlacement(ctx, "b", "r1")
		_ = s.PutPlacement(ctx, "a", "r2") // moved
		_ = s.DeletePlacement(ctx, "b")
		if p, err := s.Placements(ctx); err != nil || len(p) != 1 || p["a"] != "r2" {
			t.Fatalf("placements %v %v", p, err)
		}
	})

	t.Run("futures reach one terminal state", func(t *testing.T) {
		s := open(t)
		f, fresh, err := s.CreateFuture(ctx, Future{ID: "f1", Tenant: "a", Kind: "OptimStep", OpKey: "m#1", Created: now})
		if err != nil || !fresh || f.State != FuturePending {
			t.Fatalf("create: %+v %v %v", f, fresh, err)
		}
		again, fresh, err := s.CreateFuture(ctx, Future{ID: "f2", Tenant: "a", Kind: "OptimStep", OpKey: "m#1", Created: now})
		if err != nil || fresh || again.ID != "f1" {
			t.Fatalf("retry with the same op key: %+v %v %v", again, fresh, err)
		}
		// Many finishers race; exactly one wins and its result stays.
		var wg sync.WaitGroup
		wins := make(chan string, 8)
		for i := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				state := FutureComplete
				if i%2 == 1 {
					state = FutureFailed
				}
				ok, err := s.FinishFuture(ctx, "f1", state, []byte(fmt.Sprint(i)), "user")
				if err != nil {
					t.Error(err)
				}
				if ok {
					wins <- fmt.Sprint(i)
				}
			}()
		}
		wg.Wait()
		close(wins)
		var winners []string
		for w := range wins {
			winners = append(winners, w)
		}
		got, err := s.GetFuture(ctx, "f1")
		if err != nil || len(winners) != 1 || string(got.Result) != winners[0] || got.State == FuturePending {
			t.Fatalf("winners %v, future %+v %v", winners, got, err)
		}
		if _, err := s.GetFuture(ctx, "nope"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("missing future: %v", err)
		}
	})

	t.Run("crash recovery and sweeping", func(t *testing.T) {
		s := open(t)
		old := now.Add(-48 * time.Hour)
		for i, st := range []string{FuturePending, FuturePending, FutureComplete} {
			if _, _, err := s.CreateFuture(ctx, Future{ID: fmt.Sprint("p", i), Tenant: "a", Kind: "Sample", Created: old}); err != nil {
				t.Fatal(err)
			}
			if st != FuturePending {
				if _, err := s.FinishFuture(ctx, fmt.Sprint("p", i), st, []byte(`{}`), ""); err != nil {
					t.Fatal(err)
				}
			}
		}
		n, err := s.FailOrphaned(ctx, "me", 0, "server restarted")
		if err != nil || n != 2 {
			t.Fatalf("fail orphaned: %d %v", n, err)
		}
		f, _ := s.GetFuture(ctx, "p0")
		if f.State != FutureFailed || f.Category != "server" || string(f.Result) != "server restarted" {
			t.Fatalf("after crash: %+v", f)
		}
		if _, _, err := s.CreateFuture(ctx, Future{ID: "new", Tenant: "a", Kind: "Sample", Created: now}); err != nil {
			t.Fatal(err)
		}
		n, err = s.SweepFutures(ctx, now.Add(-24*time.Hour))
		if err != nil || n != 3 {
			t.Fatalf("sweep: %d %v", n, err)
		}
		if _, err := s.GetFuture(ctx, "new"); err != nil {
			t.Fatalf("sweep removed a recent future: %v", err)
		}
	})

	t.Run("step metrics keep a window per run", func(t *testing.T) {
		s := open(t)
		const keep = 3
		for step := int64(1); step <= 5; step++ {
			for _, run := range []string{"a", "b"} {
				data := fmt.Sprintf(`{"run":%q,"step":%d}`, run, step)
				if err := s.AddStepMetric(ctx, StepMetric{RunID: run, Step: step, At: now, Data: []byte(data)}, keep); err != nil {
					t.Fatal(err)
				}
			}
		}
		got, err := s.StepMetrics(ctx, "a", 0, 100)
		if err != nil || len(got) != keep {
			t.Fatalf("run a: %+v %v", got, err)
		}
		for i, m := range got {
			want := fmt.Sprintf(`{"run":"a","step":%d}`, 3+i)
			if m.RunID != "a" || m.Step != int64(3+i) || string(m.Data) != want || !m.At.Equal(now) {
				t.Fatalf("step %d: %+v (%s)", i, m, m.Data)
			}
		}
		// Replaying an old step keeps the newest ones, and replaces its row.
		if err := s.AddStepMetric(ctx, StepMetric{RunID: "a", Step: 4, At: now, Data: []byte(`{"again":true}`)}, keep); err != nil {
			t.Fatal(err)
		}
		got, _ = s.StepMetrics(ctx, "a", 3, 1)
		if len(got) != 1 || got[0].Step != 4 || string(got[0].Data) != `{"again":true}` {
			t.Fatalf("after step 3, limit 1: %+v", got)
		}
		if got, _ := s.StepMetrics(ctx, "a", 0, 100); len(got) != keep || got[keep-1].Step != 5 {
			t.Fatalf("replay dropped steps: %+v", got)
		}
		if err := s.DeleteStepMetrics(ctx, "a"); err != nil {
			t.Fatal(err)
		}
		if got, _ := s.StepMetrics(ctx, "a", 0, 100); len(got) != 0 {
			t.Fatalf("deleted run still has %d steps", len(got))
		}
		if got, _ := s.StepMetrics(ctx, "b", 0, 100); len(got) != keep {
			t.Fatalf("deleting run a touched run b: %+v", got)
		}
		if err := s.AddStepMetric(ctx, StepMetric{RunID: "c", Step: 1, At: now}, 0); err == nil {
			t.Fatal("keep 0 accepted")
		}
	})
}

func TestOrphansLeasesAndHeartbeats(t *testing.T) {
	forEachStore(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		now := time.Now()
		if err := s.GatewayHeartbeat(ctx, "alive"); err != nil {
			t.Fatal(err)
		}
		for _, f := range []Future{{ID: "a", Owner: "alive"}, {ID: "d", Owner: "dead"}, {ID: "m", Owner: "me"}} {
			f.Tenant, f.Kind, f.Created = "t", "Sample", now
			if _, _, err := s.CreateFuture(ctx, f); err != nil {
				t.Fatal(err)
			}
		}
		n, err := s.FailOrphaned(ctx, "me", time.Minute, "gateway died")
		if err != nil || n != 1 {
			t.Fatalf("orphans: %d %v", n, err)
		}
		for id, want := range map[string]string{"a": FuturePending, "d": FutureFailed, "m": FuturePending} {
			if f, _ := s.GetFuture(ctx, id); f.State != want {
				t.Fatalf("future %s: %s, want %s", id, f.State, want)
			}
		}
		ok, err := s.TryLease(ctx, "sweep", "g1", time.Minute)
		if err != nil || !ok {
			t.Fatalf("first lease: %v %v", ok, err)
		}
		if ok, _ := s.TryLease(ctx, "sweep", "g2", time.Minute); ok {
			t.Fatal("a second holder took a live lease")
		}
		if ok, _ := s.TryLease(ctx, "sweep", "g1", time.Minute); !ok {
			t.Fatal("the holder could not renew its lease")
		}
		if ok, _ := s.TryLease(ctx, "sweep", "g1", -time.Second); !ok { // let it lapse
			t.Fatal("renew")
		}
		if ok, _ := s.TryLease(ctx, "sweep", "g2", time.Minute); !ok {
			t.Fatal("an expired lease was not taken over")
		}
	})
}

// forEachStore runs f against SQLite, and PostgreSQL when SKEIN_TEST_POSTGRES holds a DSN.
func forEachStore(t *testing.T, f func(t *testing.T, s Store)) {
	t.Run("sqlite", func(t *testing.T) { f(t, openSQLite(t)) })
	if dsn := os.Getenv("SKEIN_TEST_POSTGRES"); dsn != "" {
		t.Run("postgres", func(t *testing.T) { f(t, openPostgres(t, dsn)) })
	}
}

func openSQLite(t *testing.T) Store {
	s, err := OpenSQLite(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// openPostgres gives each test a fresh schema in the database.
func openPostgres(t *testing.T, dsn string) Store {
	schema := fmt.Sprintf("t_%d", time.Now().UnixNano())
	admin, err := OpenPostgres(dsn)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.db.Exec("CREATE SCHEMA " + schema); err != nil {
		t.Fatal(err)
	}
	admin.Close()
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	s, err := OpenPostgres(dsn + sep + "search_path=" + schema)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestPostgresContract(t *testing.T) {
	dsn := os.Getenv("SKEIN_TEST_POSTGRES")
	if dsn == "" {
		t.Skip("SKEIN_TEST_POSTGRES not set (.ci/run starts PostgreSQL and sets it)")
	}
	contract(t, func(t *testing.T) Store { return openPostgres(t, dsn) })
}

func TestSQLiteContract(t *testing.T) {
	contract(t, func(t *testing.T) Store {
		s, err := OpenSQLite(filepath.Join(t.TempDir(), "state.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	})
}

func TestSQLiteReopenKeepsDataAndSchema(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s, err := OpenSQLite(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := s.PutSession(ctx, Session{ID: "s", Tenant: "t", Created: time.Now(), Heartbeat: time.Now()}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s, err = OpenSQLite(path) // migrations must not run twice
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if ss, err := s.Sessions(ctx); err != nil || len(ss) != 1 {
		t.Fatalf("after reopen: %+v %v", ss, err)
	}
}

// create-future → complete-future → read-result, one op each, on each backend.
func BenchmarkFutureLifecycle(b *testing.B) {
	run := func(b *testing.B, s Store) {
		ctx := context.Background()
		payload := []byte(`{"metrics":{"loss:sum":1.25},"type":"optim_step"}`)
		b.ResetTimer()
		for i := range b.N {
			id := fmt.Sprint("f", i)
			if _, _, err := s.CreateFuture(ctx, Future{ID: id, Tenant: "t", Kind: "OptimStep", OpKey: "m#" + id, Created: time.Now()}); err != nil {
				b.Fatal(err)
			}
			if _, err := s.FinishFuture(ctx, id, FutureComplete, payload, ""); err != nil {
				b.Fatal(err)
			}
			if _, err := s.GetFuture(ctx, id); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "lifecycles/s")
	}
	b.Run("sqlite", func(b *testing.B) {
		s, err := OpenSQLite(filepath.Join(b.TempDir(), "state.db"))
		if err != nil {
			b.Fatal(err)
		}
		defer s.Close()
		run(b, s)
	})
	if dsn := os.Getenv("SKEIN_TEST_POSTGRES"); dsn != "" {
		b.Run("postgres", func(b *testing.B) {
			s, err := OpenPostgres(dsn)
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			if _, err := s.db.Exec(`DELETE FROM futures`); err != nil {
				b.Fatal(err)
			}
			run(b, s)
		})
	}
}
