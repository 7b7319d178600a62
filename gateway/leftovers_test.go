package gateway

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/skein-ai/skein/store"
)

// writeDir makes a directory with one file, last modified at mod.
func writeDir(t *testing.T, dir string, mod time.Time) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "adapter_model.safetensors"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(dir, mod, mod); err != nil {
		t.Fatal(err)
	}
}

func exists(path string) bool { _, err := os.Stat(path); return err == nil }

// Temporary directories a crash left behind (a save's .partial-*, a replaced state's .old-*) are
// removed when the server starts; recent ones (a save in progress elsewhere) are kept.
func TestStaleTempDirsAreRemovedAtStart(t *testing.T) {
	data := t.TempDir()
	long := time.Now().Add(-3 * time.Hour)
	stale := []string{filepath.Join(data, "state", "sess-1_train_0.partial-ab12"),
		filepath.Join(data, "state", "sess-1_train_0.old-cd34"),
		filepath.Join(data, "checkpoints", "sess-1_train_0", "weights", "w1.partial-ef56")}
	for _, d := range stale {
		writeDir(t, d, long)
	}
	fresh := filepath.Join(data, "checkpoints", "sess-1_train_0", "weights", "w2.partial-0000")
	writeDir(t, fresh, time.Now())
	kept := filepath.Join(data, "state", "sess-1_train_0")
	writeDir(t, kept, long)
	// The store knows the run (a server refuses to start over saved state its store forgot).
	st, err := store.OpenSQLite(filepath.Join(data, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.PutRun(context.Background(), store.Run{ID: "sess-1:train:0", Tenant: "t-x", SessionID: "sess-1",
		BaseModel: "m", Created: long, LastRequest: long}); err != nil {
		t.Fatal(err)
	}
	st.Close()
	s, err := New(Options{DataDir: data})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	deadline := time.Now().Add(20 * time.Second)
	for _, d := range stale {
		for exists(d) {
			if time.Now().After(deadline) {
				t.Fatalf("%s is still there after the start", d)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	if !exists(fresh) || !exists(kept) {
		t.Fatalf("the sweep removed a recent temporary directory (%v) or a real state (%v)", exists(fresh), exists(kept))
	}
}

// Sessions closed longer than the retention are forgotten, in memory and in the store, with
// their dead runs' saved state; a dead run with checkpoints stays listed; ephemeral sampler
// weights whose sampler is gone are removed. Sessions closed recently stay.
func TestClosedSessionsAndTheirLeftoversAreSwept(t *testing.T) {
	data := t.TempDir()
	s, err := New(Options{DataDir: data, SessionTimeout: time.Hour, SessionRetention: 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ts := httptest.NewServer(s)
	defer ts.Close()
	newSession := func() string {
		req, _ := http.NewRequest("POST", ts.URL+"/api/v1/create_session", strings.NewReader(`{}`))
		req.Header.Set("X-API-Key", "tml-sweep")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out struct {
			SessionID string `json:"session_id"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || out.SessionID == "" {
			t.Fatalf("create_session: %v", err)
		}
		return out.SessionID
	}
	oldSess, recentSess := newSession(), newSession()
	now := time.Now()
	ctx0 := context.Background()
	// Two dead runs of the old session (one with a checkpoint), one of the recent session.
	s.sessions.mu.Lock()
	s.runs.mu.Lock()
	tenant := s.sessions.m[oldSess].tenant
	for _, id := range []string{oldSess + ":train:0", oldSess + ":train:1", recentSess + ":train:0"} {
		sess := strings.Split(id, ":")[0]
		run := &trainingRun{id: id, tenant: tenant, session: sess, created: now, lastRequest: now, queue: newRunQueue(1)}
		s.runs.m[id] = run
		s.sessions.m[sess].runs = append(s.sessions.m[sess].runs, id)
		if err := s.runSnapshot(run).store(); err != nil {
			t.Fatal(err)
		}
		if _, err := s.writeSavedState(ctx0, id, "", gradientsRecord{}, func(dir string) error { return os.MkdirAll(dir, 0o755) }); err != nil {
			t.Fatal(err)
		}
	}
	s.runs.mu.Unlock()
	s.sessions.mu.Unlock()
	ctx := context.Background()
	if err := s.st.PutCheckpoint(ctx, store.Checkpoint{Path: "tinker://" + oldSess + ":train:1/weights/w", Owner: tenant,
		ModelID: oldSess + ":train:1", Created: now}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{oldSess + ":train:0", oldSess + ":train:1"} {
		if err := s.st.AddStepMetric(ctx, store.StepMetric{RunID: id, Step: 1, At: now, Data: []byte(`{}`)}, 10); err != nil {
			t.Fatal(err)
		}
	}
	writeDir(t, filepath.Join(data, "ephemeral", "samp-gone"), now.Add(-2*time.Hour))
	writeDir(t, filepath.Join(data, "ephemeral", "samp-live"), now.Add(-2*time.Hour))
	s.logErr("sampler", s.st.PutSampler(ctx, store.Sampler{ID: "samp-live", Tenant: tenant, SessionID: recentSess}))

	// The old session expires two days ago, the recent one an hour ago.
	s.sessions.mu.Lock()
	s.sessions.m[oldSess].heartbeat = now.Add(-49 * time.Hour)
	s.sessions.m[recentSess].heartbeat = now.Add(-2 * time.Hour)
	s.sessions.mu.Unlock()
	s.sweepSessions(now)
	s.sweepLeftovers(now)

	rows, err := s.st.Sessions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, r := range rows {
		left = append(left, r.ID)
	}
	if len(left) != 1 || left[0] != recentSess {
		t.Fatalf("sessions in the store after the sweep: %v, want only %s", left, recentSess)
	}
	runs, err := s.st.Runs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	stored := map[string]bool{}
	for _, r := range runs {
		stored[r.ID] = true
	}
	stateDir := func(id string) string { d, _ := s.savedState(id); return d } // "" when none
	s.runs.mu.Lock()
	_, inMemory := s.runs.m[oldSess+":train:0"]
	_, withCkpt := s.runs.m[oldSess+":train:1"]
	s.runs.mu.Unlock()
	if inMemory || stored[oldSess+":train:0"] || exists(stateDir(oldSess+":train:0")) {
		t.Fatalf("the old session's dead run is still there (memory %v, store %v)", inMemory, stored[oldSess+":train:0"])
	}
	if steps, err := s.st.StepMetrics(ctx, oldSess+":train:0", 0, 10); err != nil || len(steps) != 0 {
		t.Fatalf("the swept run's step metrics are still there: %d %v", len(steps), err)
	}
	if steps, err := s.st.StepMetrics(ctx, oldSess+":train:1", 0, 10); err != nil || len(steps) != 1 {
		t.Fatalf("the listed run's step metrics: %d %v", len(steps), err)
	}
	if !withCkpt || !stored[oldSess+":train:1"] || exists(stateDir(oldSess+":train:1")) {
		t.Fatalf("the dead run with a checkpoint: want it listed without its saved state (memory %v, store %v)", withCkpt, stored[oldSess+":train:1"])
	}
	if !stored[recentSess+":train:0"] || !exists(stateDir(recentSess+":train:0")) {
		t.Fatal("the recently closed session's run was swept")
	}
	if exists(filepath.Join(data, "ephemeral", "samp-gone")) || !exists(filepath.Join(data, "ephemeral", "samp-live")) {
		t.Fatal("ephemeral sampler weights: want the gone one removed and the live one kept")
	}
}
