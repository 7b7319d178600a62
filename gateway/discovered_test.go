package gateway_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/skein-ai/skein/discovery"
	"github.com/skein-ai/skein/engine"
	"github.com/skein-ai/skein/gateway"
	"github.com/skein-ai/skein/worker"
)

// pushSource is a discovery source the test drives: each event it is sent is notified in order.
type pushSource struct{ events chan func(discovery.Notifier) }

func (p *pushSource) Start(ctx context.Context, n discovery.Notifier) error {
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case ev := <-p.events:
			ev(n)
		}
	}
}

func (p *pushSource) upsert(id, url string, ready bool) {
	p.events <- func(n discovery.Notifier) { n.Upsert(discovery.Endpoint{ID: id, URL: url, Ready: ready}) }
}
func (p *pushSource) delete(id string) { p.events <- func(n discovery.Notifier) { n.Delete(id) } }

// newDiscoveredWorker is a worker that does not register: it answers describe with its identity.
func newDiscoveredWorker(t *testing.T, e *engine.Engine, dataDir string) (*httptest.Server, *worker.Server) {
	ws := worker.NewServer(e.Fork(), clusterToken, dataDir)
	ws.SetIdentity(base, 4)
	ts := httptest.NewServer(ws)
	t.Cleanup(ts.Close)
	return ts, ws
}

// replicaIDs lists the gateway's replicas (the admin API; open mode answers any key).
func replicaIDs(t *testing.T, url string) string {
	t.Helper()
	req, _ := http.NewRequest("GET", url+"/api/v1/skein/replicas", nil)
	req.Header.Set("X-API-Key", "tml-admin")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func waitUntil(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Discovered workers join (described over the authenticated worker API), take work, are drained
// while not ready (their adapters move, nothing new lands there) and removed when the source
// deletes them; a worker that stops answering is dropped by the liveness check although the
// source still lists it, and joins again when it answers.
func TestDiscoveredWorkersJoinDrainAndLeave(t *testing.T) {
	e, err := engine.Load(modelDir(), engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	data := t.TempDir()
	src := &pushSource{events: make(chan func(discovery.Notifier))}
	gw, err := gateway.New(gateway.Options{DataDir: data, WorkerToken: clusterToken, WorkerTimeout: 1500 * time.Millisecond, Discovery: src})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(gw)
	t.Cleanup(func() { ts.Close(); gw.Close() })
	wa, _ := newDiscoveredWorker(t, e, data)
	wb, wbServer := newDiscoveredWorker(t, e, data)
	idA, idB := worker.ID(base, "pod-a"), worker.ID(base, "pod-b")

	src.upsert("pod-a", wa.URL, true)
	waitUntil(t, "pod-a to join", func() bool { return strings.Contains(replicaIDs(t, ts.URL), idA) })
	_, tc := newRun(t, ts.URL, "tml-disc", 4)
	if s, err := step(t, tc); err != nil || s != 1 {
		t.Fatalf("first step on the discovered worker: %v %v", s, err)
	}
	src.upsert("pod-b", wb.URL, true)
	waitUntil(t, "pod-b to join", func() bool { return strings.Contains(replicaIDs(t, ts.URL), idB) })

	// pod-a fails its readiness probe while the run holds gradients no optim_step consumed: the
	// drain saves the adapter in full and moves it, so the step on pod-b applies them (it would
	// report them lost had the adapter reloaded from its last step), and pod-a stays a member.
	mustForwardBackward(t, tc, false)
	src.upsert("pod-a", wa.URL, false)
	waitUntil(t, "pod-a to be drained of its adapter", func() bool {
		body := replicaIDs(t, ts.URL)
		return strings.Contains(body, `"healthy":false`) && !strings.Contains(body, tc.ModelID)
	})
	if m, err := optimStep(t, tc); err != nil || m["step:max"] != 2 {
		t.Fatalf("step after pod-a drained: %v %v", m, err)
	}
	if !strings.Contains(replicaIDs(t, ts.URL), idA) {
		t.Fatal("a draining worker was removed; it should stay until the source deletes it")
	}

	// pod-b's own drain (SIGTERM) is seen through its status even while the source says ready.
	// (pod-a's readiness is applied asynchronously: wait for it before draining pod-b, or the
	// new run could find no healthy replica at all.)
	src.upsert("pod-a", wa.URL, true)
	waitUntil(t, "pod-a to be ready again", func() bool {
		return !strings.Contains(replicaIDs(t, ts.URL), `"healthy":false`)
	})
	wbServer.Drain()
	waitUntil(t, "pod-b's drain to show", func() bool {
		body := replicaIDs(t, ts.URL)
		return strings.Count(body, `"healthy":false`) == 1 && strings.Contains(body, `"draining":true`)
	})
	_, tc2 := newRun(t, ts.URL, "tml-disc2", 4)
	if s, err := step(t, tc2); err != nil || s != 1 {
		t.Fatalf("a new run while pod-b drains: %v %v", s, err)
	}

	src.delete("pod-b")
	waitUntil(t, "pod-b to leave", func() bool { return !strings.Contains(replicaIDs(t, ts.URL), idB) })

	// pod-a dies without the source noticing: the liveness check drops it.
	wa.Close()
	waitUntil(t, "the dead pod-a to be dropped", func() bool { return !strings.Contains(replicaIDs(t, ts.URL), idA) })
}
