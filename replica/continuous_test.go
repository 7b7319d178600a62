package replica

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/skein-ai/skein/engine"
)

// tinyEngine is a real tiny Qwen3, for the continuous loop (a fake compute runs whole batches).
func tinyEngine(t testing.TB) *engine.Engine {
	t.Helper()
	dir := t.TempDir()
	if err := engine.InitTiny(dir, engine.ArchQwen3, "tiny", 1); err != nil {
		t.Fatal(err)
	}
	e, err := engine.Load(dir, engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// outcomes records sampling answers, in the order they came.
type outcomes struct {
	mu    sync.Mutex
	order []string
	got   map[string]SampleOutcome
	done  chan string
}

func newOutcomes() *outcomes {
	return &outcomes{got: map[string]SampleOutcome{}, done: make(chan string, 16)}
}

func (o *outcomes) job(name string, req engine.SampleRequest) SampleJob {
	return SampleJob{Req: req, Done: func(out SampleOutcome) {
		o.mu.Lock()
		o.order = append(o.order, name)
		o.got[name] = out
		o.mu.Unlock()
		o.done <- name
	}}
}

func (o *outcomes) wait(t *testing.T, n int) {
	t.Helper()
	for range n {
		select {
		case <-o.done:
		case <-time.After(2 * time.Minute):
			t.Fatal("a sampling request was never answered")
		}
	}
}

// Continuous batching on an in-process replica (issue 39 item 3): a request that arrives while
// a batch decodes joins its loop (one batch in the statistics, not a second one run inside the
// first), is answered when its own samples end, before the longer request it joined, and draws
// what it draws sampled alone. Once other work waits on the replica the loop takes no one else:
// that work runs before a later sample, which gets a batch of its own.
func TestSamplesJoinTheRunningLoop(t *testing.T) {
	e := tinyEngine(t)
	r := New("r", "m", e, 2)
	r.SetContinuousBatching(true)
	defer r.Close()
	seed := int64(3)
	long := engine.SampleRequest{Prompt: []int{5, 6, 7, 8, 9}, NumSamples: 2, Params: engine.SampleParams{MaxTokens: 40, Temperature: 1, Seed: &seed}}
	short := engine.SampleRequest{Prompt: []int{11, 12, 13}, NumSamples: 3, Params: engine.SampleParams{MaxTokens: 4, Temperature: 1, Seed: &seed}}
	later := engine.SampleRequest{Prompt: []int{21, 22}, NumSamples: 1, Params: engine.SampleParams{MaxTokens: 3}}
	tuned := engine.SampleRequest{Prompt: []int{31, 32, 33, 34}, NumSamples: 1, Params: engine.SampleParams{MaxTokens: 5, Temperature: 1, Seed: &seed}}
	// A sampler copy of a trained adapter, saved: not in memory until a request reads it.
	if _, err := e.CreateAdapter("a", engine.LoraConfig{Rank: 4, Seed: 1, TrainAttn: true, TrainMLP: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.ForwardBackward(context.Background(), "a", []engine.Datum{textDatum(40)}, "cross_entropy", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := e.OptimStep(context.Background(), "a", engine.AdamParams{LearningRate: 1e-2, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8}); err != nil {
		t.Fatal(err)
	}
	saved := t.TempDir()
	if err := e.SaveAdapter(context.Background(), "a", saved, false); err != nil {
		t.Fatal(err)
	}
	for _, q := range []*engine.SampleRequest{&long, &short, &later, &tuned} {
		if err := e.Info().ValidateSample(q); err != nil {
			t.Fatal(err)
		}
	}
	o := newOutcomes()
	var atAnswer SamplingStats
	first := long
	tokens := 0
	first.OnToken = func(sample, token int, lp float64) bool {
		if sample != 0 {
			return true
		}
		switch tokens++; tokens {
		case 2:
			if err := r.Sample(Weights{Lane: "b"}, o.job("short", short)); err != nil {
				t.Error(err)
			}
		case 6:
			if err := r.Sample(Weights{ID: "sampler:a", Dir: saved, Lane: "d"}, o.job("tuned", tuned)); err != nil {
				t.Error(err)
			}
		case 12:
			_ = r.RunIn("trainer", func() { o.mu.Lock(); o.order = append(o.order, "op"); o.mu.Unlock() })
			// The statistics as the last request is answered already count it: a client reading
			// them after its answer sees its own request.
			job := o.job("later", later)
			done := job.Done
			job.Done = func(out SampleOutcome) { atAnswer = r.SamplingStats(); done(out) }
			if err := r.Sample(Weights{Lane: "c"}, job); err != nil {
				t.Error(err)
			}
		}
		return true
	}
	if err := r.Sample(Weights{Lane: "a"}, o.job("long", first)); err != nil {
		t.Fatal(err)
	}
	o.wait(t, 4)
	o.mu.Lock()
	defer o.mu.Unlock()
	if !slices.Equal(o.order, []string{"short", "tuned", "long", "op", "later"}) {
		t.Fatalf("answered in the order %v, want the joined short and tuned requests first, then the long one, the waiting op, and the later request", o.order)
	}
	if st := atAnswer; st.Batches != 2 || st.Rows != 2+3+1+1 || st.Adapters != 3 {
		t.Fatalf("stats %+v: want the short and tuned requests in the long one's loop (2 batches, 7 rows)", st)
	}
	if !r.HoldsCopy("sampler:a") {
		t.Fatal("the sampler copy loaded as its request joined is not kept")
	}
	tuned.Adapter = "sampler:a"
	for name, req := range map[string]engine.SampleRequest{"long": long, "short": short, "later": later, "tuned": tuned} {
		out := o.got[name]
		if out.Err != nil {
			t.Fatalf("%s: %v", name, out.Err)
		}
		alone, err := e.Sample("", req)
		if err != nil {
			t.Fatal(err)
		}
		for s, seq := range alone.Sequences {
			if !slices.Equal(seq.Tokens, out.Result.Sequences[s].Tokens) {
				t.Fatalf("%s sample %d: %v in the loop, %v alone", name, s, out.Result.Sequences[s].Tokens, seq.Tokens)
			}
		}
	}
}

// textDatum is a next-token datum of n tokens.
func textDatum(n int) engine.Datum {
	toks, tgts, ws := make([]int, n), make([]float64, n), make([]float64, n)
	for i := range n {
		toks[i], tgts[i], ws[i] = (i*7)%50+3, float64(((i+1)*7)%50+3), 1
	}
	return engine.Datum{Tokens: toks, Inputs: map[string]engine.TensorInput{
		"target_tokens": {DType: "int64", Data: tgts}, "weights": {DType: "float32", Data: ws}}}
}

// panickyLoop is a compute whose continuous loop panics after answering its first request.
type panickyLoop struct{ *fakeCompute }

func (p panickyLoop) SampleContinuous(_ context.Context, first []engine.FedRequest, _ func(int) []engine.FedRequest) error {
	first[0].Done(&engine.SampleResult{}, nil)
	var none []int
	return first[len(none)+5].Ctx.Err() // index out of range
}

// A panic in a continuous loop answers every request it had taken and not answered with the
// panic (none is left pending), and the replica goes on.
func TestAPanickingLoopAnswersItsRequests(t *testing.T) {
	r := New("r", "m", panickyLoop{newFake()}, 2)
	r.SetContinuousBatching(true)
	defer r.Close()
	block := make(chan struct{})
	_ = r.Run(func() { <-block }) // the requests queue up and go out in one loop
	got := make(answers, 3)
	for i := range 3 {
		if err := r.Sample(Weights{Lane: "a"}, got.job(i, 10+i)); err != nil {
			t.Fatal(err)
		}
	}
	close(block)
	panics := 0
	for range 3 {
		select {
		case a := <-got:
			var pe *PanicError
			if errors.As(a.o.Err, &pe) {
				panics++
			} else if a.i != 0 || a.o.Err != nil {
				t.Fatalf("request %d answered %+v", a.i, a.o)
			}
		case <-time.After(time.Minute):
			t.Fatal("a request of the panicking loop was never answered")
		}
	}
	if panics != 2 {
		t.Fatalf("%d requests answered with the panic, want the 2 not answered before it", panics)
	}
	if err := r.Do(context.Background(), func() {}); err != nil {
		t.Fatalf("the replica after the panic: %v", err)
	}
}
