package worker

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/skein-ai/skein/engine"
	"github.com/skein-ai/skein/storage"
)

// fakeEngine records what reaches the engine and answers the smallest valid results.
type fakeEngine struct {
	loads, saves []string
}

func (f *fakeEngine) Info() engine.ModelInfo {
	return engine.ModelInfo{Config: &engine.Config{VocabSize: 50, MaxPositionEmbeddings: 64}, MaxRank: 8}
}
func (f *fakeEngine) HasAdapter(context.Context, string) bool                     { return true }
func (f *fakeEngine) AdapterIDs(context.Context) []string                         { return []string{"a"} }
func (f *fakeEngine) CreateLora(context.Context, string, engine.LoraConfig) error { return nil }
func (f *fakeEngine) DeleteAdapter(context.Context, string) bool                  { return true }
func (f *fakeEngine) AdapterInfo(context.Context, string) (engine.LoraConfig, int, error) {
	return engine.LoraConfig{Rank: 2}, 1, nil
}
func (f *fakeEngine) LoadAdapter(ctx context.Context, id, dir string, _ bool) error {
	f.loads = append(f.loads, dir)
	return nil
}
func (f *fakeEngine) SaveAdapter(ctx context.Context, id, dir string, _ bool) error {
	f.saves = append(f.saves, dir)
	return nil
}
func (f *fakeEngine) Forward(ctx context.Context, id string, data []engine.Datum, _ string, _ map[string]float64) (*engine.ForwardResult, error) {
	res := &engine.ForwardResult{Metrics: map[string]float64{"loss:sum": 0}}
	for _, d := range data {
		res.Logprobs = append(res.Logprobs, make([]float64, len(d.Tokens)))
		res.Losses = append(res.Losses, make([]float64, len(d.Tokens)))
	}
	return res, nil
}
func (f *fakeEngine) ForwardBackward(ctx context.Context, id string, data []engine.Datum, loss string, cfg map[string]float64) (*engine.ForwardResult, error) {
	return f.Forward(ctx, id, data, loss, cfg)
}
func (f *fakeEngine) ForwardBatch(ctx context.Context, id string, b *engine.Batch, _ bool) (*engine.ForwardResult, error) {
	return f.Forward(ctx, id, b.Data, b.Loss, b.LossConfig)
}
func (f *fakeEngine) OptimStep(context.Context, string, engine.AdamParams) (map[string]float64, error) {
	return map[string]float64{"step:max": 1}, nil
}
func (f *fakeEngine) SampleBatch(ctx context.Context, id string, reqs []engine.SampleRequest) ([]*engine.SampleResult, error) {
	var out []*engine.SampleResult
	for _, q := range reqs {
		r := &engine.SampleResult{}
		for range min(max(q.NumSamples, 1), 128) { // the real engine refuses more
			r.Sequences = append(r.Sequences, engine.SampledSequence{Tokens: []int{1}, Logprobs: []float64{-1}, StopReason: "length"})
		}
		out = append(out, r)
	}
	return out, nil
}

func (f *fakeEngine) TrainingAdapterIDs(context.Context) []string { return []string{"a"} }
func (f *fakeEngine) LoadSnapshot(ctx context.Context, id, dir string) error {
	f.loads = append(f.loads, dir)
	return nil
}

var _ engine.Compute = (*fakeEngine)(nil)

// A worker started without a token serves no call at all, and a wrong token is refused.
func TestWorkerWithoutTokenServesNothing(t *testing.T) {
	f := &fakeEngine{}
	for _, tc := range []struct{ serverToken, clientToken string }{{"", ""}, {"", "x"}, {"tok", ""}, {"tok", "tok2"}} {
		ts := httptest.NewServer(NewServer(f, tc.serverToken, t.TempDir()))
		c := NewClient(ts.URL, tc.clientToken, f.Info())
		if err := c.CreateLora(context.Background(), "a", engine.LoraConfig{Rank: 2}); err == nil {
			t.Errorf("server token %q, client token %q: the call was served", tc.serverToken, tc.clientToken)
		}
		ts.Close()
	}
}

// The directories of load and save calls resolve inside the worker's data directory: "..",
// absolute paths elsewhere and symbolic links out of it are refused before the engine sees them.
func TestLoadAndSaveStayInsideTheDataDir(t *testing.T) {
	root := t.TempDir()
	data := filepath.Join(root, "data")
	outside := filepath.Join(root, "outside")
	for _, d := range []string{filepath.Join(data, "runs"), outside} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(outside, filepath.Join(data, "escape")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(outside, "missing"), filepath.Join(data, "dangling")); err != nil {
		t.Fatal(err)
	}
	f := &fakeEngine{}
	ts := httptest.NewServer(NewServer(f, "tok", data))
	defer ts.Close()
	c := NewClient(ts.URL, "tok", f.Info())
	refused := []string{
		"", outside, filepath.Join(outside, "x"), "/etc", filepath.Join(data, "..", "outside"),
		filepath.Join(data, "runs") + "/../../outside", filepath.Join(data, "escape"),
		filepath.Join(data, "escape", "new"), filepath.Join(data, "dangling"), data + "-sibling",
	}
	for _, dir := range refused {
		if err := c.SaveAdapter(context.Background(), "a", dir, true); err == nil || !strings.Contains(err.Error(), "outside the worker's data directory") {
			t.Errorf("save to %q: %v", dir, err)
		}
		if err := c.LoadAdapter(context.Background(), "a", dir, true); err == nil {
			t.Errorf("load from %q was served", dir)
		}
	}
	if len(f.loads)+len(f.saves) != 0 {
		t.Fatalf("the engine saw %v %v", f.loads, f.saves)
	}
	for _, dir := range []string{filepath.Join(data, "runs"), filepath.Join(data, "runs", "new", "deeper")} {
		if err := c.SaveAdapter(context.Background(), "a", dir, true); err != nil {
			t.Errorf("save to %q: %v", dir, err)
		}
	}
	if len(f.saves) != 2 {
		t.Fatalf("saves inside the data directory: %v", f.saves)
	}
}

// answering serves one canned body for every call.
// The handshake is a real worker's (token "tok"): the client talks to a worker that proved the
// token, which then answers hostile things.
func answering(body string) *httptest.Server {
	real := NewServer(&fakeEngine{}, "tok", os.TempDir())
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/hello") {
			real.ServeHTTP(w, r)
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = io.WriteString(w, body)
	}))
}

// Whatever a worker answers, the client returns a valid result or an error: nil results, wrong
// counts and lengths, out-of-range tokens and steps, and garbage are errors for that call.
func TestHostileAnswersAreErrors(t *testing.T) {
	info := (&fakeEngine{}).Info()
	data := []engine.Datum{{Tokens: []int{1, 2, 3}}}
	sample := []engine.SampleRequest{{Prompt: []int{1, 2}, NumSamples: 2, Params: engine.SampleParams{MaxTokens: 2}}}
	calls := map[string]func(c *Client) error{
		"forward": func(c *Client) error {
			_, err := c.Forward(context.Background(), "a", data, "cross_entropy", nil)
			return err
		},
		"forward_backward": func(c *Client) error {
			_, err := c.ForwardBackward(context.Background(), "a", data, "cross_entropy", nil)
			return err
		},
		"optim_step": func(c *Client) error {
			_, err := c.OptimStep(context.Background(), "a", engine.AdamParams{})
			return err
		},
		"adapter_info": func(c *Client) error { _, _, err := c.AdapterInfo(context.Background(), "a"); return err },
		"sample":       func(c *Client) error { _, err := c.SampleBatch(context.Background(), "a", sample); return err },
	}
	cases := []struct{ call, body string }{
		{"forward", `{}`},
		{"forward", `{"forward":null}`},
		{"forward", `{"forward":{"Logprobs":[],"Losses":[]}}`},
		{"forward", `{"forward":{"Logprobs":[[0]],"Losses":[[0]]}}`},
		{"forward", `{"forward":{"Logprobs":[[0,0,0]],"Losses":[[0,0,0]],"Loss":1e999}}`},
		{"forward_backward", `{"forward":{"Logprobs":[[0,0,0],[0,0,0]],"Losses":[[0,0,0],[0,0,0]]}}`},
		{"forward_backward", `not json`},
		{"optim_step", `{"metrics":{"x":"y"}}`},
		{"adapter_info", `{}`},
		{"adapter_info", `{"lora":{"rank":0}}`},
		{"adapter_info", `{"lora":{"rank":2},"step":-1}`},
		{"adapter_info", `{"lora":{"rank":99999}}`},
		{"sample", `{}`},
		{"sample", `{"samples":[null]}`},
		{"sample", `{"samples":[{"sequences":[]}]}`},
		{"sample", `{"samples":[{"sequences":[{"Tokens":[1],"Logprobs":[0],"StopReason":"length"}]}]}`},
		{"sample", `{"samples":[{"sequences":[{"Tokens":[1,2,3],"Logprobs":[0,0,0],"StopReason":"length"},{"Tokens":[1],"Logprobs":[0],"StopReason":"length"}]}]}`},
		{"sample", `{"samples":[{"sequences":[{"Tokens":[999],"Logprobs":[0],"StopReason":"length"},{"Tokens":[1],"Logprobs":[0],"StopReason":"length"}]}]}`},
		{"sample", `{"samples":[{"sequences":[{"Tokens":[1],"Logprobs":[],"StopReason":"length"},{"Tokens":[1],"Logprobs":[0],"StopReason":"length"}]}]}`},
		{"sample", `{"samples":[{"sequences":[{"Tokens":[1],"Logprobs":[0],"StopReason":"x"},{"Tokens":[1],"Logprobs":[0],"StopReason":"length"}]}]}`},
		{"sample", `{"samples":[{"sequences":[{"Tokens":[1],"Logprobs":[0],"StopReason":"length"},{"Tokens":[1],"Logprobs":[0],"StopReason":"length"}],"prompt_logprobs":[null,0]}]}`},
	}
	for _, tc := range cases {
		ts := answering(tc.body)
		err := calls[tc.call](NewClient(ts.URL, "tok", info))
		ts.Close()
		if err == nil {
			t.Errorf("%s answered %s: accepted", tc.call, tc.body)
		}
	}
	// Sanity: the same client accepts well-formed answers.
	ts := httptest.NewServer(NewServer(&fakeEngine{}, "tok", t.TempDir()))
	defer ts.Close()
	for name, call := range calls {
		if err := call(NewClient(ts.URL, "tok", info)); err != nil {
			t.Errorf("%s against a well-behaved worker: %v", name, err)
		}
	}
	// An answer larger than the bound is refused without reading it all.
	if _, err := decodeAnswer(bytes.NewReader(append([]byte(`{"error":"`), bytes.Repeat([]byte("x"), 2048)...)), 1024); !errors.Is(err, ErrBadAnswer) {
		t.Fatalf("oversized answer: %v", err)
	}
}

// A call's effects are counted once it reaches the worker, answered or not, so that the gateway
// knows whether an op whose worker was lost may have run.
func TestEffectsCountDeliveredCalls(t *testing.T) {
	ts := httptest.NewServer(NewServer(&fakeEngine{}, "tok", t.TempDir()))
	c := NewClient(ts.URL, "tok", (&fakeEngine{}).Info())
	_, _ = c.ForwardBackward(context.Background(), "a", []engine.Datum{{Tokens: []int{1}}}, "cross_entropy", nil)
	_, _ = c.Forward(context.Background(), "a", []engine.Datum{{Tokens: []int{1}}}, "cross_entropy", nil)
	if c.Effects() != 1 {
		t.Fatalf("effects %d after one forward_backward and one forward", c.Effects())
	}
	ts.Close()
	_, err := c.OptimStep(context.Background(), "a", engine.AdamParams{})
	if !errors.Is(err, ErrUnreachable) || c.Effects() != 1 {
		t.Fatalf("call to a closed worker: %v, effects %d", err, c.Effects())
	}
	// A worker that takes the call and dies before answering: lost, and counted.
	real := NewServer(&fakeEngine{}, "tok", t.TempDir())
	dies := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/hello") {
			real.ServeHTTP(w, r) // a worker that proved the token
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
		conn, _, _ := w.(http.Hijacker).Hijack()
		conn.Close()
	}))
	defer dies.Close()
	c = NewClient(dies.URL, "tok", (&fakeEngine{}).Info())
	if _, err := c.OptimStep(context.Background(), "a", engine.AdamParams{}); !errors.Is(err, ErrLost) || c.Effects() != 1 {
		t.Fatalf("call to a worker that died mid-call: %v, effects %d", err, c.Effects())
	}
}

// A call's storage key is checked before it names anything: no key climbs out of the data
// directory (or the bucket's prefix), names a hidden file, or follows a link out, whatever the
// peer sends; the engine sees none of them. Valid keys land inside the data directory.
func TestKeysStayInsideTheDataDir(t *testing.T) {
	root := t.TempDir()
	data := filepath.Join(root, "data")
	outside := filepath.Join(root, "outside")
	for _, d := range []string{data, outside} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(outside, filepath.Join(data, "escape")); err != nil {
		t.Fatal(err)
	}
	f := &fakeEngine{}
	ts := httptest.NewServer(NewServer(f, "tok", data))
	defer ts.Close()
	c := NewClient(ts.URL, "tok", f.Info())
	for _, key := range []string{"../outside", "state/../../outside", "/etc/passwd", ".tmp/x", "state/.lock", "escape/x", "a//b", "a\\..\\b", "state/%2e%2e"} {
		if _, err := c.do(context.Background(), "save", callRequest{ID: "a", Key: key, WithOptimizer: true}); err == nil || !strings.Contains(err.Error(), "outside the worker's data directory") {
			t.Errorf("save to key %q: %v", key, err)
		}
	}
	if len(f.saves) != 0 {
		t.Fatalf("the engine saw %v", f.saves)
	}
	// The gateway's side: a path outside its data directory never becomes a key.
	c.Root = data
	if err := c.SaveAdapter(context.Background(), "a", outside, true); !errors.Is(err, storage.ErrBadKey) {
		t.Fatalf("save of a path outside the gateway's data directory: %v", err)
	}
	if err := c.SaveAdapter(context.Background(), "a", filepath.Join(data, "state", "run@1"), true); err != nil {
		t.Fatal(err)
	}
	if len(f.saves) != 1 || f.saves[0] != filepath.Join(data, "state", "run@1") {
		t.Fatalf("saves %v", f.saves)
	}
}
