package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"
)

// A run's lease: one holder at a time; renewal keeps the epoch, a takeover after a lapse raises
// it (also by the same holder), a release lets another take it at once, and the epoch never goes
// back. Against SQLite and the real PostgreSQL.
func TestRunLeaseExpiryRenewalTakeover(t *testing.T) {
	forEachStore(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		l, err := s.AcquireRunLease(ctx, "r1", "g1", "http://g1", time.Minute)
		if err != nil || l.Holder != "g1" || l.Epoch != 1 || l.Addr != "http://g1" || !l.Live(time.Now()) {
			t.Fatalf("first acquire: %+v %v", l, err)
		}
		// Another gateway sees it held and where to forward.
		if l, err := s.AcquireRunLease(ctx, "r1", "g2", "http://g2", time.Minute); err != nil || l.Holder != "g1" || l.Epoch != 1 || l.Addr != "http://g1" {
			t.Fatalf("g2 took a live lease: %+v %v", l, err)
		}
		// Renewal by the holder keeps the epoch and moves the expiry.
		before := l.Until
		time.Sleep(5 * time.Millisecond)
		if l, err = s.AcquireRunLease(ctx, "r1", "g1", "http://g1", time.Minute); err != nil || l.Epoch != 1 || !l.Until.After(before) {
			t.Fatalf("renewal: %+v %v", l, err)
		}
		// Let it lapse (a renewal with a past expiry): g2 takes it at a higher epoch.
		if l, err = s.AcquireRunLease(ctx, "r1", "g1", "http://g1", -time.Second); err != nil || l.Holder != "g1" || l.Live(time.Now()) {
			t.Fatalf("lapse: %+v %v", l, err)
		}
		if l, err = s.AcquireRunLease(ctx, "r1", "g2", "http://g2", time.Minute); err != nil || l.Holder != "g2" || l.Epoch != 2 || l.Addr != "http://g2" {
			t.Fatalf("takeover: %+v %v", l, err)
		}
		// The old holder cannot come back while g2's is live.
		if l, _ := s.AcquireRunLease(ctx, "r1", "g1", "http://g1", time.Minute); l.Holder != "g2" || l.Epoch != 2 {
			t.Fatalf("old holder: %+v", l)
		}
		// Even the same holder taking its own lapsed lease raises the epoch: ops it sent before
		// the lapse must not pass for ops of the new taking.
		_, _ = s.AcquireRunLease(ctx, "r1", "g2", "http://g2", -time.Second)
		if l, _ = s.AcquireRunLease(ctx, "r1", "g2", "http://g2", time.Minute); l.Epoch != 3 {
			t.Fatalf("re-taking a lapsed lease: %+v", l)
		}
		// Release: a stale epoch's release changes nothing; the right one lets g1 in at once.
		if err := s.ReleaseRunLease(ctx, "r1", "g2", 2); err != nil {
			t.Fatal(err)
		}
		if l, _ := s.RunLeaseOf(ctx, "r1"); !l.Live(time.Now()) {
			t.Fatal("a stale epoch's release ended the lease")
		}
		if err := s.ReleaseRunLease(ctx, "r1", "g2", 3); err != nil {
			t.Fatal(err)
		}
		if l, _ = s.AcquireRunLease(ctx, "r1", "g1", "http://g1", time.Minute); l.Holder != "g1" || l.Epoch != 4 {
			t.Fatalf("after release: %+v", l)
		}
		if _, err := s.RunLeaseOf(ctx, "never"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("missing lease: %v", err)
		}
		if _, err := s.AcquireRunLease(ctx, "", "g1", "", time.Minute); err == nil {
			t.Fatal("a lease of no run")
		}
		// A restarted gateway (a new holder name at the same address) takes its dead
		// predecessor's live lease at once, at a new epoch; another address still cannot.
		if l, _ = s.AcquireRunLease(ctx, "r1", "g1-restarted", "http://g1", time.Minute); l.Holder != "g1-restarted" || l.Epoch != 5 {
			t.Fatalf("restart at the same address: %+v", l)
		}
		if l, _ = s.AcquireRunLease(ctx, "r1", "g3", "", time.Minute); l.Holder != "g1-restarted" {
			t.Fatalf("a gateway with no address took a live lease: %+v", l)
		}
	})
}

// Renewing reports exactly the leases still held: one taken by another gateway after a lapse
// is not renewed (nor given back to its old holder).
func TestRunLeaseRenewalReportsWhatIsHeld(t *testing.T) {
	forEachStore(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		for _, r := range []string{"a", "b", "c"} {
			if _, err := s.AcquireRunLease(ctx, r, "g1", "", time.Minute); err != nil {
				t.Fatal(err)
			}
		}
		_, _ = s.AcquireRunLease(ctx, "b", "g1", "", -time.Second) // b lapses
		if l, _ := s.AcquireRunLease(ctx, "b", "g2", "", time.Minute); l.Holder != "g2" {
			t.Fatalf("b: %+v", l)
		}
		_, _ = s.AcquireRunLease(ctx, "c", "g1", "", -time.Second) // c lapses, untaken
		held, err := s.RenewRunLeases(ctx, "g1", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		var runs []string
		for _, l := range held {
			runs = append(runs, l.Run)
			if l.Holder != "g1" || !l.Live(time.Now()) || l.Epoch != 1 {
				t.Fatalf("renewed %+v", l)
			}
		}
		if !slices.Equal(runs, []string{"a"}) {
			t.Fatalf("renewed %v, want [a]", runs)
		}
		if l, _ := s.RunLeaseOf(ctx, "b"); l.Holder != "g2" || l.Epoch != 2 {
			t.Fatalf("b after g1's renewal: %+v", l)
		}
	})
}

// Racing gateways for one lapsed lease: exactly one takes it, at one new epoch.
func TestRunLeaseRaceHasOneWinner(t *testing.T) {
	forEachStore(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		_, _ = s.AcquireRunLease(ctx, "r", "dead", "", -time.Second)
		var mu sync.Mutex
		winners := map[string]int64{}
		var wg sync.WaitGroup
		for i := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				g := string(rune('A' + i))
				l, err := s.AcquireRunLease(ctx, "r", g, "", time.Minute)
				if err != nil {
					t.Error(err)
					return
				}
				if l.Holder == g {
					mu.Lock()
					winners[g] = l.Epoch
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		if len(winners) != 1 {
			t.Fatalf("winners %v, want exactly one", winners)
		}
		for _, e := range winners {
			if e != 2 {
				t.Fatalf("epoch %d, want 2", e)
			}
		}
	})
}

// A result written under a stale epoch is refused and the future stays pending for the run's new
// holder, who adopts it and stores its result; orphaned runs are those with pending ops that
// carry their request and no live lease.
func TestStaleEpochIsRefused(t *testing.T) {
	forEachStore(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		l1, _ := s.AcquireRunLease(ctx, "r", "g1", "", time.Minute)
		for i, id := range []string{"f1", "f2"} {
			f := Future{ID: id, Tenant: "t", Kind: "OptimStep", OpKey: "r#" + string(rune('1'+i)), Owner: "g1",
				Created: time.Now(), Run: "r", Request: []byte(`{"seq_id":1}`)}
			if _, _, err := s.CreateFuture(ctx, f); err != nil {
				t.Fatal(err)
			}
		}
		// Not orphaned while its lease is live; such futures are not failed as orphans either.
		if runs, err := s.OrphanedRuns(ctx, 10); err != nil || len(runs) != 0 {
			t.Fatalf("orphaned while held: %v %v", runs, err)
		}
		if n, err := s.FailOrphaned(ctx, "g2", 0, "dead"); err != nil || n != 0 {
			t.Fatalf("failed %d ops that carry their request (%v)", n, err)
		}
		// While g1 holds r, its fenced write goes through.
		if ok, err := s.FinishFutureFenced(ctx, "f1", FutureComplete, []byte(`{}`), "", Fence{"r", "g1", l1.Epoch}); err != nil || !ok {
			t.Fatalf("fenced finish by the holder: %v %v", ok, err)
		}
		_, _ = s.AcquireRunLease(ctx, "r", "g1", "", -time.Second) // g1 dies
		if runs, err := s.OrphanedRuns(ctx, 10); err != nil || !slices.Equal(runs, []string{"r"}) {
			t.Fatalf("orphaned: %v %v", runs, err)
		}
		l2, _ := s.AcquireRunLease(ctx, "r", "g2", "", time.Minute)
		ops, err := s.PendingOps(ctx, "r")
		if err != nil || len(ops) != 1 || ops[0].ID != "f2" || string(ops[0].Request) != `{"seq_id":1}` || ops[0].Run != "r" {
			t.Fatalf("pending ops: %+v %v", ops, err)
		}
		// g1, still running somewhere, tries to store f2's result: refused, f2 stays pending.
		if ok, err := s.FinishFutureFenced(ctx, "f2", FutureComplete, []byte(`{"old":1}`), "", Fence{"r", "g1", l1.Epoch}); ok || !errors.Is(err, ErrFenced) {
			t.Fatalf("a stale epoch's write: %v %v", ok, err)
		}
		if f, _ := s.GetFuture(ctx, "f2"); f.State != FuturePending {
			t.Fatalf("f2 is %s after a refused write", f.State)
		}
		if ok, err := s.AdoptFuture(ctx, "f2", "g2"); err != nil || !ok {
			t.Fatalf("adopt: %v %v", ok, err)
		}
		if ok, err := s.FinishFutureFenced(ctx, "f2", FutureComplete, []byte(`{"new":1}`), "", Fence{"r", "g2", l2.Epoch}); err != nil || !ok {
			t.Fatalf("the new holder's write: %v %v", ok, err)
		}
		if ops, _ := s.PendingOps(ctx, "r"); len(ops) != 0 {
			t.Fatalf("still pending: %+v", ops)
		}
		if f, _ := s.GetFuture(ctx, "f2"); f.Request != nil {
			t.Fatalf("a finished op keeps its request (%d bytes)", len(f.Request))
		}
		if f, _ := s.GetFuture(ctx, "f2"); f.State != FutureComplete || string(f.Result) != `{"new":1}` || f.Owner != "g2" {
			t.Fatalf("f2: %+v", f)
		}
		// Terminal: finishing again reports false without an error, and adopting it fails.
		if ok, err := s.FinishFutureFenced(ctx, "f2", FutureFailed, nil, "server", Fence{"r", "g2", l2.Epoch}); ok || err != nil {
			t.Fatalf("finishing twice: %v %v", ok, err)
		}
		if ok, _ := s.AdoptFuture(ctx, "f2", "g3"); ok {
			t.Fatal("adopted a terminal future")
		}
		if runs, _ := s.OrphanedRuns(ctx, 10); len(runs) != 0 {
			t.Fatalf("orphaned after all finished: %v", runs)
		}
		if _, err := s.GetRun(ctx, "r"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("GetRun of a missing run: %v", err)
		}
		// The run's row: written (created) under any fence while it has none, then only by the
		// holder at its epoch.
		run := Run{ID: "r", Tenant: "t", SessionID: "s", BaseModel: "m", Created: time.Now(), LastRequest: time.Now(), Live: true, Data: []byte(`{"step":1}`)}
		if err := s.PutRunFenced(ctx, run, Fence{"r", "g1", l1.Epoch}); err != nil {
			t.Fatalf("creating a run's row: %v", err)
		}
		run.Data = []byte(`{"step":2}`)
		if err := s.PutRunFenced(ctx, run, Fence{"r", "g2", l2.Epoch}); err != nil {
			t.Fatalf("the holder's write: %v", err)
		}
		run.Data = []byte(`{"step":1}`)
		if err := s.PutRunFenced(ctx, run, Fence{"r", "g1", l1.Epoch}); !errors.Is(err, ErrFenced) {
			t.Fatalf("a stale epoch's row write: %v", err)
		}
		if got, err := s.GetRun(ctx, "r"); err != nil || string(got.Data) != `{"step":2}` {
			t.Fatalf("run row %s %v, want the holder's", got.Data, err)
		}
	})
}

// GetSession reads one session's row, heartbeat included; a missing one is ErrNotFound.
func TestGetSession(t *testing.T) {
	forEachStore(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		now := time.Now().UTC().Truncate(time.Millisecond)
		if err := s.PutSession(ctx, Session{ID: "s1", Tenant: "a", Created: now, Heartbeat: now, Data: []byte(`{"runs":["r"]}`)}); err != nil {
			t.Fatal(err)
		}
		if err := s.TouchSession(ctx, "s1", now.Add(time.Minute)); err != nil {
			t.Fatal(err)
		}
		got, err := s.GetSession(ctx, "s1")
		if err != nil || got.Tenant != "a" || !got.Heartbeat.Equal(now.Add(time.Minute)) || got.Closed || string(got.Data) != `{"runs":["r"]}` {
			t.Fatalf("session %+v %v", got, err)
		}
		if _, err := s.GetSession(ctx, "nope"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("missing session: %v", err)
		}
	})
}

// SessionMembers finds a session's runs and samplers by their rows, not by the session's own
// list (which another gateway may have written without them), and no other session's.
func TestSessionMembers(t *testing.T) {
	forEachStore(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		now := time.Now().UTC().Truncate(time.Millisecond)
		if err := s.PutSession(ctx, Session{ID: "s1", Tenant: "a", Created: now, Heartbeat: now, Data: []byte(`{"runs":["r2"]}`)}); err != nil {
			t.Fatal(err)
		}
		for i, r := range []Run{{ID: "r2", SessionID: "s1"}, {ID: "r1", SessionID: "s1"}, {ID: "r3", SessionID: "s2"}} {
			r.Tenant, r.BaseModel, r.Created, r.LastRequest = "a", "m", now.Add(time.Duration(i)*time.Second), now
			if err := s.PutRun(ctx, r); err != nil {
				t.Fatal(err)
			}
		}
		for _, x := range []Sampler{{ID: "p2", SessionID: "s1"}, {ID: "p1", SessionID: "s1"}, {ID: "p3", SessionID: "s2"}} {
			x.Tenant = "a"
			if err := s.PutSampler(ctx, x); err != nil {
				t.Fatal(err)
			}
		}
		runs, samplers, err := s.SessionMembers(ctx, "s1")
		if err != nil || !slices.Equal(runs, []string{"r2", "r1"}) || !slices.Equal(samplers, []string{"p1", "p2"}) {
			t.Fatalf("members of s1: runs %v samplers %v, %v", runs, samplers, err)
		}
		if runs, samplers, err := s.SessionMembers(ctx, "nope"); err != nil || len(runs)+len(samplers) != 0 {
			t.Fatalf("members of a missing session: %v %v %v", runs, samplers, err)
		}
	})
}

// Gateways asking for one cluster secret at once all get the same one, the first stored; a
// second name is its own secret; an empty candidate is refused and stores nothing.
func TestClusterSecretHasOneValue(t *testing.T) {
	forEachStore(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		got := make([][]byte, 8)
		var wg sync.WaitGroup
		for i := range got {
			wg.Go(func() {
				v, err := s.ClusterSecret(ctx, "worker-token", []byte{byte('a' + i), 1, 2})
				if err != nil {
					t.Error(err)
				}
				got[i] = v
			})
		}
		wg.Wait()
		for i, v := range got {
			if len(v) != 3 || v[1] != 1 || !bytes.Equal(v, got[0]) {
				t.Fatalf("asker %d got %v, asker 0 %v: want one stored candidate for all", i, v, got[0])
			}
		}
		again, err := s.ClusterSecret(ctx, "worker-token", []byte("later"))
		if err != nil || !bytes.Equal(again, got[0]) {
			t.Fatalf("a later ask got %q (%v), want the first %q", again, err, got[0])
		}
		other, err := s.ClusterSecret(ctx, "archive", []byte("sign"))
		if err != nil || string(other) != "sign" {
			t.Fatalf("another name got %q (%v), want its own candidate", other, err)
		}
		if _, err := s.ClusterSecret(ctx, "empty", nil); err == nil {
			t.Fatal("an empty secret was stored")
		}
		if v, err := s.ClusterSecret(ctx, "empty", []byte("x")); err != nil || string(v) != "x" {
			t.Fatalf("after a refused empty one: %q (%v)", v, err)
		}
	})
}

// GetCheckpoint reads one checkpoint's row as Checkpoints lists it, GetSampler one sampler's; a
// missing or deleted one is ErrNotFound.
func TestGetCheckpoint(t *testing.T) {
	forEachStore(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		now := time.Now().UTC().Truncate(time.Millisecond)
		exp := now.Add(time.Hour)
		c := Checkpoint{Path: "tinker://r/weights/a", Owner: "t", ModelID: "r", Created: now, ExpiresAt: &exp, Public: true, Data: []byte(`{"x":1}`)}
		if err := s.PutCheckpoint(ctx, c); err != nil {
			t.Fatal(err)
		}
		if err := s.PutCheckpoint(ctx, Checkpoint{Path: "tinker://r/weights/b", Owner: "t", ModelID: "r", Created: now, Data: []byte(`{}`)}); err != nil {
			t.Fatal(err)
		}
		got, err := s.GetCheckpoint(ctx, c.Path)
		if err != nil || got.Owner != "t" || got.ModelID != "r" || !got.Created.Equal(now) || got.ExpiresAt == nil ||
			!got.ExpiresAt.Equal(exp) || !got.Public || string(got.Data) != `{"x":1}` {
			t.Fatalf("checkpoint %+v %v", got, err)
		}
		if b, err := s.GetCheckpoint(ctx, "tinker://r/weights/b"); err != nil || b.ExpiresAt != nil || b.Public {
			t.Fatalf("second checkpoint %+v %v", b, err)
		}
		if err := s.PutSampler(ctx, Sampler{ID: "samp-1", Tenant: "t", SessionID: "s", Data: []byte(`{"y":2}`)}); err != nil {
			t.Fatal(err)
		}
		if x, err := s.GetSampler(ctx, "samp-1"); err != nil || x.Tenant != "t" || x.SessionID != "s" || string(x.Data) != `{"y":2}` {
			t.Fatalf("sampler %+v %v", x, err)
		}
		if _, err := s.GetSampler(ctx, "samp-2"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("missing sampler: %v", err)
		}
		if err := s.DeleteCheckpoint(ctx, c.Path); err != nil {
			t.Fatal(err)
		}
		if _, err := s.GetCheckpoint(ctx, c.Path); !errors.Is(err, ErrNotFound) {
			t.Fatalf("deleted checkpoint: %v", err)
		}
	})
}

// A tenant's listings read its own rows and the published ones, no other tenant's.
func TestListingsOfOneTenant(t *testing.T) {
	forEachStore(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		now := time.Now().UTC().Truncate(time.Millisecond)
		for i, tenant := range []string{"a", "b", "b"} {
			id := fmt.Sprint("r", i)
			if err := s.PutSession(ctx, Session{ID: "s" + id, Tenant: tenant, Created: now.Add(time.Duration(i) * time.Second), Heartbeat: now}); err != nil {
				t.Fatal(err)
			}
			if err := s.PutRun(ctx, Run{ID: id, Tenant: tenant, SessionID: "s" + id, BaseModel: "m", Created: now.Add(time.Duration(i) * time.Second), Data: []byte(`{}`)}); err != nil {
				t.Fatal(err)
			}
			if err := s.PutCheckpoint(ctx, Checkpoint{Path: "tinker://" + id + "/weights/x", Owner: tenant, ModelID: id, Created: now, Public: i == 2, Data: []byte(`{}`)}); err != nil {
				t.Fatal(err)
			}
		}
		ids := func(f func() ([]string, error)) []string {
			got, err := f()
			if err != nil {
				t.Fatal(err)
			}
			return got
		}
		sessions := ids(func() ([]string, error) {
			xs, err := s.SessionsOf(ctx, "b")
			var out []string
			for _, x := range xs {
				out = append(out, x.ID)
			}
			return out, err
		})
		runs := ids(func() ([]string, error) {
			xs, err := s.RunsVisibleTo(ctx, "a")
			var out []string
			for _, x := range xs {
				out = append(out, x.ID)
			}
			return out, err
		})
		ckpts := ids(func() ([]string, error) {
			xs, err := s.CheckpointsVisibleTo(ctx, "a")
			var out []string
			for _, x := range xs {
				out = append(out, x.Path)
			}
			return out, err
		})
		if !slices.Equal(sessions, []string{"sr1", "sr2"}) || !slices.Equal(runs, []string{"r0", "r2"}) ||
			!slices.Equal(ckpts, []string{"tinker://r0/weights/x", "tinker://r2/weights/x"}) {
			t.Fatalf("b's sessions %v, what a sees: runs %v, checkpoints %v", sessions, runs, ckpts)
		}
	})
}
