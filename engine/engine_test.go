package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

var tinyDirs sync.Map // arch -> dir, generated once per test binary

func tinyModel(t testing.TB, arch Arch) string {
	t.Helper()
	if d, ok := tinyDirs.Load(arch); ok {
		return d.(string)
	}
	dir := filepath.Join(tempRoot(t), string(arch))
	preset := "tiny"
	if isMoEArch(arch) {
		preset = "tiny-moe"
	}
	if err := InitTiny(dir, arch, preset, 1); err != nil {
		t.Fatal(err)
	}
	tinyDirs.Store(arch, dir)
	return dir
}

var rootOnce = sync.OnceValue(func() string {
	d, err := mkdirTemp()
	if err != nil {
		panic(err)
	}
	return d
})

func tempRoot(testing.TB) string { return rootOnce() }

func loadTiny(t testing.TB, arch Arch, opts Options) *Engine {
	t.Helper()
	e, err := Load(tinyModel(t, arch), opts)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// textDatum turns token ids into a next-token cross-entropy datum.
func textDatum(ids []int) Datum {
	n := len(ids) - 1
	tg := make([]float64, n)
	w := make([]float64, n)
	for i := range n {
		tg[i] = float64(ids[i+1])
		w[i] = 1
	}
	return Datum{Tokens: append([]int(nil), ids[:n]...), Inputs: map[string]TensorInput{
		"target_tokens": {DType: "int64", Data: tg},
		"weights":       {DType: "float32", Data: w},
	}}
}

func TestTrainingLowersLoss(t *testing.T) {
	for _, arch := range []Arch{ArchLlama, ArchQwen2, ArchQwen3, ArchQwen3_5, ArchQwen3MoE, ArchQwen3_5MoE} {
		t.Run(string(arch), func(t *testing.T) {
			e := loadTiny(t, arch, Options{})
			ids := e.Tokenizer.Encode("The quick brown fox jumps over the lazy dog. The dog sleeps in the sun.")
			if _, err := e.CreateAdapter("a", LoraConfig{Rank: 8, Seed: 3, TrainAttn: true, TrainMLP: true, TrainUnembed: true}); err != nil {
				t.Fatal(err)
			}
			batch := []Datum{textDatum(ids)}
			var first, last float64
			p := DefaultAdamParams()
			p.LearningRate = 1e-2
			for step := range 30 {
				r, err := e.ForwardBackward(context.Background(), "a", batch, "cross_entropy", nil)
				if err != nil {
					t.Fatal(err)
				}
				if step == 0 {
					first = r.Loss
				}
				last = r.Loss
				if _, err := e.OptimStep(context.Background(), "a", p); err != nil {
					t.Fatal(err)
				}
			}
			t.Logf("%s: loss %.3f -> %.3f, compiles %+v", arch, first, last, e.CompileStats())
			if !(last < first/2) || math.IsNaN(last) {
				t.Fatalf("loss did not halve: %.4f -> %.4f", first, last)
			}
		})
	}
}

func rlDatum(ids []int, oldLP, adv float64) Datum {
	d := textDatum(ids)
	n := len(d.Tokens)
	lp := make([]float64, n)
	a := make([]float64, n)
	for i := range n {
		lp[i] = oldLP - 0.1*float64(i%3)
		a[i] = adv * float64(1+i%2)
	}
	delete(d.Inputs, "weights")
	d.Inputs["logprobs"] = TensorInput{DType: "float32", Data: lp}
	d.Inputs["advantages"] = TensorInput{DType: "float32", Data: a}
	return d
}

// Gradients of every loss match central finite differences on a float64 model: every loss on
// Qwen3 (q/k norms), cross-entropy on Llama (untied lm_head) and Qwen2 (biases, tied lm_head).
func TestGradientsMatchFiniteDifferences(t *testing.T) {
	// qwen3_5: every LoRA kind of a DeltaNet layer (split in_proj q/k/v, z, out_proj) and of a
	// gated attention layer, through the hand-written backward of the delta rule.
	// qwen3_moe, qwen3_5_moe: the experts' shared-outer LoRA and the router's path (moe.go).
	for _, arch := range []Arch{ArchQwen3, ArchLlama, ArchQwen2, ArchQwen3_5, ArchQwen3MoE, ArchQwen3_5MoE} {
		t.Run(string(arch), func(t *testing.T) { checkGradients(t, arch) })
	}
}

func checkGradients(t *testing.T, arch Arch) {
	e := loadTiny(t, arch, Options{Float64: true})
	ids := e.Tokenizer.Encode("It's a fine day, isn't it?")
	cases := []struct {
		loss string
		data []Datum
		cfg  map[string]float64
	}{
		{"cross_entropy", []Datum{textDatum(ids), textDatum(ids[:5])}, nil},
		// old logprobs near the current ones, so ppo/cispo clipping is active for some tokens only
		{"importance_sampling", []Datum{rlDatum(ids, -6.2, 0.7)}, nil},
		{"ppo", []Datum{rlDatum(ids, -6.2, -0.5)}, map[string]float64{"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}},
		{"dro", []Datum{rlDatum(ids, -6.0, 0.4)}, map[string]float64{"beta": 0.3}},
		// as the cookbook sends it: prompt positions padded with target 0, logprob 0, advantage 0
		{"dro", []Datum{cookbookRLDatum(ids, 4, 0)}, map[string]float64{"beta": 0.3}},
	}
	if arch != ArchQwen3 {
		cases = cases[:1]
	}
	for ci, c := range cases {
		t.Run(c.loss, func(t *testing.T) {
			id := fmt.Sprintf("%s-%d", c.loss, ci)
			a := adapterWithB(t, e, id, LoraConfig{Rank: 2, Seed: int64(ci), TrainAttn: true, TrainMLP: true, TrainUnembed: true}, func(i, j int) float64 { return 0.05 * math.Sin(float64(7*j+i)) })
			if _, err := e.ForwardBackward(context.Background(), id, c.data, c.loss, c.cfg); err != nil {
				t.Fatal(err)
			}
			lossAt := func() float64 {
				r, err := e.Forward(context.Background(), id, c.data, c.loss, c.cfg)
				if err != nil {
					t.Fatal(err)
				}
				return r.Loss
			}
			checked := 0
			for pi, p := range a.params {
				for _, j := range []int{0, len(hostOf(p.s64.w)) / 2, len(hostOf(p.s64.w)) - 1} {
					orig := hostOf(p.s64.w)[j]
					const h = 1e-6
					hostOf(p.s64.w)[j] = orig + h
					up := lossAt()
					hostOf(p.s64.w)[j] = orig - h
					down := lossAt()
					hostOf(p.s64.w)[j] = orig
					fd := (up - down) / (2 * h)
					g := hostOf(p.s64.g)[j]
					if math.Abs(fd-g) > 1e-5*(1+math.Abs(fd)) {
						t.Fatalf("%s param %d (%s) elem %d: autodiff %.10g, finite difference %.10g", c.loss, pi, p.name, j, g, fd)
					}
					if g != 0 {
						checked++
					}
				}
			}
			if checked < len(a.params) {
				t.Fatalf("only %d of %d checked gradients were non-zero", checked, 3*len(a.params))
			}
		})
	}
}

// cispo's gradient is cross-entropy's with per-token weights stopgrad(clip(r))·A, since the
// ratio is not differentiated (finite differences cannot see a stop-gradient).
func TestCISPOGradientIsWeightedCrossEntropy(t *testing.T) {
	e := loadTiny(t, ArchLlama, Options{Float64: true})
	ids := e.Tokenizer.Encode("The river flows past the mill.")
	a := adapterWithB(t, e, "x", LoraConfig{Rank: 2, Seed: 9, TrainAttn: true, TrainMLP: true}, func(i, j int) float64 { return 0.05 * math.Cos(float64(3*j+i)) })
	d := rlDatum(ids, -7.5, 0.8)
	fwd, err := e.Forward(context.Background(), "x", []Datum{d}, "cispo", nil)
	if err != nil {
		t.Fatal(err)
	}
	w := make([]float64, len(d.Tokens))
	clipped := 0
	for i, lp := range fwd.Logprobs[0] {
		r := math.Exp(lp - d.Inputs["logprobs"].Data[i])
		if r > 4 {
			r, clipped = 4, clipped+1
		}
		w[i] = r * d.Inputs["advantages"].Data[i]
	}
	ce := textDatum(ids)
	ce.Inputs["weights"] = TensorInput{DType: "float32", Data: w}
	if _, err := e.ForwardBackward(context.Background(), "x", []Datum{d}, "cispo", nil); err != nil {
		t.Fatal(err)
	}
	cispo := make([][]float64, len(a.params))
	for i, p := range a.params {
		cispo[i] = append([]float64(nil), hostOf(p.s64.g)...)
		clear(hostOf(p.s64.g))
	}
	if _, err := e.ForwardBackward(context.Background(), "x", []Datum{ce}, "cross_entropy", nil); err != nil {
		t.Fatal(err)
	}
	for i, p := range a.params {
		for j := range hostOf(p.s64.g) {
			if math.Abs(hostOf(p.s64.g)[j]-cispo[i][j]) > 1e-9*(1+math.Abs(hostOf(p.s64.g)[j])) {
				t.Fatalf("%s[%d]: cispo %.10g, weighted CE %.10g", p.name, j, cispo[i][j], hostOf(p.s64.g)[j])
			}
		}
	}
	if clipped == 0 || clipped == len(w) {
		t.Fatalf("%d of %d ratios clipped: the test should exercise both sides of the clip", clipped, len(w))
	}
}

// A batch bigger than MaxBatchTokens, or than MaxStepBytes allows, runs in chunks; the outputs
// and the accumulated gradients are the ones the batch gives in one pass. Each engine first runs
// a forward pass, so that forward_backward runs on reused (dirty) step buffers and must still
// give the same logprobs.
func TestChunksMatchOneCall(t *testing.T) {
	dir := tinyModel(t, ArchQwen2)
	ids := []int{}
	for len(ids) < 301 {
		ids = append(ids, len(ids)%400+3)
	}
	var data []Datum
	lengths := []int{}
	for k := range 4 {
		data = append(data, textDatum(ids[:301-k*90]))
		lengths = append(lengths, 301-k*90)
	}
	cfg, err := LoadConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		opts   Options
		chunks int
	}{
		{"one pass", Options{Float64: true}, 1},
		{"token limit", Options{Float64: true, MaxBatchTokens: 700}, 2},                                 // 2×304, then 2×128
		{"memory limit", Options{Float64: true, MaxStepBytes: 8 * 400 * cfg.stepElemsPerToken(304)}, 3}, // 304, 304, 2×128
	}
	results := map[string]*ForwardResult{}
	grads := map[string][][]float64{}
	for _, c := range cases {
		e, err := Load(dir, c.opts)
		if err != nil {
			t.Fatal(err)
		}
		if got := len(e.chunks(lengths, nil)); got != c.chunks {
			t.Fatalf("%s: %d chunks, want %d", c.name, got, c.chunks)
		}
		a := adapterWithB(t, e, "a", LoraConfig{Rank: 2, Seed: 4, TrainAttn: true, TrainMLP: true}, func(i, j int) float64 { return 0.01 * math.Sin(float64(j+i)) })
		first, err := e.Forward(context.Background(), "a", data, "cross_entropy", nil)
		if err != nil {
			t.Fatal(err)
		}
		if results[c.name], err = e.ForwardBackward(context.Background(), "a", data, "cross_entropy", nil); err != nil {
			t.Fatal(err)
		}
		for i := range data {
			for j, v := range first.Logprobs[i] {
				if v != results[c.name].Logprobs[i][j] {
					t.Fatalf("%s, datum %d token %d: %v on fresh buffers, %v on reused ones", c.name, i, j, v, results[c.name].Logprobs[i][j])
				}
			}
		}
		for _, p := range a.params {
			grads[c.name] = append(grads[c.name], p.float64s('g'))
		}
		if c.opts.MaxStepBytes > 0 && e.PeakStepBytes() > c.opts.MaxStepBytes {
			t.Fatalf("%s: a pass held %d bytes, over the %d allowed", c.name, e.PeakStepBytes(), c.opts.MaxStepBytes)
		}
	}
	one := results["one pass"]
	for _, c := range cases[1:] {
		chunked := results[c.name]
		if math.Abs(one.Loss-chunked.Loss) > 1e-9*math.Abs(one.Loss) {
			t.Fatalf("%s: loss %v in one pass, %v in chunks", c.name, one.Loss, chunked.Loss)
		}
		for i := range data {
			if len(chunked.Logprobs[i]) != len(data[i].Tokens) {
				t.Fatalf("%s: datum %d: %d logprobs for %d tokens", c.name, i, len(chunked.Logprobs[i]), len(data[i].Tokens))
			}
			for j, v := range one.Logprobs[i] {
				if math.Abs(v-chunked.Logprobs[i][j]) > 1e-9 {
					t.Fatalf("%s: datum %d token %d: %v vs %v", c.name, i, j, v, chunked.Logprobs[i][j])
				}
			}
		}
		for k := range grads["one pass"] {
			for j, v := range grads["one pass"][k] {
				if math.Abs(v-grads[c.name][k][j]) > 1e-9*(1+math.Abs(v)) {
					t.Fatalf("%s: gradient %d[%d]: %v vs %v", c.name, k, j, v, grads[c.name][k][j])
				}
			}
		}
	}
}

// Forks of one engine (replicas sharing the base weights, the compiled matmuls and the pool of
// step buffers) train at the same time and get exactly what each gets alone.
func TestForksTrainConcurrently(t *testing.T) {
	base := loadTiny(t, ArchQwen3, Options{})
	ids := base.Tokenizer.Encode("Two replicas train side by side without sharing a thing.")
	data := [][]Datum{{textDatum(ids)}, {textDatum(ids[:9]), textDatum(ids[3:])}}
	run := func(e *Engine, k int) []float64 {
		id := fmt.Sprint("a", k)
		if _, err := e.CreateAdapter(id, LoraConfig{Rank: 4, Seed: int64(k), TrainAttn: true, TrainMLP: true}); err != nil {
			t.Error(err)
			return nil
		}
		var losses []float64
		for range 5 {
			r, err := e.ForwardBackward(context.Background(), id, data[k], "cross_entropy", nil)
			if err != nil {
				t.Error(err)
				return nil
			}
			if _, err := e.OptimStep(context.Background(), id, AdamParams{LearningRate: 1e-2, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8}); err != nil {
				t.Error(err)
				return nil
			}
			losses = append(losses, r.Loss)
		}
		return losses
	}
	alone := [][]float64{run(base.Fork(), 0), run(base.Fork(), 1)}
	together := make([][]float64, 2)
	var wg sync.WaitGroup
	for k := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			together[k] = run(base.Fork(), k)
		}()
	}
	wg.Wait()
	for k := range 2 {
		if len(alone[k]) != 5 || len(together[k]) != 5 {
			t.Fatalf("fork %d: %d and %d losses", k, len(alone[k]), len(together[k]))
		}
		for i := range alone[k] {
			if alone[k][i] != together[k][i] {
				t.Fatalf("fork %d step %d: loss %v alone, %v beside another fork", k, i, alone[k][i], together[k][i])
			}
		}
		if together[k][4] >= together[k][0] {
			t.Fatalf("fork %d did not train: %v", k, together[k])
		}
	}
}

// Sizes in a config.json are bounded at load, and length buckets never overflow or loop.
func TestHostileConfigSizesAreRefused(t *testing.T) {
	base := `{"architectures":["Qwen3ForCausalLM"],"vocab_size":512,"hidden_size":64,"intermediate_size":128,` +
		`"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"max_position_embeddings":%d}`
	for _, n := range []int64{1 << 62, -5} {
		var c Config
		if err := json.Unmarshal([]byte(fmt.Sprintf(base, n)), &c); err != nil {
			t.Fatal(err)
		}
		if err := c.finish(); err == nil {
			t.Fatalf("max_position_embeddings %d accepted", n)
		}
	}
	done := make(chan int, 1)
	go func() { done <- bucket(1<<62+1, 16) }()
	select {
	case b := <-done:
		if b < 1<<62+1 {
			t.Fatalf("bucket of 2^62+1 is %d", b)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("bucket(2^62+1, 16) does not return")
	}
}

// --device: cpu and auto load the model on the CPU (auto says why it took no GPU); an explicit
// GPU is refused with a clear error, and a bad value is refused naming the choices.
func TestDeviceChoice(t *testing.T) {
	dir := tinyModel(t, ArchQwen3)
	for _, dev := range []string{"", "auto", "cpu", "CPU"} {
		if _, err := Load(dir, Options{Device: dev}); err != nil {
			t.Fatalf("--device %q: %v", dev, err)
		}
	}
	for _, dev := range []string{"cuda", "cuda:1"} {
		if _, err := Load(dir, Options{Device: dev}); err == nil || !strings.Contains(err.Error(), "--device "+dev) {
			t.Fatalf("--device %s: %v, want a refusal naming it", dev, err)
		}
	}
	if _, err := Load(dir, Options{Device: "tpu"}); err == nil || !strings.Contains(err.Error(), "auto, cpu, cuda or cuda:N") {
		t.Fatalf("--device tpu: %v", err)
	}
}
