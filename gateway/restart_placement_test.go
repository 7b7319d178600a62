package gateway_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/skein-ai/skein/client"
	"github.com/skein-ai/skein/engine"
	"github.com/skein-ai/skein/gateway"
)

// calls counts a worker's calls of each method, to compare before and after.
func calls(w *testWorker, methods ...string) map[string]int {
	out := map[string]int{}
	for _, m := range methods {
		out[m] = w.count(m)
	}
	return out
}

// servedBy runs one step of tc and reports which of the workers ran its forward_backward.
func servedBy(t *testing.T, tc *client.TrainingClient, ws map[string]*testWorker) (string, float64) {
	t.Helper()
	before := map[string]int{}
	for name, w := range ws {
		before[name] = w.count("forward_backward")
	}
	s, err := step(t, tc)
	if err != nil {
		t.Fatal(err)
	}
	who := ""
	for name, w := range ws {
		if w.count("forward_backward") > before[name] {
			if who != "" {
				t.Fatalf("one step's forward_backward ran on %s and %s", who, name)
			}
			who = name
		}
	}
	return who, s
}

// A gateway restart keeps placements: over the same store and the same workers (which register
// again, as their heartbeat's 404 makes them), each adapter's next op goes to the worker that
// held it, without a load; an adapter holding gradients no optim_step consumed is not adopted
// (they would be lost or doubled unseen) and reloads from its saved state, which says so.
func TestAGatewayRestartKeepsPlacements(t *testing.T) {
	e, err := engine.Load(modelDir(), engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	data := t.TempDir()
	start := func() (*httptest.Server, *gateway.Server) {
		gw, err := gateway.New(gateway.Options{DataDir: data, AcceptWorkers: true, WorkerToken: clusterToken, WorkerTimeout: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		return httptest.NewServer(gw), gw
	}
	ts, gw := start()
	a, b := newTestWorker(t, e, data), newTestWorker(t, e, data)
	ws := map[string]*testWorker{"a": a, "b": b}
	register := func(url string) {
		for name, w := range ws {
			if code, ans := postWorker(t, url, "register", clusterToken, registration(name, w.URL, e)); code != http.StatusOK {
				t.Fatalf("register %s: %d %v", name, code, ans)
			}
		}
	}
	register(ts.URL)
	c1, run1 := newRun(t, ts.URL, "tml-keep1", 4)
	c2, run2 := newRun(t, ts.URL, "tml-keep2", 4)
	c3, run3 := newRun(t, ts.URL, "tml-keep3", 4)
	where1, s := servedBy(t, run1, ws)
	if s != 1 {
		t.Fatalf("run1 step %v", s)
	}
	where2, _ := servedBy(t, run2, ws)
	if where1 == where2 {
		t.Fatalf("both runs on %s: the held scorer spreads two adapters over two empty workers", where1)
	}
	// run3 steps once, then accumulates gradients that no optim_step consumes before the restart.
	if _, err := step(t, run3); err != nil {
		t.Fatal(err)
	}
	mustForwardBackward(t, run3, false)

	ts.Close()
	gw.Close()
	loadsBefore := a.count("load") + b.count("load")
	createsBefore := a.count("create") + b.count("create")
	ts2, gw2 := start()
	t.Cleanup(func() { ts2.Close(); gw2.Close() })
	for _, c := range []*client.Client{c1, c2, c3} {
		c.BaseURL = ts2.URL
	}
	register(ts2.URL)

	again1, s := servedBy(t, run1, ws)
	if again1 != where1 || s != 2 {
		t.Fatalf("after the restart run1 stepped to %v on %s; it was on %s", s, again1, where1)
	}
	again2, _ := servedBy(t, run2, ws)
	if again2 != where2 {
		t.Fatalf("after the restart run2 ran on %s; it was on %s", again2, where2)
	}
	if got := a.count("load") + b.count("load") - loadsBefore; got != 0 {
		t.Fatalf("%d loads after the restart: the adopted adapters were reloaded", got)
	}
	if got := a.count("create") + b.count("create") - createsBefore; got != 0 {
		t.Fatalf("%d creates after the restart", got)
	}
	// run3 was dropped at registration and reloads from its last step's state: its acknowledged
	// gradients are reported lost, as after any restart that lost them.
	_, err = optimStep(t, run3)
	if err == nil || !strings.Contains(err.Error(), "were lost") {
		t.Fatalf("run3's step after the restart: %v, want the lost-gradients error", err)
	}
	if got := a.count("load") + b.count("load") - loadsBefore; got != 1 {
		t.Fatalf("%d loads after run3's step, want 1 (run3 reloaded, the others not)", got)
	}
}
