package worker

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/skein-ai/skein/engine"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// The probes answer without the cluster token (the kubelet has none); readiness fails once the
// worker drains, liveness does not; every other path still needs the token.
func TestProbesAnswerWithoutTheTokenAndReadinessFollowsTheDrain(t *testing.T) {
	ws := NewServer(&fakeEngine{}, "tok", t.TempDir())
	ts := httptest.NewServer(ws)
	defer ts.Close()
	steps := []struct {
		name         string
		drain        bool
		path         string
		status       int
		bodyContains string
	}{
		{"alive", false, "/healthz", 200, "ok"},
		{"ready", false, "/readyz", 200, "ok"},
		{"calls still need the token", false, "/worker/v1/status", 401, "bad worker token"},
		{"draining: not ready", true, "/readyz", 503, "draining"},
		{"draining: still alive", true, "/healthz", 200, "ok"},
	}
	for _, st := range steps {
		if st.drain {
			ws.Drain()
		}
		var code int
		var body string
		if strings.HasPrefix(st.path, "/worker/") {
			resp, err := http.Post(ts.URL+st.path, "application/json", strings.NewReader("{}"))
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			code, body = resp.StatusCode, string(b)
		} else {
			code, body = get(t, ts.URL+st.path)
		}
		if code != st.status || !strings.Contains(body, st.bodyContains) {
			t.Errorf("%s: %s answered %d %q, want %d containing %q", st.name, st.path, code, body, st.status, st.bodyContains)
		}
	}
	resp, err := http.Post(ts.URL+"/readyz", "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST /readyz: %d, want 405", resp.StatusCode)
	}
}

// The status and describe calls answer while a long call holds the worker: they are the
// gateway's liveness check, which must not wait for a forward_backward of minutes.
func TestStatusAnswersBesideALongCall(t *testing.T) {
	b := &blockingEngine{started: make(chan struct{}), sawCancel: make(chan struct{})}
	ws := NewServer(b, "tok", t.TempDir())
	ws.SetIdentity("tiny", 3)
	ts := httptest.NewServer(ws)
	defer ts.Close()
	c := NewClient(ts.URL, "tok", b.Info())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		_, _ = c.ForwardBackward(ctx, "a", []engine.Datum{{Tokens: []int{1, 2}}}, "cross_entropy", nil)
		close(done)
	}()
	<-b.started
	qctx, qcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer qcancel()
	hb, err := c.Status(qctx)
	if err != nil {
		t.Fatalf("status beside a running call: %v", err)
	}
	if hb.QueueDepth != 1 || hb.FreeSlots != 2 || hb.Draining {
		t.Fatalf("status %+v: want queue_depth 1 (the running call), free_slots 3-1, not draining", hb)
	}
	reg, err := c.Describe(qctx, "tiny@w0")
	if err != nil || reg.BaseModel != "tiny" || reg.MaxLoras != 3 || reg.ID != "tiny@w0" || reg.URL != ts.URL {
		t.Fatalf("describe: %+v, %v", reg, err)
	}
	ws.Drain()
	if hb, err := c.Status(qctx); err != nil || !hb.Draining {
		t.Fatalf("status after Drain: %+v, %v", hb, err)
	}
	cancel()
	<-done
}

// A worker without an identity cannot be described (a registering worker never needs one).
func TestDescribeNeedsAnIdentity(t *testing.T) {
	ts := httptest.NewServer(NewServer(&fakeEngine{}, "tok", t.TempDir()))
	defer ts.Close()
	if _, err := NewClient(ts.URL, "tok", engine.ModelInfo{}).Describe(context.Background(), "x"); err == nil {
		t.Fatal("described without an identity")
	}
}

// adapter_states says which adapters hold gradients no optim_step consumed, on a real engine:
// create → clean, forward_backward → not, optim_step → clean again; a failed forward_backward
// counts as not clean (it may have accumulated part of its batch).
func TestAdapterStatesTrackUnsteppedGradients(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tiny")
	if err := engine.InitTiny(dir, engine.ArchQwen2, "tiny", 1); err != nil {
		t.Fatal(err)
	}
	e, err := engine.Load(dir, engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(NewServer(e, "tok", t.TempDir()))
	defer ts.Close()
	c := NewClient(ts.URL, "tok", e.Info())
	ctx := context.Background()
	state := func(id string) (AdapterState, bool) {
		t.Helper()
		sts, err := c.AdapterStates(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, st := range sts {
			if st.ID == id {
				return st, true
			}
		}
		return AdapterState{}, false
	}
	if err := c.CreateLora(ctx, "a", engine.LoraConfig{Rank: 2, Seed: 1, TrainMLP: true}); err != nil {
		t.Fatal(err)
	}
	if st, ok := state("a"); !ok || !st.Clean || st.Step != 0 {
		t.Fatalf("after create: %+v %v", st, ok)
	}
	datum := []engine.Datum{{Tokens: []int{1, 2, 3}, Inputs: map[string]engine.TensorInput{
		"target_tokens": {DType: "int64", Data: []float64{2, 3, 4}}, "weights": {DType: "float32", Data: []float64{1, 1, 1}}}}}
	if _, err := c.ForwardBackward(ctx, "a", datum, "cross_entropy", nil); err != nil {
		t.Fatal(err)
	}
	if st, _ := state("a"); st.Clean {
		t.Fatal("after forward_backward: reported clean")
	}
	if _, err := c.OptimStep(ctx, "a", engine.AdamParams{LearningRate: 1e-3, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8}); err != nil {
		t.Fatal(err)
	}
	if st, _ := state("a"); !st.Clean || st.Step != 1 {
		t.Fatalf("after optim_step: %+v", st)
	}
	bad := []engine.Datum{{Tokens: []int{1 << 30}, Inputs: map[string]engine.TensorInput{
		"target_tokens": {DType: "int64", Data: []float64{1}}, "weights": {DType: "float32", Data: []float64{1}}}}}
	if _, err := c.ForwardBackward(ctx, "a", bad, "cross_entropy", nil); err == nil {
		t.Fatal("an out-of-vocabulary token was accepted")
	}
	if st, _ := state("a"); st.Clean {
		t.Fatal("after a failed forward_backward: reported clean")
	}
}

// A discovered worker's describe, status and adapter_states answers are checked like a
// registration and a heartbeat: out-of-range or missing fields are errors, not a replica.
func TestHostileDiscoveryAnswersAreErrors(t *testing.T) {
	info := `{"config":{"vocab_size":8,"max_position_embeddings":16}}`
	calls := map[string]func(c *Client) error{
		"describe":       func(c *Client) error { _, err := c.Describe(context.Background(), "w"); return err },
		"status":         func(c *Client) error { _, err := c.Status(context.Background()); return err },
		"adapter_states": func(c *Client) error { _, err := c.AdapterStates(context.Background()); return err },
	}
	cases := []struct {
		call, body string
		ok         bool
	}{
		{"describe", `{"describe":{"base_model":"m","max_loras":2,"info":` + info + `}}`, true},
		{"describe", `{}`, false},
		{"describe", `{"describe":{"base_model":"","max_loras":2,"info":` + info + `}}`, false},
		{"describe", `{"describe":{"base_model":"m","max_loras":99999999,"info":` + info + `}}`, false},
		{"describe", `{"describe":{"base_model":"m","max_loras":2,"info":{}}}`, false},
		{"status", `{"status":{"adapters":[],"free_slots":2,"queue_depth":0}}`, true},
		{"status", `{}`, false},
		{"status", `{"status":{"queue_depth":-1}}`, false},
		{"adapter_states", `{"states":[{"id":"a","step":3,"clean":true}]}`, true},
		{"adapter_states", `{"states":[{"id":"a","step":-1}]}`, false},
		{"adapter_states", `{"states":[{"id":"","step":1}]}`, false},
		{"adapter_states", `{"states":[{"id":"a","step":1},{"id":"a","step":1}]}`, false},
	}
	for _, tc := range cases {
		ts := answering(tc.body)
		err := calls[tc.call](NewClient(ts.URL, "tok", engine.ModelInfo{}))
		ts.Close()
		if (err == nil) != tc.ok {
			t.Errorf("%s answered %s: err %v, want ok=%v", tc.call, tc.body, err, tc.ok)
		}
	}
}
