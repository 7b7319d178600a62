package gateway

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/engine"
	"github.com/skein-ai/skein/replica"
)

// batchCompute is a fake engine for the sample batcher: it records the size of every
// SampleBatch call and answers each request with one token, the request's first prompt token.
type batchCompute struct {
	mu      sync.Mutex
	batches map[string][]int // adapter id -> the size of each SampleBatch call
}

func (b *batchCompute) Info() engine.ModelInfo {
	return engine.ModelInfo{Config: &engine.Config{VocabSize: 64, MaxPositionEmbeddings: 64}, MaxRank: 8}
}
func (b *batchCompute) HasAdapter(context.Context, string) bool                     { return true }
func (b *batchCompute) AdapterIDs(context.Context) []string                         { return nil }
func (b *batchCompute) TrainingAdapterIDs(context.Context) []string                 { return nil }
func (b *batchCompute) CreateLora(context.Context, string, engine.LoraConfig) error { return nil }
func (b *batchCompute) LoadAdapter(context.Context, string, string, bool) error     { return nil }
func (b *batchCompute) LoadSnapshot(context.Context, string, string) error          { return nil }
func (b *batchCompute) SaveAdapter(context.Context, string, string, bool) error     { return nil }
func (b *batchCompute) DeleteAdapter(context.Context, string) bool                  { return true }
func (b *batchCompute) AdapterInfo(context.Context, string) (engine.LoraConfig, int, error) {
	return engine.LoraConfig{Rank: 1}, 0, nil
}
func (b *batchCompute) Forward(context.Context, string, []engine.Datum, string, map[string]float64) (*engine.ForwardResult, error) {
	return &engine.ForwardResult{}, nil
}
func (b *batchCompute) ForwardBackward(context.Context, string, []engine.Datum, string, map[string]float64) (*engine.ForwardResult, error) {
	return &engine.ForwardResult{}, nil
}
func (b *batchCompute) OptimStep(context.Context, string, engine.AdamParams) (map[string]float64, error) {
	return map[string]float64{}, nil
}
func (b *batchCompute) SampleBatch(_ context.Context, id string, reqs []engine.SampleRequest) ([]*engine.SampleResult, error) {
	b.mu.Lock()
	b.batches[id] = append(b.batches[id], len(reqs))
	b.mu.Unlock()
	out := make([]*engine.SampleResult, len(reqs))
	for i, r := range reqs {
		out[i] = &engine.SampleResult{Sequences: []engine.SampledSequence{{Tokens: r.Prompt[:1], Logprobs: []float64{-1}, StopReason: "length"}}}
	}
	return out, nil
}

// Sampling requests that wait while their replica is busy go out together: one SampleBatch per
// set of weights, holding every request queued for them, each answered with its own result. A
// replica's sampling queue is bounded: full once MaxQueuedSamples wait, free again once they ran.
func TestSampleBatcherBatchesWaitingRequests(t *testing.T) {
	fc := &batchCompute{batches: map[string][]int{}}
	rep := replica.New("r0", "base", fc, 0)
	s, err := New(Options{DataDir: t.TempDir(), MaxQueuedSamples: 5}, rep)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(); rep.Close() })

	block := make(chan struct{})
	if err := rep.Run(func() { <-block }); err != nil { // the replica is busy
		t.Fatal(err)
	}
	samplers := map[string]*sampler{
		"":  {tenant: "t", baseModel: "base"},                        // the base model
		"x": {tenant: "t", baseModel: "base", engineID: "sampler:x"}, // a tenant's snapshot
	}
	plan := []string{"", "x", "", "", "x"} // which weights each request samples
	var futures []*future
	for i, which := range plan {
		if s.samplingBusy(rep) {
			t.Fatalf("the queue was full with %d of 5 waiting", i)
		}
		f, _, err := s.futures.create("t", "Sample", "")
		if err != nil {
			t.Fatal(err)
		}
		req := engine.SampleRequest{Prompt: []int{10 + i, 1}, NumSamples: 1, Params: engine.SampleParams{MaxTokens: 1}}
		if err := s.enqueueSample(rep, samplers[which], req, f); err != nil {
			t.Fatal(err)
		}
		futures = append(futures, f)
	}
	if !s.samplingBusy(rep) {
		t.Fatal("the queue was not full with 5 of 5 waiting")
	}
	close(block)
	for i, f := range futures {
		if !s.futures.wait(f, time.Minute, nil) { // a bound for a hung test, not a timing assertion
			t.Fatalf("request %d was never answered", i)
		}
		res, ok := f.result.(*api.SampleResponse)
		if !ok || len(res.Sequences) != 1 || res.Sequences[0].Tokens[0] != 10+i {
			t.Fatalf("request %d got %#v (err %q), want its own first prompt token", i, f.result, f.errMsg)
		}
	}
	fc.mu.Lock()
	defer fc.mu.Unlock()
	if !slices.Equal(fc.batches[""], []int{3}) || !slices.Equal(fc.batches["sampler:x"], []int{2}) {
		t.Fatalf("batches %v, want one of 3 on the base model and one of 2 on sampler:x", fc.batches)
	}
	if s.samplingBusy(rep) {
		t.Fatal("the queue stayed full after its requests ran")
	}
}
