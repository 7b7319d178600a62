package engine

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// terminates runs fn and fails the test if it never returns: the property under test is that a
// loop ends at all, so the guard is generous and says nothing about speed.
func terminates(t *testing.T, what string, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn()
	}()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatalf("%s: did not return (an unbounded loop)", what)
	}
}

// The candidate search ends for every input: NaN log-probabilities, -Inf ones with a top-k
// larger than the finite tokens, and a top-p that float sums never quite reach.
func TestCandidatesAlwaysEnd(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	smooth := make([]float64, 5000)
	for i := range smooth {
		smooth[i] = rng.NormFloat64() * 0.01
	}
	cases := []struct {
		name string
		lp   []float64
		topK int
		topP float64
	}{
		{"NaN", []float64{math.NaN(), math.NaN(), math.NaN()}, 2, 1},
		{"NaN top-p", []float64{math.NaN(), -1, math.NaN()}, -1, 0.5},
		{"-Inf beyond top-k", []float64{0, math.Inf(-1), math.Inf(-1)}, 2, 1},
		{"top-p just under 1", logSoftmax(smooth), -1, math.Nextafter(1, 0)},
	}
	for _, c := range cases {
		var got []int
		terminates(t, c.name, func() { got = candidates(c.lp, c.topK, c.topP) })
		if len(got) == 0 || len(got) > len(c.lp) {
			t.Fatalf("%s: %d candidates of %d", c.name, len(got), len(c.lp))
		}
	}
}

// Extreme temperatures are computed, not turned into NaN: a vanishing temperature is a greedy
// draw, a huge one a nearly uniform one, and both finish with a top-k or top-p in force.
func TestExtremeTemperaturesSample(t *testing.T) {
	logits := []float64{0.5, 3, -2, 2.9, 1}
	for _, temp := range []float64{math.SmallestNonzeroFloat64, 1e-300, 1e-30, 1e30, math.MaxFloat64} {
		for _, p := range []SampleParams{{TopK: 2, TopP: 1}, {TopK: -1, TopP: 0.5}, {TopK: -1, TopP: 1}} {
			p.Temperature = temp
			rng := rand.New(rand.NewPCG(3, 4))
			var tok int
			var lp float64
			var err error
			terminates(t, "sampleToken", func() { tok, lp, err = sampleToken(logits, p, rng) })
			if err != nil {
				t.Fatalf("temperature %v %+v: %v", temp, p, err)
			}
			if tok < 0 || tok >= len(logits) || math.IsNaN(lp) || math.IsInf(lp, 0) {
				t.Fatalf("temperature %v %+v: token %d logprob %v", temp, p, tok, lp)
			}
			if temp < 1e-20 && tok != 1 {
				t.Fatalf("temperature %v %+v: drew %d, want the argmax 1", temp, p, tok)
			}
		}
	}
}

// Non-finite logits are an error for the draw, whatever the parameters.
func TestNonFiniteLogitsAreAnError(t *testing.T) {
	for _, bad := range []float64{math.NaN(), math.Inf(1), math.Inf(-1)} {
		for _, p := range []SampleParams{{Temperature: 0}, {Temperature: 1, TopK: -1, TopP: 1}, {Temperature: 0.7, TopK: 3, TopP: 0.9}} {
			rng := rand.New(rand.NewPCG(5, 6))
			var err error
			terminates(t, "sampleToken", func() { _, _, err = sampleToken([]float64{1, bad, 2, 0}, p, rng) })
			if !errors.Is(err, ErrNonFinite) {
				t.Fatalf("logit %v %+v: want ErrNonFinite, got %v", bad, p, err)
			}
		}
	}
}

// An adapter whose weights are NaN makes its own requests fail with an error; the replica
// goes on serving (here: the base model, on the same engine).
func TestNaNAdapterFailsItsSamplesOnly(t *testing.T) {
	e := loadTiny(t, ArchQwen3, Options{})
	adapterWithB(t, e, "nan", LoraConfig{Rank: 2, TrainAttn: true, TrainMLP: true}, func(int, int) float64 { return math.NaN() })
	for _, p := range []SampleParams{{MaxTokens: 3}, {MaxTokens: 3, Temperature: 1, TopK: 5, TopP: 1}, {MaxTokens: 3, Temperature: 1, TopP: 0.9}} {
		var err error
		terminates(t, "Sample", func() {
			_, err = e.Sample("nan", SampleRequest{Prompt: []int{1, 2, 3}, Params: p, PromptLogprobs: true})
		})
		if !errors.Is(err, ErrNonFinite) {
			t.Fatalf("%+v: want ErrNonFinite, got %v", p, err)
		}
	}
	res, err := e.SampleBatch("nan", []SampleRequest{{Prompt: []int{1, 2}, NumSamples: 2}, {Prompt: []int{4}}})
	if err != nil {
		t.Fatalf("a batch reports failures per request, got %v", err)
	}
	for i, r := range res {
		if !errors.Is(r.Err, ErrNonFinite) || len(r.Sequences) != 0 {
			t.Fatalf("request %d: err %v, %d sequences", i, r.Err, len(r.Sequences))
		}
	}
	if _, err := e.Sample("", SampleRequest{Prompt: []int{1, 2, 3}, Params: SampleParams{MaxTokens: 2, Temperature: 1, TopK: 5}}); err != nil {
		t.Fatalf("base model after a failed sample: %v", err)
	}
}

// Sampling parameters that would become unbounded work are refused before anything runs: long
// or many stop sequences, and top-k prompt logprobs beyond what a caller can use.
func TestValidateSampleBoundsLists(t *testing.T) {
	m := ModelInfo{Config: &Config{VocabSize: 1000, MaxPositionEmbeddings: 64}, HasTokenizer: true}
	many := make([]string, MaxStopSequences+1)
	for i := range many {
		many[i] = "x"
	}
	cases := []struct {
		name, field string
		mut         func(r *SampleRequest)
	}{
		{"many stop strings", "sampling_params.stop", func(r *SampleRequest) { r.Params.StopStrings = many }},
		{"many stop tokens", "sampling_params.stop", func(r *SampleRequest) { r.Params.StopTokens = make([]int, MaxStopSequences+1) }},
		{"long stop string", "sampling_params.stop", func(r *SampleRequest) {
			r.Params.StopStrings = []string{string(make([]byte, MaxStopStringBytes+1))}
		}},
		{"top-k prompt logprobs", "topk_prompt_logprobs", func(r *SampleRequest) { r.TopKPromptLogprobs = MaxTopKPromptLogprobs + 1 }},
		{"top_p above 1", "sampling_params.top_p", func(r *SampleRequest) { r.Params.TopP = math.Nextafter(1, 2) }},
		{"Inf temperature", "sampling_params.temperature", func(r *SampleRequest) { r.Params.Temperature = math.Inf(1) }},
	}
	for _, c := range cases {
		r := SampleRequest{Prompt: []int{1, 2}, Params: SampleParams{Temperature: 1, TopK: -1, TopP: 1}}
		c.mut(&r)
		var ie *InputError
		if err := m.ValidateSample(&r); !errors.As(err, &ie) || ie.Field != c.field {
			t.Fatalf("%s: want an InputError on %s, got %v", c.name, c.field, err)
		}
	}
	ok := SampleRequest{Prompt: []int{1, 2}, TopKPromptLogprobs: MaxTopKPromptLogprobs,
		Params: SampleParams{StopStrings: many[:MaxStopSequences], Temperature: 1, TopK: -1, TopP: 1}}
	if err := m.ValidateSample(&ok); err != nil {
		t.Fatalf("limits themselves are allowed: %v", err)
	}
}
