package engine

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
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
	res, err := e.SampleBatch(context.Background(), "nan", []SampleRequest{{Prompt: []int{1, 2}, NumSamples: 2}, {Prompt: []int{4}}})
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

// adapterBits is every number an adapter holds, as bits: weights, accumulated gradients, Adam
// moments, and the step count.
func adapterBits(a *Adapter) []uint64 {
	out := []uint64{uint64(a.Step)}
	if a.pendingGrads {
		out = append(out, 1)
	}
	for _, p := range a.params {
		for _, s := range [][]float64{p.float64s('w'), p.float64s('g'), p.float64s('m'), p.float64s('v')} {
			for _, v := range s {
				out = append(out, math.Float64bits(v))
			}
		}
	}
	return out
}

// numbersEngine is a tiny engine with an adapter that has trained one step and holds
// accumulated gradients, so every part of its state is non-trivial.
func numbersEngine(t *testing.T) (*Engine, *Adapter, []int) {
	t.Helper()
	e := loadTiny(t, ArchQwen3, Options{})
	a := adapterWithB(t, e, "a", LoraConfig{Rank: 2, TrainAttn: true, TrainMLP: true}, func(i, j int) float64 { return 0.01 * float64((i+j)%7-3) })
	ids := []int{5, 9, 2, 7, 3, 8}
	trainSteps(t, e, "a", ids, 1)
	if _, err := e.ForwardBackward(context.Background(), "a", []Datum{textDatum(ids)}, "cross_entropy", nil); err != nil {
		t.Fatal(err)
	}
	return e, a, ids
}

// Optimizer parameters that would make the weights NaN or infinite are refused as the user's
// fault, and the adapter (weights, gradients, moments, step) is exactly as before, bit for bit.
func TestOptimStepRefusesNonFiniteUpdates(t *testing.T) {
	e, a, _ := numbersEngine(t)
	good := DefaultAdamParams()
	with := func(f func(p *AdamParams)) AdamParams { p := good; f(&p); return p }
	cases := []struct {
		name string
		p    AdamParams
	}{
		{"eps 0", with(func(p *AdamParams) { p.Eps = 0 })},
		{"negative eps", with(func(p *AdamParams) { p.Eps = -1e-8 })},
		{"beta2 1", with(func(p *AdamParams) { p.Beta2 = 1 })},
		{"decay past the weights", with(func(p *AdamParams) { p.LearningRate, p.WeightDecay = 0.5, 3 })},
		{"update overflows", with(func(p *AdamParams) { p.LearningRate = 1e300 })},
		{"Inf clip", with(func(p *AdamParams) { p.GradClipNorm = math.Inf(1) })},
	}
	before := adapterBits(a)
	for _, c := range cases {
		_, err := e.OptimStep(context.Background(), "a", c.p)
		if !errors.Is(err, ErrInvalidInput) {
			t.Fatalf("%s: want a user error, got %v", c.name, err)
		}
		if !slices.Equal(before, adapterBits(a)) {
			t.Fatalf("%s: the refused step changed the adapter", c.name)
		}
	}
	if _, err := e.OptimStep(context.Background(), "a", good); err != nil {
		t.Fatalf("a good step after refused ones: %v", err)
	}
	for _, p := range a.params {
		for _, v := range p.float64s('w') {
			if math.IsNaN(v) || math.IsInf(v, 0) {
				t.Fatal("non-finite weight after a good step")
			}
		}
	}
}

// A batch whose loss or gradients are not finite is refused as the user's fault and adds
// nothing to the accumulated gradients; forward refuses it too rather than answer NaN.
func TestNonFiniteLossIsRefused(t *testing.T) {
	e, a, ids := numbersEngine(t)
	huge := func(d Datum, name string, v float64) Datum {
		in := d.Inputs[name]
		in.Data = append([]float64(nil), in.Data...)
		for i := range in.Data {
			in.Data[i] = v
		}
		d.Inputs[name] = in
		return d
	}
	cases := []struct {
		name, loss string
		d          Datum
	}{
		// exp(lp − q) overflows for a sampling logprob of -1e30.
		{"ratio overflows", "importance_sampling", huge(rlDatum(ids, -1, 1), "logprobs", -1e30)},
		// PPO clips an overflowing ratio when the advantage is positive; not when it is negative.
		{"ppo ratio overflows", "ppo", huge(huge(rlDatum(ids, -1, 1), "logprobs", -1e30), "advantages", -1)},
		// float32 gradients overflow for weights near float32's largest.
		{"loss overflows float32", "cross_entropy", huge(textDatum(ids), "weights", 3e38)},
		{"weight beyond float32", "cross_entropy", huge(textDatum(ids), "weights", 1e300)},
	}
	check := func(when string) {
		t.Helper()
		before := adapterBits(a)
		for _, c := range cases {
			ok := textDatum(ids)
			if c.loss != "cross_entropy" {
				ok = rlDatum(ids, -1, 1)
			}
			for _, backward := range []bool{true, false} {
				var err error
				if backward {
					_, err = e.ForwardBackward(context.Background(), "a", []Datum{ok, c.d}, c.loss, nil)
				} else {
					_, err = e.Forward(context.Background(), "a", []Datum{ok, c.d}, c.loss, nil)
				}
				if !errors.Is(err, ErrInvalidInput) {
					t.Fatalf("%s, %s (backward %v): want a user error, got %v", when, c.name, backward, err)
				}
				if !slices.Equal(before, adapterBits(a)) {
					t.Fatalf("%s, %s (backward %v): the refused batch changed the adapter", when, c.name, backward)
				}
			}
		}
	}
	// Gradients pending (summed beside the accumulator), and none (summed into it in place).
	check("gradients pending")
	if _, err := e.OptimStep(context.Background(), "a", DefaultAdamParams()); err != nil {
		t.Fatal(err)
	}
	check("accumulator zero")
}

// Loss parameters outside their meaning are refused: negative ratio clips, a negative DRO beta.
func TestLossConfigRanges(t *testing.T) {
	c := &Config{VocabSize: 100, MaxPositionEmbeddings: 64}
	d := []Datum{rlDatum([]int{1, 2, 3, 4}, -1, 1)}
	for _, tc := range []struct {
		loss string
		cfg  map[string]float64
	}{
		{"ppo", map[string]float64{"clip_low_threshold": -0.5}},
		{"cispo", map[string]float64{"clip_low_threshold": -1, "clip_high_threshold": -0.5}},
		{"dro", map[string]float64{"beta": -0.1}},
	} {
		if _, err := prepareFor(c, d, tc.loss, tc.cfg); !errors.Is(err, ErrInvalidInput) {
			t.Fatalf("%s %v: want a user error, got %v", tc.loss, tc.cfg, err)
		}
	}
	if _, err := prepareFor(c, d, "dro", map[string]float64{"beta": 0}); err != nil {
		t.Fatalf("beta 0: %v", err)
	}
}
