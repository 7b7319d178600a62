package gateway_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/client"
	"github.com/skein-ai/skein/engine"
	"github.com/skein-ai/skein/gateway"
	"github.com/skein-ai/skein/replica"
)

// newCluster serves the tiny model from n in-process replicas (one shared copy of the weights).
func newCluster(t testing.TB, n, maxLoras int) (*testServer, []*replica.Replica) {
	return newClusterWith(t, n, maxLoras, gateway.Options{})
}

func newClusterWith(t testing.TB, n, maxLoras int, opts gateway.Options) (*testServer, []*replica.Replica) {
	t.Helper()
	e, err := engine.Load(modelDir(), engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var reps []*replica.Replica
	for i := range n {
		eng := e
		if i > 0 {
			eng = e.Fork()
		}
		reps = append(reps, replica.New(fmt.Sprint("r", i), base, eng, maxLoras))
	}
	if opts.DataDir == "" {
		opts.DataDir = t.TempDir()
	}
	gw, err := gateway.New(opts, reps...)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(gw)
	t.Cleanup(func() {
		ts.Close()
		gw.Close()
		for _, r := range reps {
			r.Close()
		}
	})
	return &testServer{Server: ts, gw: gw, eng: e}, reps
}

// trainingAdapters counts a replica's resident training adapters (not sampler snapshots).
func trainingAdapters(r *replica.Replica) int {
	n := 0
	for _, id := range r.AdapterIDs(context.Background()) {
		if strings.Contains(id, ":train:") {
			n++
		}
	}
	return n
}

// 1000 concurrent create_model calls on 4 replicas of 8 slots: every one succeeds (older adapters
// are saved and evicted to make room) and no replica ever holds more than max_loras.
func TestConcurrentCreateModelsNeverExceedMaxLoras(t *testing.T) {
	ts, reps := newCluster(t, 4, 8)
	ctx := context.Background()
	var peak atomic.Int64
	stop := make(chan struct{})
	var watch sync.WaitGroup
	watch.Add(1)
	go func() { // watch residency while the calls run
		defer watch.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			for _, r := range reps {
				if n := int64(trainingAdapters(r)); n > peak.Load() {
					peak.Store(n)
				}
			}
		}
	}()
	var wg sync.WaitGroup
	var failed atomic.Int64
	for tenant := range 50 {
		c := client.New(ts.URL, fmt.Sprint("tml-tenant-", tenant))
		sess, err := c.CreateSession(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for k := range 20 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := c.CreateLoraTrainingClient(ctx, sess, k, base, 2); err != nil {
					failed.Add(1)
					t.Log(err)
				}
			}()
		}
	}
	wg.Wait()
	close(stop)
	watch.Wait()
	if failed.Load() != 0 {
		t.Fatalf("%d create_model calls failed", failed.Load())
	}
	if peak.Load() > 8 || peak.Load() == 0 {
		t.Fatalf("a replica held %d adapters (max_loras 8)", peak.Load())
	}
	var capResp map[string]map[string]int
	if err := client.New(ts.URL, "tml-admin").Do(ctx, "GET", "skein/capacity", nil, &capResp); err != nil {
		t.Fatal(err)
	}
	if c := capResp[base]; c["max_loras"] != 32 || c["used_loras"] != 32 || c["free_loras"] != 0 {
		t.Fatalf("capacity %+v", capResp)
	}
}

// An evicted adapter comes back transparently, with nothing lost: same weights, same step.
func TestEvictionAndReloadLoseNothing(t *testing.T) {
	ts, reps := newCluster(t, 1, 1)
	ctx := context.Background()
	c := client.New(ts.URL, "tml-evict")
	sess, _ := c.CreateSession(ctx)
	a, err := c.CreateLoraTrainingClient(ctx, sess, 0, base, 4)
	if err != nil {
		t.Fatal(err)
	}
	batch := []api.Datum{datum([]int{3, 14, 15, 92, 65, 35}, true)}
	step := func(tc *client.TrainingClient) float64 {
		fb, _ := tc.ForwardBackward(ctx, batch, "cross_entropy", nil, false)
		op, _ := tc.OptimStep(ctx, 1e-2)
		if err := fb.Result(ctx, &api.ForwardBackwardOutput{}); err != nil {
			t.Fatal(err)
		}
		var out struct {
			Metrics map[string]float64 `json:"metrics"`
		}
		if err := op.Result(ctx, &out); err != nil {
			t.Fatal(err)
		}
		return out.Metrics["step:max"]
	}
	forward := func(tc *client.TrainingClient) string {
		f, _ := tc.ForwardBackward(ctx, batch, "cross_entropy", nil, true)
		var out api.ForwardBackwardOutput
		if err := f.Result(ctx, &out); err != nil {
			t.Fatal(err)
		}
		return fmt.Sprint(out.LossFnOutputs[0]["logprobs"].Data)
	}
	step(a)
	step(a)
	before := forward(a)
	// B takes the only slot: A is saved and evicted.
	b, err := c.CreateLoraTrainingClient(ctx, sess, 1, base, 4)
	if err != nil {
		t.Fatal(err)
	}
	step(b)
	if ids := reps[0].AdapterIDs(context.Background()); len(ids) != 1 || ids[0] != b.ModelID {
		t.Fatalf("resident %v, want only %s", ids, b.ModelID)
	}
	if got := forward(a); got != before {
		t.Fatal("adapter A changed across its eviction")
	}
	if s := step(a); s != 3 {
		t.Fatalf("A's step after reload is %v, want 3", s)
	}
	// The replica that ran an op is named on the result.
	f, _ := a.ForwardBackward(ctx, batch, "cross_entropy", nil, true)
	if err := f.Result(ctx, &api.ForwardBackwardOutput{}); err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest("POST", ts.URL+"/api/v1/retrieve_future", strings.NewReader(`{"request_id":"`+f.RequestID+`"}`))
	req.Header.Set("X-API-Key", "tml-evict")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.Header.Get("X-Skein-Replica") != "r0" {
		t.Fatalf("X-Skein-Replica %q", resp.Header.Get("X-Skein-Replica"))
	}
	// Both evictions (A for B, then B for A) and the state saves show in the Prometheus metrics.
	mresp, err := http.Get(ts.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	mb, _ := io.ReadAll(mresp.Body)
	mresp.Body.Close()
	for _, want := range []string{"skein_evictions_total 2\n", `skein_futures_total{kind="OptimStep",outcome="ok"} 4`,
		`skein_lora_slots{replica="r0",base_model="tiny-qwen3",state="used"} 1`, `skein_http_requests_total{endpoint="/api/v1/optim_step",code="2xx"} 4`} {
		if !strings.Contains(string(mb), want) {
			t.Fatalf("metrics lack %q:\n%s", want, mb)
		}
	}
	if !strings.Contains(string(mb), "skein_adapter_persist_seconds_count ") {
		t.Fatal("no persist timing")
	}
	var reps2 struct {
		Replicas []map[string]any `json:"replicas"`
	}
	if err := c.Do(ctx, "GET", "skein/replicas", nil, &reps2); err != nil || len(reps2.Replicas) != 1 ||
		reps2.Replicas[0]["adapters_held"].(float64) != 1 || reps2.Replicas[0]["max_loras"].(float64) != 1 {
		t.Fatalf("replicas %v %+v", err, reps2)
	}
}

// A session that stops heartbeating expires within one sweep: its adapters are saved and released
// (their slots free) and its samplers closed; and a tenant's live adapters are limited.
func TestSessionExpiryAndTenantLimit(t *testing.T) {
	ts, reps := newClusterWith(t, 1, 4, gateway.Options{SessionTimeout: 300 * time.Millisecond, MaxAdaptersPerTenant: 2})
	rep := reps[0]
	ctx := context.Background()
	c := client.New(ts.URL, "tml-expiry")
	sess, _ := c.CreateSession(ctx)
	tc, err := c.CreateLoraTrainingClient(ctx, sess, 0, base, 2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateLoraTrainingClient(ctx, sess, 1, base, 2); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateLoraTrainingClient(ctx, sess, 2, base, 2); !isStatus(err, 400) {
		t.Fatalf("third adapter over the tenant limit of 2: %v", err)
	}
	sid, err := c.CreateSamplingSession(ctx, sess, base, "")
	if err != nil {
		t.Fatal(err)
	}
	// Keep a second session alive with heartbeats; let the first lapse.
	other, _ := c.CreateSession(ctx)
	// A generous bound: the sweep saves the adapters first, which takes long on a loaded machine.
	deadline := time.Now().Add(30 * time.Second)
	for trainingAdapters(rep) != 0 && time.Now().Before(deadline) {
		_ = c.Do(ctx, "POST", "session_heartbeat", map[string]string{"session_id": other}, nil)
		time.Sleep(50 * time.Millisecond)
	}
	if n := trainingAdapters(rep); n != 0 {
		t.Fatalf("%d adapters still resident after the session expired", n)
	}
	if err := c.Do(ctx, "GET", "samplers/"+sid, nil, nil); !isStatus(err, 404) {
		t.Fatalf("sampler of an expired session: %v", err)
	}
	if err := c.Do(ctx, "POST", "session_heartbeat", map[string]string{"session_id": sess}, nil); !isStatus(err, 404) {
		t.Fatalf("heartbeat of an expired session: %v", err)
	}
	if err := c.Do(ctx, "POST", "session_heartbeat", map[string]string{"session_id": other}, nil); err != nil {
		t.Fatalf("a heartbeating session expired: %v", err)
	}
	// Its ops now fail clearly, and the tenant may create adapters again.
	f, _ := tc.ForwardBackward(ctx, []api.Datum{datum([]int{1, 2, 3}, true)}, "cross_entropy", nil, true)
	var rf *client.RequestFailed
	if err := f.Result(ctx, &api.ForwardBackwardOutput{}); !errors.As(err, &rf) || rf.Category != "user" {
		t.Fatalf("op on an expired model: %v", err)
	}
	if _, err := c.CreateLoraTrainingClient(ctx, other, 0, base, 2); err != nil {
		t.Fatalf("after expiry the tenant limit should have room: %v", err)
	}
}

// A replica keeps a bounded number of read-only sampler copies; an evicted one reloads from disk
// when it is sampled again.
func TestSamplerCopiesAreBounded(t *testing.T) {
	ts, reps := newCluster(t, 1, 4)
	ctx := context.Background()
	c, tc := newRun(t, ts.URL, "tml-copies", 2)
	var ids []string
	for range gateway.SamplerCopiesPerReplica + 3 {
		f, _ := tc.SaveWeightsForSampler(ctx, "")
		var out struct {
			ID string `json:"sampling_session_id"`
		}
		if err := f.Result(ctx, &out); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, out.ID)
	}
	copies := func() int {
		n := 0
		for _, id := range reps[0].AdapterIDs(context.Background()) {
			if strings.HasPrefix(id, "sampler:") {
				n++
			}
		}
		return n
	}
	if n := copies(); n != gateway.SamplerCopiesPerReplica {
		t.Fatalf("%d sampler copies in memory, want %d", n, gateway.SamplerCopiesPerReplica)
	}
	mt := 2
	f, err := c.Sample(ctx, api.SampleRequest{SamplingSessionID: ids[0], Prompt: api.ModelInput{Chunks: []api.Chunk{{Tokens: []int{1, 2}}}},
		SamplingParams: api.SamplingParams{MaxTokens: &mt}})
	if err != nil {
		t.Fatal(err)
	}
	var res api.SampleResponse
	if err := f.Result(ctx, &res); err != nil || len(res.Sequences) != 1 {
		t.Fatalf("sampling an evicted snapshot: %v %+v", err, res)
	}
	if n := copies(); n != gateway.SamplerCopiesPerReplica {
		t.Fatalf("%d sampler copies after reloading one, want %d", n, gateway.SamplerCopiesPerReplica)
	}
}

// Sampling requests that wait on a busy replica become one job (one batched decode); the queue is
// bounded: past it asample answers 429 (the SDK backs off and retries); the queued requests are
// served once the replica frees.
func TestSamplingBackPressure(t *testing.T) {
	ts, reps := newClusterWith(t, 1, 2, gateway.Options{MaxQueuedSamples: 2})
	ctx := context.Background()
	c := client.New(ts.URL, "tml-pressure")
	block := make(chan struct{})
	_ = reps[0].Run(func() { <-block }) // keep the replica busy
	mt := 2
	req := api.SampleRequest{BaseModel: base, Prompt: api.ModelInput{Chunks: []api.Chunk{{Tokens: []int{1, 2}}}},
		SamplingParams: api.SamplingParams{MaxTokens: &mt}}
	var queued []*client.Future
	for range 2 {
		f, err := c.Sample(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		queued = append(queued, f)
	}
	// Both waiting requests are one job on the replica: they will decode as one batch.
	if d := reps[0].QueueDepth(); d != 2 {
		t.Fatalf("replica queue depth %d, want 2 (the blocker and one batched sampling job)", d)
	}
	if _, err := c.Sample(ctx, req); !isStatus(err, 429) {
		t.Fatalf("third request on a full queue: %v", err)
	}
	close(block)
	for _, f := range queued {
		var res api.SampleResponse
		if err := f.Result(ctx, &res); err != nil || len(res.Sequences) != 1 {
			t.Fatalf("queued request: %v %+v", err, res)
		}
	}
	if _, err := c.Sample(ctx, req); err != nil {
		t.Fatalf("after the queue drained: %v", err)
	}
}
