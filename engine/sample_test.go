package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/skein-ai/skein/safetensors"
)

func trainSteps(t *testing.T, e *Engine, id string, ids []int, steps int) {
	t.Helper()
	p := DefaultAdamParams()
	p.LearningRate = 1e-2
	for range steps {
		if _, err := e.ForwardBackward(context.Background(), id, []Datum{textDatum(ids)}, "cross_entropy", nil); err != nil {
			t.Fatal(err)
		}
		if _, err := e.OptimStep(context.Background(), id, p); err != nil {
			t.Fatal(err)
		}
	}
}

// The KV-cache sampler and the training forward pass are one model: the logprobs the sampler
// reports for its tokens equal those forward computes for the same sequence.
func TestSampleLogprobsMatchForwardAndAreReproducible(t *testing.T) {
	for _, arch := range []Arch{ArchLlama, ArchQwen2, ArchQwen3, ArchQwen3_5, ArchQwen3MoE, ArchQwen3_5MoE} {
		t.Run(string(arch), func(t *testing.T) {
			e := loadTiny(t, arch, Options{})
			prompt := e.Tokenizer.Encode("The quick brown fox")
			seed := int64(7)
			req := SampleRequest{Prompt: prompt, NumSamples: 3, PromptLogprobs: true,
				Params: SampleParams{MaxTokens: 12, Temperature: 1, TopK: -1, TopP: 1, Seed: &seed}}
			r1, err := e.Sample("", req)
			if err != nil {
				t.Fatal(err)
			}
			r2, err := e.Sample("", req)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(r1.Sequences, r2.Sequences) {
				t.Fatal("same seed gave different samples")
			}
			if reflect.DeepEqual(r1.Sequences[0].Tokens, r1.Sequences[1].Tokens) {
				t.Fatal("two samples of one request are identical: rows share a random stream")
			}
			for _, s := range r1.Sequences {
				full := append(append([]int{}, prompt...), s.Tokens...)
				fwd, err := e.Forward(context.Background(), "", []Datum{textDatum(full)}, "cross_entropy", nil)
				if err != nil {
					t.Fatal(err)
				}
				lp := fwd.Logprobs[0]
				for i, want := range s.Logprobs {
					got := lp[len(prompt)-1+i]
					if math.Abs(got-want) > 2e-3 {
						t.Fatalf("token %d: sampler logprob %.5f, forward %.5f", i, want, got)
					}
				}
				for i := 1; i < len(prompt); i++ {
					if math.Abs(r1.PromptLogprobs[i]-lp[i-1]) > 2e-3 {
						t.Fatalf("prompt token %d: %.5f vs forward %.5f", i, r1.PromptLogprobs[i], lp[i-1])
					}
				}
			}
			if !math.IsNaN(r1.PromptLogprobs[0]) {
				t.Fatal("first prompt logprob must be NaN")
			}
		})
	}
}

func TestGreedySamplingFollowsTraining(t *testing.T) {
	e := loadTiny(t, ArchQwen2, Options{})
	text := "The river flows past the mill, under the old stone bridge"
	ids := e.Tokenizer.Encode(text)
	if _, err := e.CreateAdapter("a", LoraConfig{Rank: 8, TrainAttn: true, TrainMLP: true, TrainUnembed: true}); err != nil {
		t.Fatal(err)
	}
	trainSteps(t, e, "a", ids, 40)
	req := SampleRequest{Prompt: ids[:3], Params: SampleParams{MaxTokens: len(ids) - 3, Temperature: 0}}
	r, err := e.Sample("a", req)
	if err != nil {
		t.Fatal(err)
	}
	if got := e.Tokenizer.Decode(append(ids[:3:3], r.Sequences[0].Tokens...)); got != text {
		t.Fatalf("greedy sample after memorising: %q, want %q", got, text)
	}
	if r.Sequences[0].StopReason != "length" {
		t.Fatalf("stop reason %q", r.Sequences[0].StopReason)
	}
	// Stop strings and stop tokens end the sequence with reason "stop".
	req.Params.StopStrings = []string{"mill"}
	r, err = e.Sample("a", req)
	if err != nil {
		t.Fatal(err)
	}
	s := r.Sequences[0]
	prefix := e.Tokenizer.Decode(ids[:3])
	want := text[len(prefix) : strings.Index(text, "mill")+len("mill")]
	if s.StopReason != "stop" || e.Tokenizer.Decode(s.Tokens) != want {
		t.Fatalf("stop string: %q (%s)", e.Tokenizer.Decode(s.Tokens), s.StopReason)
	}
	req.Params.StopStrings = nil
	req.Params.StopTokens = []int{ids[5]}
	r, err = e.Sample("a", req)
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Sequences[0].Tokens; len(got) != 3 || got[2] != ids[5] || r.Sequences[0].StopReason != "stop" {
		t.Fatalf("stop token: %v", got)
	}
}

// Training adapter A changes neither adapter B's outputs nor the base model's.
func TestAdaptersAreIsolated(t *testing.T) {
	e := loadTiny(t, ArchLlama, Options{})
	ids := e.Tokenizer.Encode("Many users can fine-tune their own adapters.")
	cfg := LoraConfig{Rank: 4, Seed: 1, TrainAttn: true, TrainMLP: true, TrainUnembed: true}
	for _, id := range []string{"A", "B"} {
		if _, err := e.CreateAdapter(id, cfg); err != nil {
			t.Fatal(err)
		}
	}
	trainSteps(t, e, "B", ids, 2) // give B non-zero weights of its own
	probe := []Datum{textDatum(ids)}
	before := map[string][]float64{}
	for _, id := range []string{"", "B"} {
		r, err := e.Forward(context.Background(), id, probe, "cross_entropy", nil)
		if err != nil {
			t.Fatal(err)
		}
		before[id] = r.Logprobs[0]
	}
	a0, _ := e.Forward(context.Background(), "A", probe, "cross_entropy", nil)
	trainSteps(t, e, "A", ids, 5)
	a1, _ := e.Forward(context.Background(), "A", probe, "cross_entropy", nil)
	if reflect.DeepEqual(a0.Logprobs, a1.Logprobs) {
		t.Fatal("training A did not change A")
	}
	for _, id := range []string{"", "B"} {
		r, err := e.Forward(context.Background(), id, probe, "cross_entropy", nil)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(before[id], r.Logprobs[0]) {
			t.Fatalf("training A changed model %q", id)
		}
	}
}

func TestSaveLoadRoundTrip(t *testing.T) {
	e := loadTiny(t, ArchQwen3, Options{})
	ids := e.Tokenizer.Encode("Good software is small, clear and tested.")
	if _, err := e.CreateAdapter("a", LoraConfig{Rank: 4, Seed: 2, TrainAttn: true, TrainMLP: true}); err != nil {
		t.Fatal(err)
	}
	trainSteps(t, e, "a", ids, 3)
	// A pending gradient must survive too.
	if _, err := e.ForwardBackward(context.Background(), "a", []Datum{textDatum(ids)}, "cross_entropy", nil); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := e.SaveAdapter(context.Background(), "a", dir, true); err != nil {
		t.Fatal(err)
	}
	samplerDir := t.TempDir()
	if err := e.SaveAdapter(context.Background(), "a", samplerDir, false); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(samplerDir, OptimizerFile)); !os.IsNotExist(err) {
		t.Fatal("sampler-only save wrote optimizer state")
	}
	if err := e.LoadAdapter(context.Background(), "b", samplerDir, true); !errors.Is(err, ErrNoOptimizerState) {
		t.Fatalf("loading optimizer from a sampler save: %v", err)
	}
	if err := e.LoadAdapter(context.Background(), "b", dir, true); err != nil {
		t.Fatal(err)
	}
	a, _ := e.adapter("a")
	b, _ := e.adapter("b")
	if a.Step != b.Step || a.Step != 3 {
		t.Fatalf("steps %d and %d", a.Step, b.Step)
	}
	for i := range a.params {
		pa, pb := a.params[i], b.params[i]
		if !reflect.DeepEqual(pa.float64s('w'), pb.float64s('w')) || !reflect.DeepEqual(pa.float64s('m'), pb.float64s('m')) || !reflect.DeepEqual(pa.float64s('v'), pb.float64s('v')) || !reflect.DeepEqual(pa.float64s('g'), pb.float64s('g')) {
			t.Fatalf("%s differs after round trip", pa.name)
		}
	}
	// Identical state means identical futures: one more step on each gives the same weights.
	trainSteps(t, e, "a", ids, 1)
	trainSteps(t, e, "b", ids, 1)
	for i := range a.params {
		if !reflect.DeepEqual(a.params[i].float64s('w'), b.params[i].float64s('w')) {
			t.Fatalf("%s diverged after a step", a.params[i].name)
		}
	}
	cfg, err := ReadAdapterConfig(dir)
	if err != nil || cfg.Rank != 4 || !cfg.TrainAttn || !cfg.TrainMLP || cfg.TrainUnembed {
		t.Fatalf("adapter config %+v, %v", cfg, err)
	}
}

func TestBadInputChangesNothing(t *testing.T) {
	e := loadTiny(t, ArchQwen2, Options{})
	if _, err := e.CreateAdapter("a", LoraConfig{Rank: 4, TrainAttn: true}); err != nil {
		t.Fatal(err)
	}
	ids := e.Tokenizer.Encode("Every error should say what went wrong.")
	trainSteps(t, e, "a", ids, 1)
	good := textDatum(ids)
	if _, err := e.ForwardBackward(context.Background(), "a", []Datum{good}, "cross_entropy", nil); err != nil {
		t.Fatal(err)
	}
	a, _ := e.adapter("a")
	snapshot := func() [][]float64 {
		var s [][]float64
		for _, p := range a.params {
			s = append(s, append([]float64(nil), p.float64s('w')...), append([]float64(nil), p.float64s('g')...), append([]float64(nil), p.float64s('m')...))
		}
		return s
	}
	before := snapshot()
	with := func(mut func(d *Datum)) []Datum {
		d := textDatum(ids)
		mut(&d)
		return []Datum{good, d}
	}
	V := e.Config.VocabSize
	long := make([]int, e.Config.MaxPositionEmbeddings+2)
	cases := []struct {
		name, loss, field string
		data              []Datum
		cfg               map[string]float64
	}{
		{"token id ≥ vocab", "cross_entropy", "model_input", with(func(d *Datum) { d.Tokens[2] = V }), nil},
		{"negative target", "cross_entropy", "loss_fn_inputs.target_tokens", with(func(d *Datum) { d.Inputs["target_tokens"].Data[0] = -1 }), nil},
		{"short weights", "cross_entropy", "loss_fn_inputs.weights", with(func(d *Datum) {
			d.Inputs["weights"] = TensorInput{DType: "float32", Data: []float64{1}}
		}), nil},
		{"float targets", "cross_entropy", "loss_fn_inputs.target_tokens", with(func(d *Datum) {
			tt := d.Inputs["target_tokens"]
			tt.DType = "float32"
			d.Inputs["target_tokens"] = tt
		}), nil},
		{"NaN weight", "cross_entropy", "loss_fn_inputs.weights", with(func(d *Datum) { d.Inputs["weights"].Data[1] = math.NaN() }), nil},
		{"Inf advantage", "importance_sampling", "loss_fn_inputs.advantages", []Datum{rlDatum(ids, -1, 1), func() Datum {
			d := rlDatum(ids, -1, 1)
			d.Inputs["advantages"].Data[0] = math.Inf(1)
			return d
		}()}, nil},
		{"missing advantages", "ppo", "loss_fn_inputs.advantages", []Datum{func() Datum {
			d := rlDatum(ids, -1, 1)
			delete(d.Inputs, "advantages")
			return d
		}()}, nil},
		{"unknown loss", "hinge", "loss_fn", []Datum{good}, nil},
		{"unknown config", "ppo", "loss_fn_config.temperature", []Datum{rlDatum(ids, -1, 1)}, map[string]float64{"temperature": 1}},
		{"empty batch", "cross_entropy", "data", nil, nil},
		{"too long", "cross_entropy", "model_input", []Datum{{Tokens: long, Inputs: map[string]TensorInput{
			"target_tokens": {DType: "int64", Data: make([]float64, len(long))}}}}, nil},
	}
	for _, c := range cases {
		_, err := e.ForwardBackward(context.Background(), "a", c.data, c.loss, c.cfg)
		var ie *InputError
		if !errors.As(err, &ie) || !errors.Is(err, ErrInvalidInput) {
			t.Fatalf("%s: want an InputError, got %v", c.name, err)
		}
		if ie.Field != c.field {
			t.Fatalf("%s: error names field %q, want %q (%v)", c.name, ie.Field, c.field, err)
		}
		if len(c.data) == 2 && ie.Datum != 1 {
			t.Fatalf("%s: error names datum %d, want 1", c.name, ie.Datum)
		}
	}
	if !reflect.DeepEqual(before, snapshot()) {
		t.Fatal("a rejected request changed the adapter")
	}
	for _, rank := range []int{0, -1, 129} {
		if _, err := e.CreateAdapter("r", LoraConfig{Rank: rank, TrainAttn: true}); !errors.Is(err, ErrInvalidInput) {
			t.Fatalf("rank %d: %v", rank, err)
		}
	}
	if _, err := e.Sample("a", SampleRequest{Prompt: make([]int, e.Config.MaxPositionEmbeddings)}); !errors.Is(err, ErrInvalidInput) {
		t.Fatalf("over-long prompt: %v", err)
	}
	if _, err := e.Sample("a", SampleRequest{Prompt: []int{V + 5}}); !errors.Is(err, ErrInvalidInput) {
		t.Fatalf("bad prompt token: %v", err)
	}
	if _, err := e.OptimStep(context.Background(), "a", AdamParams{LearningRate: math.NaN()}); !errors.Is(err, ErrInvalidInput) {
		t.Fatalf("NaN learning rate: %v", err)
	}
	if !reflect.DeepEqual(before, snapshot()) {
		t.Fatal("a rejected request changed the adapter")
	}
	if _, err := e.ForwardBackward(context.Background(), "nope", []Datum{good}, "cross_entropy", nil); !errors.Is(err, ErrUnknownAdapter) {
		t.Fatalf("unknown adapter: %v", err)
	}
}

// The cost of persisting an adapter's full state (weights, Adam moments, step), which the
// gateway does before acknowledging every optim_step. SKEIN_BENCH_MODEL picks the model
// (default: the tiny preset); rank 16 on attention and MLP.
func BenchmarkSaveAdapterState(b *testing.B) {
	dir := os.Getenv("SKEIN_BENCH_MODEL")
	if dir == "" {
		dir = tinyModel(b, ArchQwen2)
	}
	e, err := Load(dir, Options{})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := e.CreateAdapter("a", LoraConfig{Rank: 16, TrainAttn: true, TrainMLP: true}); err != nil {
		b.Fatal(err)
	}
	out := b.TempDir()
	b.ResetTimer()
	for i := range b.N {
		if err := e.SaveAdapter(context.Background(), "a", filepath.Join(out, fmt.Sprint(i%2)), true); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(fileSizes(filepath.Join(out, "0")))/1e6, "MB")
}

func fileSizes(dir string) int64 {
	var n int64
	entries, _ := os.ReadDir(dir)
	for _, en := range entries {
		if info, err := en.Info(); err == nil {
			n += info.Size()
		}
	}
	return n
}

// Weights may come as bf16 or f16, in shards named by model.safetensors.index.json: a model saved
// that way computes exactly what the same (rounded) weights in f32 compute.
func TestLoadsShardedHalfPrecisionWeights(t *testing.T) {
	src := tinyModel(t, ArchLlama)
	st, err := safetensors.ReadFile(filepath.Join(src, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	names := make([]string, 0, len(st.Tensors))
	for n := range st.Tensors {
		names = append(names, n)
	}
	sort.Strings(names)
	rounded := map[string]safetensors.Tensor{}
	shards := []map[string]safetensors.Tensor{{}, {}}
	index := map[string]string{}
	for i, n := range names {
		f, _ := st.Tensors[n].Float32()
		half := make([]byte, 2*len(f))
		r := make([]float32, len(f))
		for j, v := range f {
			b := uint16(math.Float32bits(v) >> 16) // truncating to bf16
			if i%2 == 1 {                          // odd tensors as f16 instead
				h := float32ToHalf(v)
				half[2*j], half[2*j+1] = byte(h), byte(h>>8)
				r[j] = halfToFloat32(h)
				continue
			}
			half[2*j], half[2*j+1] = byte(b), byte(b>>8)
			r[j] = math.Float32frombits(uint32(b) << 16)
		}
		dt := "BF16"
		if i%2 == 1 {
			dt = "F16"
		}
		shards[i%2][n] = safetensors.Tensor{DType: dt, Shape: st.Tensors[n].Shape, Data: half}
		index[n] = fmt.Sprintf("model-%05d-of-00002.safetensors", i%2+1)
		rounded[n] = safetensors.FromFloat32(r, st.Tensors[n].Shape...)
	}
	halfDir, f32Dir := t.TempDir(), t.TempDir()
	for _, d := range []string{halfDir, f32Dir} {
		for _, f := range []string{"config.json", "tokenizer.json"} {
			b, _ := os.ReadFile(filepath.Join(src, f))
			_ = os.WriteFile(filepath.Join(d, f), b, 0o644)
		}
	}
	for i, sh := range shards {
		if err := safetensors.WriteFile(filepath.Join(halfDir, fmt.Sprintf("model-%05d-of-00002.safetensors", i+1)), sh, nil); err != nil {
			t.Fatal(err)
		}
	}
	ib, _ := json.Marshal(map[string]any{"weight_map": index})
	_ = os.WriteFile(filepath.Join(halfDir, "model.safetensors.index.json"), ib, 0o644)
	if err := safetensors.WriteFile(filepath.Join(f32Dir, "model.safetensors"), rounded, nil); err != nil {
		t.Fatal(err)
	}
	var results [][]float64
	for _, d := range []string{halfDir, f32Dir} {
		e, err := Load(d, Options{})
		if err != nil {
			t.Fatal(err)
		}
		r, err := e.Forward(context.Background(), "", []Datum{textDatum([]int{5, 9, 13, 200, 7, 42})}, "cross_entropy", nil)
		if err != nil {
			t.Fatal(err)
		}
		results = append(results, r.Logprobs[0])
	}
	if !reflect.DeepEqual(results[0], results[1]) {
		t.Fatalf("half-precision shards %v, rounded f32 %v", results[0], results[1])
	}
}

func float32ToHalf(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int((b>>23)&0xff) - 127 + 15
	frac := b & 0x7fffff
	switch {
	case exp <= 0:
		return sign // flush tiny values to zero: enough for weights of this size
	case exp >= 31:
		return sign | 0x7c00
	}
	return sign | uint16(exp)<<10 | uint16(frac>>13)
}

func halfToFloat32(h uint16) float32 {
	t := safetensors.Tensor{DType: "F16", Shape: []int{1}, Data: []byte{byte(h), byte(h >> 8)}}
	v, _ := t.Float32()
	return v[0]
}

// Several requests decode in one batch (different prompts, lengths, parameters) and each gets
// what it would get alone.
func TestSampleBatchMatchesSeparateRequests(t *testing.T) {
	// qwen3_5: rows of different lengths each keep their own DeltaNet state.
	for _, arch := range []Arch{ArchQwen3, ArchQwen3_5, ArchQwen3MoE} {
		t.Run(string(arch), func(t *testing.T) { checkSampleBatch(t, arch) })
	}
}

func checkSampleBatch(t *testing.T, arch Arch) {
	e := loadTiny(t, arch, Options{})
	seed := int64(11)
	reqs := []SampleRequest{
		{Prompt: e.Tokenizer.Encode("The quick brown fox"), NumSamples: 2, PromptLogprobs: true,
			Params: SampleParams{MaxTokens: 6, Temperature: 1, TopK: -1, TopP: 1, Seed: &seed}},
		{Prompt: e.Tokenizer.Encode("A language model reads a sequence of tokens and"), NumSamples: 1,
			Params: SampleParams{MaxTokens: 9, Temperature: 0}},
		{Prompt: []int{7}, NumSamples: 3, TopKPromptLogprobs: 2,
			Params: SampleParams{MaxTokens: 3, Temperature: 0.7, TopK: 5, TopP: 0.9, Seed: &seed}},
	}
	batched, err := e.SampleBatch(context.Background(), "", append([]SampleRequest(nil), reqs...))
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range reqs {
		alone, err := e.Sample("", r)
		if err != nil {
			t.Fatal(err)
		}
		b := batched[i]
		if len(b.Sequences) != r.NumSamples || len(alone.Sequences) != r.NumSamples {
			t.Fatalf("request %d: %d and %d sequences, want %d", i, len(b.Sequences), len(alone.Sequences), r.NumSamples)
		}
		for j := range b.Sequences {
			if !reflect.DeepEqual(b.Sequences[j].Tokens, alone.Sequences[j].Tokens) || b.Sequences[j].StopReason != alone.Sequences[j].StopReason {
				t.Fatalf("request %d sample %d: batched %v, alone %v", i, j, b.Sequences[j].Tokens, alone.Sequences[j].Tokens)
			}
			for k, lp := range b.Sequences[j].Logprobs {
				if math.Abs(lp-alone.Sequences[j].Logprobs[k]) > 1e-3 {
					t.Fatalf("request %d sample %d token %d: logprob %v vs %v", i, j, k, lp, alone.Sequences[j].Logprobs[k])
				}
			}
		}
		if len(b.PromptLogprobs) != len(alone.PromptLogprobs) || len(b.TopKPrompt) != len(alone.TopKPrompt) {
			t.Fatalf("request %d: prompt logprobs differ in length", i)
		}
		for k := 1; k < len(b.PromptLogprobs); k++ {
			if math.Abs(b.PromptLogprobs[k]-alone.PromptLogprobs[k]) > 1e-3 {
				t.Fatalf("request %d prompt token %d: %v vs %v", i, k, b.PromptLogprobs[k], alone.PromptLogprobs[k])
			}
		}
	}
	if _, err := e.SampleBatch(context.Background(), "", []SampleRequest{reqs[0], {Prompt: []int{e.Config.VocabSize}}}); !errors.Is(err, ErrInvalidInput) {
		t.Fatalf("a bad request in a batch: %v", err)
	}
}

// The candidates of a top-k / top-p draw are the prefix a full stable sort of the vocabulary
// gives, for peaked and flat distributions and every kind of truncation.
func TestCandidatesArePrefixOfFullSort(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for trial := range 200 {
		V := 1 + rng.IntN(3000)
		logits := make([]float64, V)
		spread := []float64{0.1, 1, 5, 20}[trial%4]
		for i := range logits {
			logits[i] = rng.NormFloat64() * spread
			if rng.IntN(10) == 0 && i > 0 {
				logits[i] = logits[i-1] // ties
			}
		}
		lp := logSoftmax(logits)
		full := make([]int, V)
		for i := range full {
			full[i] = i
		}
		sort.SliceStable(full, func(a, b int) bool { return lp[full[a]] > lp[full[b]] })
		topK := []int{-1, 1, 5, 50, V + 3}[rng.IntN(5)]
		topP := []float64{1, 0.5, 0.9, 0.99}[rng.IntN(4)]
		got := candidates(lp, topK, topP)
		if len(got) == 0 || len(got) > V {
			t.Fatalf("trial %d: %d candidates of %d", trial, len(got), V)
		}
		for i, c := range got {
			if full[i] != c {
				t.Fatalf("trial %d (V %d, k %d, p %v): candidate %d is %d, full sort has %d", trial, V, topK, topP, i, c, full[i])
			}
		}
		if topK > 0 && topK <= V && topP >= 1 && len(got) < topK {
			t.Fatalf("trial %d: %d candidates for top-k %d", trial, len(got), topK)
		}
		var mass float64
		for _, c := range got {
			mass += math.Exp(lp[c])
		}
		kEff := V
		if topK > 0 && topK < V {
			kEff = topK
		}
		if topP < 1 && len(got) < kEff && mass < topP {
			t.Fatalf("trial %d: candidates hold %v of the mass, top-p %v", trial, mass, topP)
		}
	}
}

// Decoding one sequence token by token (batch 1: reading the weights once per token), in each
// precision, with a rank-16 adapter as the bench command uses. SKEIN_BENCH_MODEL picks the model
// (default: the tiny preset).
func BenchmarkDecodeBatch1(b *testing.B) { benchmarkDecode(b, 1) }

// Eight samples of one prompt decoding together: the shape of issue 36's scaling target (run it
// under -cpu 1,2 and compare).
func BenchmarkDecodeBatch8(b *testing.B) { benchmarkDecode(b, 8) }

func benchmarkDecode(b *testing.B, rows int) {
	dir := os.Getenv("SKEIN_BENCH_MODEL")
	if dir == "" {
		dir = tinyModel(b, ArchQwen2)
	}
	for _, prec := range []string{"f32", "bf16"} {
		b.Run(prec, func(b *testing.B) {
			e, err := Load(dir, Options{Precision: prec})
			if err != nil {
				b.Fatal(err)
			}
			if _, err := e.CreateAdapter("a", LoraConfig{Rank: 16, TrainAttn: true, TrainMLP: true}); err != nil {
				b.Fatal(err)
			}
			req := SampleRequest{Prompt: []int{1, 2, 3, 4, 5, 6, 7, 8}, NumSamples: rows, Params: SampleParams{MaxTokens: 32, Temperature: 1, TopK: -1, TopP: 1}}
			b.ResetTimer()
			tokens := 0
			for range b.N {
				r, err := e.Sample("a", req)
				if err != nil {
					b.Fatal(err)
				}
				for _, s := range r.Sequences {
					tokens += len(s.Tokens)
				}
			}
			b.ReportMetric(float64(tokens)/b.Elapsed().Seconds(), "tokens/s")
		})
	}
}

// At most MaxSampleRows rows decode together whatever the request (issue 40 item 9): a request
// of more samples runs in parts, each sample keeping its own random stream, so the first part's
// samples are those of the same request with MaxSampleRows samples, bit for bit; the prompt's
// logprobs come once.
func TestLargeRequestsDecodeInPartsOfBoundedRows(t *testing.T) {
	e := loadTiny(t, ArchQwen3, Options{})
	var loops []int
	e.decodeHook = func(rows int) { loops = append(loops, rows) }
	seed := int64(5)
	req := SampleRequest{Prompt: []int{3, 9, 4}, NumSamples: 2 * MaxSampleRows, PromptLogprobs: true,
		Params: SampleParams{MaxTokens: 3, Temperature: 1, Seed: &seed}}
	res, err := e.SampleBatch(context.Background(), "", []SampleRequest{req})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range loops {
		if n > MaxSampleRows {
			t.Fatalf("a decode loop of %d rows (loops %v), want at most %d", n, loops, MaxSampleRows)
		}
	}
	if got := len(res[0].Sequences); got != req.NumSamples {
		t.Fatalf("%d sequences, want %d", got, req.NumSamples)
	}
	if len(res[0].PromptLogprobs) != len(req.Prompt) {
		t.Fatalf("prompt logprobs %v", res[0].PromptLogprobs)
	}
	one := req
	one.NumSamples = MaxSampleRows
	want, err := e.SampleBatch(context.Background(), "", []SampleRequest{one})
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range want[0].Sequences {
		if !slices.Equal(s.Tokens, res[0].Sequences[i].Tokens) || !slices.Equal(s.Logprobs, res[0].Sequences[i].Logprobs) {
			t.Fatalf("sample %d: %v %v in parts, %v %v alone", i, res[0].Sequences[i].Tokens, res[0].Sequences[i].Logprobs, s.Tokens, s.Logprobs)
		}
	}
}

// A prefill of many rows and long prompts runs in chunks of positions, each pass at most
// prefillTokens row-tokens (so its layers, and the turns between them, come often: issue 40
// item 8), and samples what the prefill in one pass samples: the same tokens, logprobs and prompt
// logprobs within float32 rounding, on a hybrid model (DeltaNet states stop at each row's own
// prompt end, rows of different lengths) and on an attention-only one.
func TestChunkedPrefillSamplesAsOnePass(t *testing.T) {
	for _, arch := range []Arch{ArchQwen3_5, ArchQwen3} {
		t.Run(string(arch), func(t *testing.T) {
			e := loadTiny(t, arch, Options{})
			seed := int64(3)
			long := make([]int, 75)
			for i := range long {
				long[i] = (i*37+11)%400 + 3
			}
			reqs := []SampleRequest{
				{Prompt: long, NumSamples: 2, PromptLogprobs: true, Params: SampleParams{MaxTokens: 4, Temperature: 1, Seed: &seed}},
				{Prompt: long[:9], NumSamples: 3, Params: SampleParams{MaxTokens: 4, Temperature: 1, Seed: &seed}},
				{Prompt: long[:40], NumSamples: 1, Params: SampleParams{MaxTokens: 4}},
			}
			whole, err := e.SampleBatch(context.Background(), "", reqs)
			if err != nil {
				t.Fatal(err)
			}
			var passes [][2]int
			e.stepHook = func(B, T int) { passes = append(passes, [2]int{B, T}) }
			e.prefillLimit = 3 * 16 // 3 prompts (each prefilled once for its samples): chunks of 16 positions
			defer func() { e.stepHook, e.prefillLimit = nil, 0 }()
			chunked, err := e.SampleBatch(context.Background(), "", reqs)
			if err != nil {
				t.Fatal(err)
			}
			prefillPasses := 0
			for _, p := range passes {
				if p[1] > 1 {
					prefillPasses++
					if p[0]*p[1] > e.prefillLimit {
						t.Fatalf("a prefill pass of %d rows × %d positions, over the limit %d", p[0], p[1], e.prefillLimit)
					}
				}
			}
			if prefillPasses < 5 { // 80 positions in chunks of 16
				t.Fatalf("%d prefill passes (%v), want the prompt in chunks", prefillPasses, passes)
			}
			for i := range reqs {
				w, c := whole[i], chunked[i]
				for k := range w.PromptLogprobs {
					if d := math.Abs(w.PromptLogprobs[k] - c.PromptLogprobs[k]); d > 1e-4 && !math.IsNaN(w.PromptLogprobs[k]) {
						t.Fatalf("request %d prompt logprob %d: %v in one pass, %v in chunks", i, k, w.PromptLogprobs[k], c.PromptLogprobs[k])
					}
				}
				for s := range w.Sequences {
					if !slices.Equal(w.Sequences[s].Tokens, c.Sequences[s].Tokens) {
						t.Fatalf("request %d sample %d: %v in one pass, %v in chunks", i, s, w.Sequences[s].Tokens, c.Sequences[s].Tokens)
					}
					for k, lp := range w.Sequences[s].Logprobs {
						if d := math.Abs(lp - c.Sequences[s].Logprobs[k]); d > 1e-4 {
							t.Fatalf("request %d sample %d token %d: logprob %v in one pass, %v in chunks", i, s, k, lp, c.Sequences[s].Logprobs[k])
						}
					}
				}
			}
		})
	}
}

// A request's samples share one prefill of its prompt (issue 39: prefix sharing): the prefill
// passes have a row per request, not per sample, and the samples are those of the same request
// sampled alone (the same tokens; logprobs and prompt logprobs within float32 rounding), on an
// attention model and a hybrid one (whose DeltaNet states are forked with the keys and values).
func TestSamplesShareTheirPromptsPrefill(t *testing.T) {
	for _, arch := range []Arch{ArchQwen3, ArchQwen3_5} {
		t.Run(string(arch), func(t *testing.T) {
			e := loadTiny(t, arch, Options{})
			seed := int64(9)
			p := make([]int, 40)
			for i := range p {
				p[i] = (i*53+7)%400 + 3
			}
			reqs := []SampleRequest{
				{Prompt: p, NumSamples: 6, PromptLogprobs: true, Params: SampleParams{MaxTokens: 5, Temperature: 1, Seed: &seed}},
				{Prompt: p[:13], NumSamples: 3, Params: SampleParams{MaxTokens: 5, Temperature: 0.7, TopK: 20, Seed: &seed}},
			}
			var prefillRows []int
			e.stepHook = func(B, T int) {
				if T > 1 {
					prefillRows = append(prefillRows, B)
				}
			}
			before := e.prefilled.Load()
			batch, err := e.SampleBatch(context.Background(), "", reqs)
			e.stepHook = nil
			if err != nil {
				t.Fatal(err)
			}
			for _, b := range prefillRows {
				if b != len(reqs) {
					t.Fatalf("prefill passes of %v rows, want %d (one per request, not per sample)", prefillRows, len(reqs))
				}
			}
			if got := e.prefilled.Load() - before; got != int64(len(reqs)) {
				t.Fatalf("%d prompts prefilled once, want %d", got, len(reqs))
			}
			for i, r := range reqs {
				// Sample 0 of a request of one sample: prefilled in its own row, no fork.
				one := r
				one.NumSamples = 1
				single, err := e.SampleBatch(context.Background(), "", []SampleRequest{one})
				if err != nil {
					t.Fatal(err)
				}
				if got := batch[i].Sequences[0]; !slices.Equal(single[0].Sequences[0].Tokens, got.Tokens) {
					t.Fatalf("request %d sample 0: %v with no fork, %v forked", i, single[0].Sequences[0].Tokens, got.Tokens)
				}
				alone, err := e.SampleBatch(context.Background(), "", []SampleRequest{r})
				if err != nil {
					t.Fatal(err)
				}
				for k, lp := range alone[0].PromptLogprobs {
					if d := math.Abs(lp - batch[i].PromptLogprobs[k]); d > 1e-4 {
						t.Fatalf("request %d prompt logprob %d: %v alone, %v in the batch", i, k, lp, batch[i].PromptLogprobs[k])
					}
				}
				for s, seq := range alone[0].Sequences {
					got := batch[i].Sequences[s]
					if !slices.Equal(seq.Tokens, got.Tokens) {
						t.Fatalf("request %d sample %d: %v alone, %v in the batch", i, s, seq.Tokens, got.Tokens)
					}
					for k := range seq.Logprobs {
						if d := math.Abs(seq.Logprobs[k] - got.Logprobs[k]); d > 1e-4 {
							t.Fatalf("request %d sample %d token %d: logprob %v alone, %v in the batch", i, s, k, seq.Logprobs[k], got.Logprobs[k])
						}
					}
				}
			}
		})
	}
}
