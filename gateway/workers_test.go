package gateway_test

import (
	"bytes"
	"context"
	"encoding/json"
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
	"github.com/skein-ai/skein/worker"
)

const clusterToken = "cluster-s3cret"

// postWorker posts a worker's registration or heartbeat and decodes the answer.
func postWorker(t *testing.T, url, path, token string, body any) (int, map[string]any) {
	t.Helper()
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest("POST", url+"/api/v1/skein/workers/"+path, bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set(worker.TokenHeader, token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out
}

// testWorker is a `skein worker` in process: a worker server over its own engine, counting the
// calls it receives; dying makes it take a forward_backward call and drop the connection, and cut
// does the same to the next call of the method it names.
type testWorker struct {
	*httptest.Server
	mu    sync.Mutex
	calls map[string]int
	dying atomic.Bool
	cut   atomic.Pointer[string]
	// garbleInfo makes it answer adapter_info with nothing usable.
	garbleInfo atomic.Bool
}

func newTestWorker(t *testing.T, e *engine.Engine, dataDir string) *testWorker {
	w := &testWorker{calls: map[string]int{}}
	ws := worker.NewServer(e.Fork(), clusterToken, dataDir)
	w.Server = httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		method := strings.TrimPrefix(r.URL.Path, "/worker/v1/")
		w.mu.Lock()
		w.calls[method]++
		w.mu.Unlock()
		if c := w.cut.Load(); (c != nil && *c == method && w.cut.CompareAndSwap(c, nil)) || (method == "forward_backward" && w.dying.Load()) {
			_, _ = io.Copy(io.Discard, r.Body)
			conn, _, _ := rw.(http.Hijacker).Hijack()
			conn.Close()
			return
		}
		if method == "adapter_info" && w.garbleInfo.Load() {
			_, _ = io.Copy(io.Discard, r.Body)
			_, _ = io.WriteString(rw, `{"lora":null,"step":-7}`)
			return
		}
		ws.ServeHTTP(rw, r)
	}))
	t.Cleanup(w.Close)
	return w
}

func (w *testWorker) count(method string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.calls[method]
}

func registration(id, url string, e *engine.Engine) worker.Registration {
	return worker.Registration{ID: id, URL: url, BaseModel: base, MaxLoras: 4, Info: e.Info()}
}

// newWorkerGateway is a gateway with no replica of its own that accepts workers; workers are
// never declared dead by silence here, so only a failed call can remove one.
func newWorkerGateway(t *testing.T) (*httptest.Server, *engine.Engine, string) {
	t.Helper()
	return newWorkerGatewayTimeout(t, time.Hour)
}

func newWorkerGatewayTimeout(t *testing.T, timeout time.Duration) (*httptest.Server, *engine.Engine, string) {
	t.Helper()
	e, err := engine.Load(modelDir(), engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	data := t.TempDir()
	gw, err := gateway.New(gateway.Options{DataDir: data, AcceptWorkers: true, WorkerToken: clusterToken, WorkerTimeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(gw)
	t.Cleanup(func() { ts.Close(); gw.Close() })
	return ts, e, data
}

// skein serve accepts no workers unless told to, and accepting them needs a token.
func TestServeAcceptsNoWorkersUnlessTold(t *testing.T) {
	ts := newServer(t, gateway.Options{WorkerToken: clusterToken})
	w := newTestWorker(t, ts.eng, t.TempDir())
	if code, _ := postWorker(t, ts.URL, "register", clusterToken, registration("intruder", w.URL, ts.eng)); code != http.StatusForbidden {
		t.Fatalf("registration with a server that accepts no workers: %d", code)
	}
	if code, _ := postWorker(t, ts.URL, "heartbeat", clusterToken, worker.Heartbeat{ID: "r0"}); code != http.StatusForbidden {
		t.Fatalf("heartbeat with a server that accepts no workers: %d", code)
	}
	if w.count("adapter_ids") != 0 {
		t.Fatal("the gateway called the would-be worker")
	}
	if _, err := gateway.New(gateway.Options{DataDir: t.TempDir(), AcceptWorkers: true}); err == nil {
		t.Fatal("a gateway accepting workers without a token started")
	}
	// Told to accept workers, it still lets none take the id of one of its own replicas.
	accepting := newServer(t, gateway.Options{WorkerToken: clusterToken, AcceptWorkers: true})
	if code, _ := postWorker(t, accepting.URL, "register", clusterToken, registration("r0", w.URL, ts.eng)); code != http.StatusConflict {
		t.Fatalf("registration taking an in-process replica's id: %d", code)
	}
	if code, _ := postWorker(t, accepting.URL, "register", clusterToken, registration("w1", w.URL, ts.eng)); code != http.StatusOK {
		t.Fatalf("registration with a server that accepts workers: %d", code)
	}
}

// A registration never displaces a live worker of the same id, and only the worker that
// registered (holding its registration's secret) can keep it alive.
func TestRegistrationCannotTakeOverALiveWorker(t *testing.T) {
	ts, e, data := newWorkerGateway(t)
	real, impostor := newTestWorker(t, e, data), newTestWorker(t, e, data)
	code, reply := postWorker(t, ts.URL, "register", clusterToken, registration("w", real.URL, e))
	secret, _ := reply["secret"].(string)
	if code != http.StatusOK || secret == "" {
		t.Fatalf("registration: %d %v", code, reply)
	}
	if code, _ := postWorker(t, ts.URL, "register", clusterToken, registration("w", impostor.URL, e)); code != http.StatusConflict {
		t.Fatalf("second registration of a live id: %d", code)
	}
	if impostor.count("adapter_ids") != 0 {
		t.Fatal("the impostor was called")
	}
	for _, s := range []string{"", "guess", secret + "x"} {
		if code, _ := postWorker(t, ts.URL, "heartbeat", clusterToken, worker.Heartbeat{ID: "w", Secret: s}); code != http.StatusForbidden {
			t.Fatalf("heartbeat with secret %q: %d", s, code)
		}
	}
	if code, _ := postWorker(t, ts.URL, "heartbeat", clusterToken, worker.Heartbeat{ID: "w", Secret: secret}); code != http.StatusOK {
		t.Fatalf("the registered worker's heartbeat: %d", code)
	}
	if code, _ := postWorker(t, ts.URL, "register", "wrong", registration("x", impostor.URL, e)); code != http.StatusUnauthorized {
		t.Fatalf("registration with a wrong token: %d", code)
	}
	for _, bad := range []worker.Registration{
		{ID: "y", URL: "file:///etc/passwd", BaseModel: base, Info: e.Info()},
		{ID: "y", URL: impostor.URL, BaseModel: base},
		{ID: "y", URL: impostor.URL, BaseModel: base, MaxLoras: 1 << 30, Info: e.Info()},
	} {
		if code, _ := postWorker(t, ts.URL, "register", clusterToken, bad); code != http.StatusBadRequest {
			t.Fatalf("registration %+v: %d", bad, code)
		}
	}
	var out struct {
		Replicas []struct {
			ID string `json:"id"`
		} `json:"replicas"`
	}
	if err := client.New(ts.URL, "tml-op").Do(context.Background(), "GET", "skein/replicas", nil, &out); err != nil || len(out.Replicas) != 1 {
		t.Fatalf("replicas %+v %v", out.Replicas, err)
	}
}

// step runs forward_backward and optim_step, submitted together, and returns the optimizer's
// step count and the first error.
func step(t *testing.T, tc *client.TrainingClient) (float64, error) {
	t.Helper()
	ctx := context.Background()
	batch := []api.Datum{datum([]int{10, 20, 30, 40, 50, 60, 70}, true)}
	fb, err := tc.ForwardBackward(ctx, batch, "cross_entropy", nil, false)
	if err != nil {
		t.Fatal(err)
	}
	op, err := tc.OptimStep(ctx, 1e-2)
	if err != nil {
		t.Fatal(err)
	}
	fbErr := fb.Result(ctx, &api.ForwardBackwardOutput{})
	var out struct {
		Metrics map[string]float64 `json:"metrics"`
	}
	err = op.Result(ctx, &out)
	if fbErr != nil {
		err = fbErr
	}
	return out.Metrics["step:max"], err
}

// When the worker holding an adapter can no longer be reached, its ops do not fail: the worker
// is dropped at once and the op runs on the adapter's new replica, from its last saved state.
func TestOpsOfALostWorkerGoToTheNewReplica(t *testing.T) {
	ts, e, data := newWorkerGateway(t)
	a, b := newTestWorker(t, e, data), newTestWorker(t, e, data)
	if code, _ := postWorker(t, ts.URL, "register", clusterToken, registration("a", a.URL, e)); code != http.StatusOK {
		t.Fatal("register a")
	}
	_, tc := newRun(t, ts.URL, "tml-lost", 4)
	if s, err := step(t, tc); err != nil || s != 1 {
		t.Fatalf("first step: %v %v", s, err)
	}
	if code, _ := postWorker(t, ts.URL, "register", clusterToken, registration("b", b.URL, e)); code != http.StatusOK {
		t.Fatal("register b")
	}
	a.Close() // gone without a word; it is still registered
	s, err := step(t, tc)
	if err != nil || s != 2 {
		t.Fatalf("step after the worker was lost: %v %v", s, err)
	}
	if b.count("forward_backward") != 1 || b.count("load") != 1 {
		t.Fatalf("worker b saw %d forward_backward and %d load calls", b.count("forward_backward"), b.count("load"))
	}
}

// An op that reached a worker which then died may have run there: it fails, saying so, and is
// not run again on another worker; the next op goes on from the last saved state.
func TestAnOpThatMayHaveRunIsNotRunTwice(t *testing.T) {
	ts, e, data := newWorkerGateway(t)
	a, b := newTestWorker(t, e, data), newTestWorker(t, e, data)
	if code, _ := postWorker(t, ts.URL, "register", clusterToken, registration("a", a.URL, e)); code != http.StatusOK {
		t.Fatal("register a")
	}
	_, tc := newRun(t, ts.URL, "tml-maybe", 4)
	if s, err := step(t, tc); err != nil || s != 1 {
		t.Fatalf("first step: %v %v", s, err)
	}
	if code, _ := postWorker(t, ts.URL, "register", clusterToken, registration("b", b.URL, e)); code != http.StatusOK {
		t.Fatal("register b")
	}
	a.dying.Store(true)
	// The optim_step submitted with it had not reached the worker: it runs on b, from step 1.
	s, err := step(t, tc)
	if err == nil || !strings.Contains(err.Error(), "may have run") || s != 2 {
		t.Fatalf("op on a worker that died during it: %v (optim_step after it: step %v)", err, s)
	}
	if n := b.count("forward_backward"); n != 0 {
		t.Fatalf("the op ran again on worker b (%d times)", n)
	}
	if s, err := step(t, tc); err != nil || s != 3 {
		t.Fatalf("next step: %v %v", s, err)
	}
}

// Whichever call of an optim_step is cut after its worker is lost (the step itself, reading the
// step count after it, or saving the state after it), the forward_backwards it consumed go back
// to the run's ledger: the next optim_step with no new forward_backward fails naming them, never
// a zero-gradient step (cutting the save used to step with grad_norm 0); running them again, the
// run goes on from its last saved step.
func TestACutOptimStepGivesBackItsGradients(t *testing.T) {
	for _, cut := range []string{"optim_step", "adapter_info", "save"} {
		t.Run(cut, func(t *testing.T) {
			ctx := context.Background()
			ts, e, data := newWorkerGateway(t)
			a, b := newTestWorker(t, e, data), newTestWorker(t, e, data)
			if code, _ := postWorker(t, ts.URL, "register", clusterToken, registration("a", a.URL, e)); code != http.StatusOK {
				t.Fatal("register a")
			}
			_, tc := newRun(t, ts.URL, "tml-cut", 4)
			if s, err := step(t, tc); err != nil || s != 1 {
				t.Fatalf("first step: %v %v", s, err)
			}
			if code, _ := postWorker(t, ts.URL, "register", clusterToken, registration("b", b.URL, e)); code != http.StatusOK {
				t.Fatal("register b")
			}
			fb, err := tc.ForwardBackward(ctx, []api.Datum{datum([]int{10, 20, 30, 40, 50, 60, 70}, true)}, "cross_entropy", nil, false)
			if err != nil {
				t.Fatal(err)
			}
			if err := fb.Result(ctx, &api.ForwardBackwardOutput{}); err != nil {
				t.Fatal(err)
			}
			a.cut.Store(&cut)
			op, err := tc.OptimStep(ctx, 1e-2)
			if err != nil {
				t.Fatal(err)
			}
			if err := op.Result(ctx, nil); err == nil || !strings.Contains(err.Error(), "may have run") {
				t.Fatalf("optim_step whose %s call was cut: %v", cut, err)
			}
			m, err := optimStep(t, tc)
			var rf *client.RequestFailed
			if !errors.As(err, &rf) || !strings.Contains(rf.Message, "lost") || !strings.Contains(rf.Message, fb.RequestID) {
				t.Fatalf("optim_step after the cut one, with no new forward_backward: %v %v (want an error naming %s)", m, err, fb.RequestID)
			}
			mustForwardBackward(t, tc, false)
			if m, err = optimStep(t, tc); err != nil || m["step:max"] != 2 || m["grad_norm:mean"] == 0 {
				t.Fatalf("step after running forward_backward again: %v %v", m, err)
			}
		})
	}
}

// panickyEngine is a replica's compute with a bug in sampling, and in training on token 13.
type panickyEngine struct{ *engine.Engine }

func (p panickyEngine) ForwardBatch(ctx context.Context, id string, b *engine.Batch, backward bool) (*engine.ForwardResult, error) {
	if backward && b.Data[0].Tokens[0] == 13 {
		var res *engine.ForwardResult
		return res, fmt.Errorf("%v", res.Loss) // nil dereference
	}
	return p.Engine.ForwardBatch(ctx, id, b, backward)
}

func (p panickyEngine) SampleBatch(context.Context, string, []engine.SampleRequest) ([]*engine.SampleResult, error) {
	var res []*engine.SampleResult
	return []*engine.SampleResult{res[3]}, nil // index out of range
}

func (p panickyEngine) SampleContinuous(_ context.Context, first []engine.FedRequest, _ func(int) []engine.FedRequest) error {
	return first[len(first)+2].Ctx.Err() // index out of range
}

// A panic in compute fails the requests it was serving, with a message; the server goes on.
func TestAPanicInComputeFailsItsRequestsOnly(t *testing.T) {
	e, err := engine.Load(modelDir(), engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rep := replica.New("r0", base, panickyEngine{e}, 0)
	defer rep.Close()
	gw, err := gateway.New(gateway.Options{DataDir: t.TempDir()}, rep)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(gw)
	defer func() { ts.Close(); gw.Close() }()
	ctx := context.Background()
	c := client.New(ts.URL, "tml-panic")
	sess, _ := c.CreateSession(ctx)
	sid, err := c.CreateSamplingSession(ctx, sess, base, "")
	if err != nil {
		t.Fatal(err)
	}
	mt := 2
	f, err := c.Sample(ctx, api.SampleRequest{SamplingSessionID: sid, Prompt: api.ModelInput{Chunks: []api.Chunk{{Tokens: []int{1, 2}}}},
		SamplingParams: api.SamplingParams{MaxTokens: &mt}})
	if err != nil {
		t.Fatal(err)
	}
	// Bounded only so that a request left pending (the failure this test is about) ends the test.
	wait, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := f.Result(wait, &api.SampleResponse{}); err == nil || !strings.Contains(err.Error(), "internal error") {
		t.Fatalf("sample on a panicking engine: %v", err)
	}
	_, tc := newRun(t, ts.URL, "tml-panic", 4)
	bad, err := tc.ForwardBackward(ctx, []api.Datum{datum([]int{13, 14, 15}, true)}, "cross_entropy", nil, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := bad.Result(wait, &api.ForwardBackwardOutput{}); err == nil || !strings.Contains(err.Error(), "internal error") {
		t.Fatalf("forward_backward on a panicking engine: %v", err)
	}
	if s, err := step(t, tc); err != nil || s != 1 {
		t.Fatalf("training after the panics: %v %v", s, err)
	}
}

// Sampling on a worker that can no longer be reached goes to another replica.
func TestSamplesOfALostWorkerGoElsewhere(t *testing.T) {
	ts, e, data := newWorkerGateway(t)
	a, b := newTestWorker(t, e, data), newTestWorker(t, e, data)
	for _, w := range []struct {
		id string
		tw *testWorker
	}{{"a", a}, {"b", b}} {
		if code, _ := postWorker(t, ts.URL, "register", clusterToken, registration(w.id, w.tw.URL, e)); code != http.StatusOK {
			t.Fatal("register", w.id)
		}
	}
	ctx := context.Background()
	c := client.New(ts.URL, "tml-lost-sample")
	sess, _ := c.CreateSession(ctx)
	sid, err := c.CreateSamplingSession(ctx, sess, base, "")
	if err != nil {
		t.Fatal(err)
	}
	a.Close()
	b.Close()
	b2 := newTestWorker(t, e, data) // b restarted elsewhere: a new registration
	if code, _ := postWorker(t, ts.URL, "register", clusterToken, registration("b2", b2.URL, e)); code != http.StatusOK {
		t.Fatal("register b2")
	}
	mt := 2
	f, err := c.Sample(ctx, api.SampleRequest{SamplingSessionID: sid, Prompt: api.ModelInput{Chunks: []api.Chunk{{Tokens: []int{1, 2}}}},
		SamplingParams: api.SamplingParams{MaxTokens: &mt}})
	if err != nil {
		t.Fatal(err)
	}
	var out api.SampleResponse
	if err := f.Result(ctx, &out); err != nil || len(out.Sequences) != 1 {
		t.Fatalf("sample after two workers were lost: %v %+v", err, out)
	}
	if b2.count("sample") != 1 {
		t.Fatalf("the surviving worker served %d samples", b2.count("sample"))
	}
}

// A worker's unusable answer fails the request that got it and changes nothing: load_weights
// with a garbled adapter_info answer leaves the run as it was.
func TestAGarbledAnswerFailsItsRequestOnly(t *testing.T) {
	ts, e, data := newWorkerGateway(t)
	a := newTestWorker(t, e, data)
	if code, _ := postWorker(t, ts.URL, "register", clusterToken, registration("a", a.URL, e)); code != http.StatusOK {
		t.Fatal("register a")
	}
	c, tc := newRun(t, ts.URL, "tml-garbled", 4)
	if s, err := step(t, tc); err != nil || s != 1 {
		t.Fatalf("first step: %v %v", s, err)
	}
	ctx := context.Background()
	f, _ := tc.SaveState(ctx, "one")
	var saved struct {
		Path string `json:"path"`
	}
	if err := f.Result(ctx, &saved); err != nil {
		t.Fatal(err)
	}
	a.garbleInfo.Store(true)
	f, _ = tc.LoadState(ctx, saved.Path, true)
	if err := f.Result(ctx, nil); err == nil || !strings.Contains(err.Error(), "bad answer from worker") {
		t.Fatalf("load_weights with a garbled answer: %v", err)
	}
	a.garbleInfo.Store(false)
	var info struct {
		Rank int `json:"lora_rank"`
	}
	if err := c.Do(ctx, "POST", "get_info", map[string]string{"model_id": tc.ModelID}, &info); err != nil || info.Rank != 4 {
		t.Fatalf("run after the garbled answer: rank %d, %v", info.Rank, err)
	}
}

// A registration under a new id cannot claim the address of a live worker (it would drop that
// worker's adapters); once the worker at that address has missed its heartbeats, the address is
// free again, for the worker itself after a restart.
func TestRegistrationCannotClaimALiveWorkersAddress(t *testing.T) {
	ts, e, data := newWorkerGatewayTimeout(t, 2*time.Second)
	real := newTestWorker(t, e, data)
	if code, reply := postWorker(t, ts.URL, "register", clusterToken, registration("w", real.URL, e)); code != http.StatusOK {
		t.Fatalf("registration: %d %v", code, reply)
	}
	called := real.count("adapter_ids")
	for _, addr := range []string{real.URL, real.URL + "/", strings.ToUpper(real.URL)} {
		code, reply := postWorker(t, ts.URL, "register", clusterToken, registration("other", addr, e))
		if code != http.StatusConflict || !strings.Contains(fmt.Sprint(reply), "address") {
			t.Fatalf("registration of another id at the live worker's address %s: %d %v", addr, code, reply)
		}
	}
	if real.count("adapter_ids") != called {
		t.Fatal("the live worker was called by the refused registration")
	}
	// The live one stops heartbeating (it restarted): the address is free once it is dead.
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, _ := postWorker(t, ts.URL, "register", clusterToken, registration("w2", real.URL, e))
		if code == http.StatusOK {
			break
		}
		if code != http.StatusConflict || time.Now().After(deadline) {
			t.Fatalf("registration at a dead worker's address: %d", code)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
