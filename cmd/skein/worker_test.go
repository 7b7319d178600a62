package main

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/client"
	"github.com/skein-ai/skein/engine"
	"github.com/skein-ai/skein/store"
)

type replicaRow struct {
	ID       string `json:"id"`
	Healthy  bool   `json:"healthy"`
	Held     int    `json:"adapters_held"`
	Reported *struct {
		Adapters  int `json:"adapters"`
		FreeSlots int `json:"free_slots"`
	} `json:"worker_reported"`
}

func waitReplicas(t *testing.T, c *client.Client, want int) []replicaRow {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var out struct {
		Replicas []replicaRow `json:"replicas"`
	}
	for time.Now().Before(deadline) {
		if err := c.Do(context.Background(), "GET", "skein/replicas", nil, &out); err == nil && len(out.Replicas) == want {
			return out.Replicas
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("never saw %d replicas (last %+v)", want, out.Replicas)
	return nil
}

// A gateway with two `skein worker` processes: kill the worker that holds an adapter with SIGKILL
// mid-run; after three missed heartbeats it is dropped and the run finishes on the other worker,
// from its last acknowledged step.
func TestKilledWorkerRunFinishesOnAnother(t *testing.T) {
	root := t.TempDir()
	modelDir := filepath.Join(root, "tiny-qwen3")
	if err := engine.InitTiny(modelDir, engine.ArchQwen3, "tiny", 1); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	gwURL := "http://" + addr
	data := filepath.Join(root, "data")
	startSkein(t, root, "gateway", "--data", data, "--addr", addr, "--worker-token", "s3cret")
	c := client.New(gwURL, "tml-workers")
	waitHealthy(t, addr)
	w1 := startSkein(t, root, "worker", "--gateway", gwURL, "--model", modelDir, "--max-loras", "4", "--worker-token", "s3cret", "--data", data)
	first := waitReplicas(t, c, 1)[0].ID

	ctx := context.Background()
	sess, err := c.CreateSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tc, err := c.CreateLoraTrainingClient(ctx, sess, 0, "tiny-qwen3", 4)
	if err != nil {
		t.Fatal(err)
	}
	batch := []api.Datum{datum([]int{10, 20, 30, 40, 50, 60, 70})}
	step := func() float64 { return trainStep(t, ctx, tc, batch) }
	step()
	step()
	// The worker's own heartbeat agrees with the router: one adapter held, three slots free.
	deadline := time.Now().Add(10 * time.Second)
	for {
		rows := waitReplicas(t, c, 1)
		if r := rows[0].Reported; r != nil && r.Adapters == 1 && r.FreeSlots == 3 && rows[0].Held == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("worker report %+v", rows[0])
		}
		time.Sleep(100 * time.Millisecond)
	}

	startSkein(t, root, "worker", "--gateway", gwURL, "--model", modelDir, "--max-loras", "4", "--worker-token", "s3cret", "--data", data)
	waitReplicas(t, c, 2)
	if err := w1.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_, _ = w1.Process.Wait()
	left := waitReplicas(t, c, 1)
	if left[0].ID == first {
		t.Fatal("the killed worker is still listed")
	}
	if s := step(); s != 3 {
		t.Fatalf("step after failover %v, want 3: the acknowledged steps must survive the worker", s)
	}
	// The result names the worker that ran it.
	f, _ := tc.ForwardBackward(ctx, batch, "cross_entropy", nil, true)
	if err := f.Result(ctx, &api.ForwardBackwardOutput{}); err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest("POST", gwURL+"/api/v1/retrieve_future", strings.NewReader(`{"request_id":"`+f.RequestID+`"}`))
	req.Header.Set("X-API-Key", "tml-workers")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := resp.Header.Get("X-Skein-Replica"); got != left[0].ID {
		t.Fatalf("X-Skein-Replica %q, want %q", got, left[0].ID)
	}
	// Without the token a worker cannot register.
	r2, _ := http.Post(gwURL+"/api/v1/skein/workers/register", "application/json", strings.NewReader(`{}`))
	if r2.StatusCode != http.StatusUnauthorized {
		t.Fatalf("registration without token: %d", r2.StatusCode)
	}
	r2.Body.Close()
}

// A gateway given no cluster token generates one into its data directory, readable by its owner
// only, and prints it once; a worker that shares the data directory finds it there, and a
// registration without it is refused.
func TestGatewayGeneratesItsClusterToken(t *testing.T) {
	root := t.TempDir()
	modelDir := filepath.Join(root, "tiny-qwen3")
	if err := engine.InitTiny(modelDir, engine.ArchQwen3, "tiny", 1); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	data := filepath.Join(root, "data")
	startSkein(t, root, "gateway", "--data", data, "--addr", addr)
	waitHealthy(t, addr)
	info, err := os.Stat(filepath.Join(data, tokenFile))
	if err != nil {
		t.Fatalf("no generated cluster token: %v", err)
	}
	if info.Mode().Perm() != 0o600 {
		t.Fatalf("cluster token file mode %v, want 0600", info.Mode().Perm())
	}
	r, err := http.Post("http://"+addr+"/api/v1/skein/workers/register", "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	if r.StatusCode != http.StatusUnauthorized {
		t.Fatalf("registration without the token: %d", r.StatusCode)
	}
	startSkein(t, root, "worker", "--gateway", "http://"+addr, "--model", modelDir, "--data", data)
	waitReplicas(t, client.New("http://"+addr, "tml-token"), 1)
}

// A worker refuses to start without a cluster token (before loading anything).
func TestWorkerNeedsAClusterToken(t *testing.T) {
	t.Setenv("SKEIN_WORKER_TOKEN", "")
	err := run([]string{"worker", "--gateway", "http://127.0.0.1:1", "--model", filepath.Join(t.TempDir(), "none"), "--data", t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "cluster token") {
		t.Fatalf("worker without a token: %v", err)
	}
}

// A worker refuses a --kv-cache-mb outside [0, engine.MaxKVCacheMB] before loading anything.
func TestWorkerChecksItsKVCacheBound(t *testing.T) {
	for _, mb := range []string{"-1", "2097152"} {
		err := run([]string{"worker", "--gateway", "http://127.0.0.1:1", "--worker-token", "t", "--model", filepath.Join(t.TempDir(), "none"), "--data", t.TempDir(), "--kv-cache-mb", mb})
		if err == nil || !strings.Contains(err.Error(), "--kv-cache-mb "+mb) {
			t.Fatalf("worker with --kv-cache-mb %s: %v", mb, err)
		}
	}
}

// The cluster token is generated once and kept; a given one wins; a token file readable by
// others is refused.
func TestClusterTokenIsKept(t *testing.T) {
	dir := t.TempDir()
	var printed strings.Builder
	a, err := settleWorkerToken(true, dir, "", "127.0.0.1:8000", nil, &printed)
	if err != nil || len(a) < 32 || !strings.Contains(printed.String(), "--worker-token "+a) {
		t.Fatalf("first start: %q %v, printed %q", a, err, printed.String())
	}
	printed.Reset()
	b, err := settleWorkerToken(true, dir, "", "127.0.0.1:8000", nil, &printed)
	if err != nil || b != a || printed.Len() != 0 {
		t.Fatalf("second start: %q (first %q) %v, printed %q", b, a, err, printed.String())
	}
	if c, _ := settleWorkerToken(true, dir, "given", "x", nil, io.Discard); c != "given" {
		t.Fatalf("a given token: %q", c)
	}
	printed.Reset()
	if d, _ := settleWorkerToken(false, dir, "given", "x", nil, &printed); d != "" || !strings.Contains(printed.String(), "--accept-workers") {
		t.Fatalf("a server accepting no workers has token %q (printed %q)", d, printed.String())
	}
	if err := os.Chmod(filepath.Join(dir, tokenFile), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := settleWorkerToken(true, dir, "", "x", nil, io.Discard); err == nil {
		t.Fatal("a world-readable token file was used")
	}
}

// Gateways on one shared store, each with a data directory of its own, settle on one cluster
// token: the first one's, printed by it alone. A data directory that already held a token
// offers it (an upgraded gateway's workers keep theirs); a given token still wins.
func TestClusterTokenIsSharedThroughTheStore(t *testing.T) {
	st, err := store.OpenSQLite(filepath.Join(t.TempDir(), "shared.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var printed strings.Builder
	a, err := settleWorkerToken(true, t.TempDir(), "", "gw-a:8000", st, &printed)
	if err != nil || len(a) < 32 || !strings.Contains(printed.String(), "--worker-token "+a) || !strings.Contains(printed.String(), "shared store") {
		t.Fatalf("first gateway: %q %v, printed %q", a, err, printed.String())
	}
	printed.Reset()
	b, err := settleWorkerToken(true, t.TempDir(), "", "gw-b:8000", st, &printed)
	if err != nil || b != a || printed.Len() != 0 {
		t.Fatalf("second gateway: %q (first %q) %v, printed %q", b, a, err, printed.String())
	}
	if c, _ := settleWorkerToken(true, t.TempDir(), "given", "x", st, io.Discard); c != "given" {
		t.Fatalf("a given token: %q", c)
	}
	// An upgraded gateway whose data directory kept a token, first on a new store.
	old := t.TempDir()
	kept, _, err := clusterToken(old, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	fresh, err := store.OpenSQLite(filepath.Join(t.TempDir(), "fresh.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	printed.Reset()
	if d, err := settleWorkerToken(true, old, "", "x", fresh, &printed); err != nil || d != kept || printed.Len() != 0 {
		t.Fatalf("the kept token %q, got %q (%v), printed %q", kept, d, err, printed.String())
	}
	if e, err := settleWorkerToken(true, t.TempDir(), "", "x", fresh, io.Discard); err != nil || e != kept {
		t.Fatalf("the next gateway got %q (%v), want the kept %q", e, err, kept)
	}
}
