package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strings"
	"time"

	"github.com/skein-ai/skein/engine"
	"github.com/skein-ai/skein/replica"
)

// benchOutput is where the bench prints its results (a variable for tests).
var benchOutput io.Writer = os.Stdout

// benchLog is where the bench logs its phases, as text (a variable for tests): a full run on a
// big model takes minutes, which without a word look like a hang.
var benchLog io.Writer = os.Stderr

// benchConfig is what `skein bench engine` was asked to measure.
type benchConfig struct {
	model, precision, cpuProfile    string
	device                          string
	memProfile                      string
	activations                     string
	batch, seq, rank, steps, decode int
	peakSize, images, imageSide     int
	tenants                         int
	asJSON, trainOnly               bool
}

// progress logs one step of a phase, unless the output is --json (then only the phases are
// logged): on a big model each phase is minutes of steps, which without a word look like a hang.
func (c benchConfig) progress(msg string, args ...any) {
	if !c.asJSON {
		slog.Info(msg, args...)
	}
}

func benchEngine(args []string) error {
	c, err := parseBenchFlags(args)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(benchLog, nil))
	slog.SetDefault(log) // the phases logged from the helpers below, and the replica's lines
	ggmlAct, err := engine.ParseActivations(c.activations)
	if err != nil {
		return err
	}
	if err := setupKernels(log); err != nil {
		return err
	}
	start := time.Now()
	// The matmul peak first, in a quiet process: best of 30 runs of a --peak-size³ float32 matmul.
	log.Info("bench: matmul peak", "size", c.peakSize)
	peak, err := engine.MatmulGFLOPS(c.peakSize, 30)
	if err != nil {
		return err
	}
	e, loaded, err := benchLoad(c, ggmlAct, log)
	if err != nil {
		return err
	}
	if c.trainOnly && os.Getenv("GOMEMLIMIT") == "" {
		limitMemoryToPlan(e, c, log)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	data := benchData(e, rng, c.batch, c.seq)
	log.Info("bench: training", "batch", c.batch, "seq", c.seq, "rank", c.rank, "steps", c.steps)
	res, err := benchTraining(e, c, data)
	if err != nil {
		return err
	}
	maps.Copy(res, loaded)
	// Memory through loading and training, before decoding and the tenants' adapters add theirs,
	// beside what the memory plan expects of it.
	if hwm, err := peakRSS(); err == nil {
		res["train_rss_mb"] = float64(hwm) / (1 << 20)
	}
	// What of it is live (the Go heap after a collection: weights in bf16 or blocks, adapters,
	// kept step buffers), against what the collector's slack and freed pages account for.
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	res["heap_live_mb"] = float64(ms.HeapAlloc) / (1 << 20)
	if c.memProfile != "" {
		if err := writeHeapProfile(c.memProfile); err != nil {
			return err
		}
	}
	plan := e.PlanTraining(c.batch, c.seq, engine.LoraConfig{Rank: c.rank, TrainAttn: true, TrainMLP: true})
	res["plan_train_mb"] = float64(plan.Total()) / (1 << 20)
	res["plan_weights_mb"] = float64(plan.Weights) / (1 << 20)
	res["plan_adapter_mb"] = float64(plan.Adapter) / (1 << 20)
	res["plan_accumulate_mb"] = float64(plan.AccumulateGrads) / (1 << 20) // more, with gradients pending
	res["plan_step_mb"] = float64(plan.Step+plan.Widened) / (1 << 20)
	if c.trainOnly {
		res["peak_gflops"] = peak
		res["peak_rss_mb"] = max(res["load_rss_mb"], res["train_rss_mb"]) // the process's, loading included
		return benchReport(e, c, res)
	}
	// The peak again after training; the higher of the two is the reference.
	if again, err := engine.MatmulGFLOPS(c.peakSize, 30); err == nil {
		peak = max(peak, again)
	}
	res["peak_gflops"] = peak
	log.Info("bench: decoding", "tokens", c.decode, "batches", "1, 8, 64")
	if err := benchDecoding(e, c, data[0].Tokens[:16], res); err != nil {
		return err
	}
	if err := benchTenants(e, c, data[0].Tokens[:16], res); err != nil {
		return err
	}
	if err := benchTurns(e, data, res); err != nil {
		return err
	}
	if err := benchTenantTraining(e, c, data, res); err != nil {
		return err
	}
	if e.Info().TakesImages() {
		log.Info("bench: images", "images", c.images, "side", c.imageSide)
		step := func(data []engine.Datum) error { return benchStep(e, data, nil) }
		if err := benchImages(e, res, step, rng, c.batch, c.seq, c.images, c.imageSide, c.steps); err != nil {
			return err
		}
	}
	if hwm, err := peakRSS(); err == nil {
		res["peak_rss_mb"] = max(res["load_rss_mb"], float64(hwm)/(1<<20)) // loading's too: the peak was reset after it
	}
	cs := e.CompileStats()
	res["compiles"] = float64(cs.Count)
	res["compile_s"] = cs.Total.Seconds()
	log.Info("bench: done", "seconds", time.Since(start).Seconds())
	return benchReport(e, c, res)
}

func parseBenchFlags(args []string) (benchConfig, error) {
	var c benchConfig
	fs := flag.NewFlagSet("bench engine", flag.ContinueOnError)
	fs.StringVar(&c.model, "model", "", "model `DIR`: a Hugging Face model directory, or one made by skein model init-tiny --preset small")
	fs.IntVar(&c.batch, "batch", 8, "sequences per forward_backward")
	fs.IntVar(&c.seq, "seq", 256, "tokens per sequence")
	fs.IntVar(&c.rank, "rank", 16, "LoRA rank")
	fs.IntVar(&c.steps, "steps", 5, "timed training steps (the best is reported, and the mean)")
	fs.IntVar(&c.decode, "decode", 32, "tokens to decode per sequence")
	fs.BoolVar(&c.asJSON, "json", false, "print one JSON object")
	fs.BoolVar(&c.trainOnly, "train-only", false, "measure training only (its speed, its memory against the plan, under a soft memory limit at the plan unless GOMEMLIMIT is set), then stop")
	fs.StringVar(&c.device, "device", "auto", "where the engine computes: auto (the first working NVIDIA GPU, else the CPU), cpu, cuda or cuda:N; the CUDA backend does not run the model yet, so auto computes on the CPU (logging why) and cuda is refused")
	fs.StringVar(&c.precision, "precision", engine.PrecisionF32, "base weights in memory: f32, bf16, q8_0, q6_k, q4_k or q4_k_m")
	fs.StringVar(&c.activations, "activations", engine.ActivationsF32, "forward products of quantized base weights: f32 or ggml (llama.cpp's activation rounding and integer dots)")
	fs.StringVar(&c.cpuProfile, "cpuprofile", "", "write a CPU profile of the timed training steps to this file")
	fs.StringVar(&c.memProfile, "memprofile", "", "write a heap profile of what is live after training to this file")
	fs.IntVar(&c.peakSize, "peak-size", 1024, "side of the square float32 matmul that measures the peak")
	fs.IntVar(&c.images, "images", 8, "vision-language models: images the vision tower is timed on")
	fs.IntVar(&c.imageSide, "image-side", 224, "vision-language models: side in pixels of the bench's square images")
	fs.IntVar(&c.tenants, "tenants", 8, "multi-tenant sampling: this many adapters with one request each against one adapter with as many (and 64 against 8); 0: skip")
	if _, err := parseArgs(fs, args, "skein bench engine --model DIR [flags]"); err != nil {
		return c, err
	}
	if c.model == "" {
		return c, fmt.Errorf("--model is required")
	}
	if c.peakSize < 1 || c.peakSize > 8192 {
		return c, fmt.Errorf("--peak-size %d: want 1…8192", c.peakSize)
	}
	return c, nil
}

// benchData is batch sequences of seq random tokens, with random targets, all weighted.
func benchData(e *engine.Engine, rng *rand.Rand, batch, seq int) []engine.Datum {
	token := func() int { return benchToken(rng, e.Config) }
	data := make([]engine.Datum, batch)
	for i := range data {
		toks := make([]int, seq)
		tg := make([]float64, seq)
		w := make([]float64, seq)
		for j := range toks {
			toks[j] = token()
			tg[j] = float64(token())
			w[j] = 1
		}
		data[i] = engine.Datum{Tokens: toks, Inputs: map[string]engine.TensorInput{
			"target_tokens": {DType: "int64", Data: tg}, "weights": {DType: "float32", Data: w}}}
	}
	return data
}

// benchStep is one forward_backward and optim_step; loss, if not nil, gets the step's loss.
func benchStep(e *engine.Engine, data []engine.Datum, loss *float64) error {
	r, err := e.ForwardBackward(context.Background(), "bench", data, "cross_entropy", nil)
	if err != nil {
		return err
	}
	if loss != nil {
		*loss = r.Loss
	}
	_, err = e.OptimStep(context.Background(), "bench", engine.DefaultAdamParams())
	return err
}

// benchTraining runs one untimed step (compiles; its loss is first_loss: the same model, data and
// seed on every path, so paths compare by it), then times c.steps steps, each alone: the best is
// reported, as the peak is the best of its runs (on a shared machine both see the same kind of
// noise), and the mean.
func benchTraining(e *engine.Engine, c benchConfig, data []engine.Datum) (map[string]float64, error) {
	var firstLoss float64
	t0 := time.Now()
	if err := benchStep(e, data, &firstLoss); err != nil {
		return nil, err
	}
	c.progress("bench: training step", "step", "warm-up (untimed)", "loss", firstLoss, "seconds", time.Since(t0).Seconds())
	if c.cpuProfile != "" {
		f, err := os.Create(c.cpuProfile)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return nil, err
		}
		defer pprof.StopCPUProfile()
	}
	start := time.Now()
	stepTime := time.Duration(1 << 62)
	for i := range c.steps {
		t0 := time.Now()
		if err := benchStep(e, data, nil); err != nil {
			return nil, err
		}
		d := time.Since(t0)
		stepTime = min(stepTime, d)
		c.progress("bench: training step", "step", fmt.Sprintf("%d/%d", i+1, c.steps), "seconds", d.Seconds(),
			"tokens_per_s", float64(c.batch*c.seq)/d.Seconds())
	}
	meanStep := time.Since(start) / time.Duration(c.steps)
	tokens := c.batch * c.seq
	return map[string]float64{
		"step_ms":            float64(stepTime.Microseconds()) / 1000,
		"step_ms_mean":       float64(meanStep.Microseconds()) / 1000,
		"train_tokens_per_s": float64(tokens) / stepTime.Seconds(),
		"train_gflops":       e.Config.TrainFLOPs(tokens, c.seq) / stepTime.Seconds() / 1e9,
		"step_peak_mb":       float64(e.PeakStepBytes()) / (1 << 20),
		"weights_mb":         float64(e.WeightBytes()) / (1 << 20),
		"first_loss":         firstLoss,
	}, nil
}

// benchDecoding samples c.decode tokens from prompt at batch 1, 8 and 64 (one untimed run first).
func benchDecoding(e *engine.Engine, c benchConfig, prompt []int, res map[string]float64) error {
	for _, b := range []int{1, 8, 64} {
		req := engine.SampleRequest{Prompt: prompt, NumSamples: b, Params: engine.SampleParams{MaxTokens: c.decode, Temperature: 1, TopK: -1, TopP: 1}}
		if _, err := e.Sample("bench", req); err != nil { // compile
			return err
		}
		start := time.Now()
		r, err := e.Sample("bench", req)
		if err != nil {
			return err
		}
		n := 0
		for _, s := range r.Sequences {
			n += len(s.Tokens)
		}
		res[fmt.Sprintf("decode_tokens_per_s_b%d", b)] = float64(n) / time.Since(start).Seconds()
		c.progress("bench: decoded", "batch", b, "tokens", n, "tokens_per_s", res[fmt.Sprintf("decode_tokens_per_s_b%d", b)])
	}
	return nil
}

// benchTenants times sampling across adapters: n adapters with one request each in one batch
// against one adapter with n requests (the same rows, prompts and lengths: fresh adapters sample
// alike), medians of alternating rounds; and 64 adapters against 8, one request each.
func benchTenants(e *engine.Engine, c benchConfig, prompt []int, res map[string]float64) error {
	if c.tenants <= 0 {
		return nil
	}
	if c.tenants > 256 {
		return fmt.Errorf("--tenants %d: at most 256", c.tenants)
	}
	slog.Info("bench: sampling across adapters", "tenants", c.tenants)
	most := max(c.tenants, 64)
	for i := range most {
		if _, err := e.CreateAdapter(fmt.Sprintf("tenant-%d", i), engine.LoraConfig{Rank: c.rank, TrainAttn: true, TrainMLP: true}); err != nil {
			return err
		}
	}
	seed := int64(3)
	reqs := func(n int, shared bool) []engine.SampleRequest {
		out := make([]engine.SampleRequest, n)
		for i := range out {
			out[i] = engine.SampleRequest{Prompt: prompt, NumSamples: 1, Adapter: fmt.Sprintf("tenant-%d", i),
				Params: engine.SampleParams{MaxTokens: c.decode, Temperature: 1, TopK: -1, TopP: 1, Seed: &seed}}
			if shared {
				out[i].Adapter = "bench"
			}
		}
		return out
	}
	rate := func(rs []engine.SampleRequest) (float64, error) {
		start := time.Now()
		out, err := e.SampleBatch(context.Background(), "", rs)
		if err != nil {
			return 0, err
		}
		n := 0
		for _, r := range out {
			for _, s := range r.Sequences {
				n += len(s.Tokens)
			}
		}
		return float64(n) / time.Since(start).Seconds(), nil
	}
	const rounds = 5
	median := func(x []float64) float64 { slices.Sort(x); return x[len(x)/2] }
	compare := func(a, b []engine.SampleRequest) (float64, float64, error) {
		var ra, rb []float64
		for i := range rounds + 1 {
			c.progress("bench: round", "of", "sampling across adapters", "round", fmt.Sprintf("%d/%d", i+1, rounds+1), "adapters", fmt.Sprintf("%d vs %d", len(a), len(b)))
			x, err := rate(a)
			if err != nil {
				return 0, 0, err
			}
			y, err := rate(b)
			if err != nil {
				return 0, 0, err
			}
			if i > 0 { // the first round compiles
				ra, rb = append(ra, x), append(rb, y)
			}
		}
		return median(ra), median(rb), nil
	}
	many, one, err := compare(reqs(c.tenants, false), reqs(c.tenants, true))
	if err != nil {
		return err
	}
	res["tenants"] = float64(c.tenants)
	res["tenants_sample_tokens_per_s"] = many
	res["one_adapter_sample_tokens_per_s"] = one
	res["tenants_sample_ratio"] = many / one
	m64, m8, err := compare(reqs(64, false), reqs(8, false))
	if err != nil {
		return err
	}
	res["tenants64_sample_tokens_per_s"] = m64
	res["tenants64_vs_8_ratio"] = m64 / m8
	for i := range most {
		e.DeleteAdapter(context.Background(), fmt.Sprintf("tenant-%d", i))
	}
	return nil
}

// benchTenantTraining times 4 adapters' forward_backward submitted at once to one replica (each
// tenant its own lane) against one adapter's 4 back to back, the same batch each time: the
// aggregate tokens/s ratio, best of 2 alternating rounds.
func benchTenantTraining(e *engine.Engine, c benchConfig, data []engine.Datum, res map[string]float64) error {
	if c.tenants <= 0 {
		return nil
	}
	slog.Info("bench: training across adapters")
	b, err := e.Info().PrepareBatch(data, "cross_entropy", nil)
	if err != nil {
		return err
	}
	const n = 4
	for i := range n {
		if _, err := e.CreateAdapter(fmt.Sprintf("trainer-%d", i), engine.LoraConfig{Rank: c.rank, TrainAttn: true, TrainMLP: true}); err != nil {
			return err
		}
	}
	defer func() {
		for i := range n {
			e.DeleteAdapter(context.Background(), fmt.Sprintf("trainer-%d", i))
		}
	}()
	rep := replica.New("bench", "bench", e, n+1)
	defer rep.Close()
	run := func(many bool) (time.Duration, error) {
		start := time.Now()
		errs := make(chan error, n)
		for i := range n {
			a := replica.Adapter{ID: "bench", Lane: "one"}
			if many {
				a = replica.Adapter{ID: fmt.Sprintf("trainer-%d", i), Lane: fmt.Sprintf("tenant-%d", i)}
			}
			go func() {
				_, err := rep.ForwardBackward(context.Background(), a, b)
				errs <- err
			}()
			if !many { // one adapter's ops go one after another (its run queue's order)
				if err := <-errs; err != nil {
					return 0, err
				}
				errs <- nil
			}
		}
		for range n {
			if err := <-errs; err != nil {
				return 0, err
			}
		}
		return time.Since(start), nil
	}
	best := [2]time.Duration{1 << 62, 1 << 62}
	for round := range 2 {
		c.progress("bench: round", "of", "training across adapters", "round", fmt.Sprintf("%d/2", round+1))
		for k, many := range []bool{true, false} {
			d, err := run(many)
			if err != nil {
				return err
			}
			best[k] = min(best[k], d)
		}
	}
	tokens := float64(n * c.batch * c.seq)
	res["tenants_train_tokens_per_s"] = tokens / best[0].Seconds()
	res["one_adapter_train_tokens_per_s"] = tokens / best[1].Seconds()
	res["tenants_train_ratio"] = best[1].Seconds() / best[0].Seconds()
	return nil
}

// benchTurns times how long another tenant's 1-token sample waits while a forward_backward of
// the bench's batch runs on the same replica: it is served at the op's next turn (between
// layers), not after the op.
func benchTurns(e *engine.Engine, data []engine.Datum, res map[string]float64) error {
	slog.Info("bench: a sample while a forward_backward runs")
	b, err := e.Info().PrepareBatch(data, "cross_entropy", nil)
	if err != nil {
		return err
	}
	rep := replica.New("bench", "bench", e, 4)
	defer rep.Close()
	start := time.Now()
	op := make(chan error, 1)
	go func() {
		_, err := rep.ForwardBackward(context.Background(), replica.Adapter{ID: "bench", Lane: "trainer"}, b)
		op <- err
	}()
	// Wait until the op is on the replica (a small model's may even have ended by then).
	var opErr error
	opDone := false
	for rep.QueueDepth() == 0 && !opDone {
		select {
		case opErr = <-op:
			opDone = true
		case <-time.After(time.Millisecond):
		}
	}
	if !opDone {
		time.Sleep(200 * time.Millisecond) // well inside a long op
	}
	asked := time.Now()
	answered := make(chan replica.SampleOutcome, 1)
	req := engine.SampleRequest{Prompt: data[0].Tokens[:4], NumSamples: 1, Params: engine.SampleParams{MaxTokens: 1}}
	if err := rep.Sample(replica.Weights{Lane: "sampler"}, replica.SampleJob{Req: req, Done: func(o replica.SampleOutcome) { answered <- o }}); err != nil {
		return err
	}
	o := <-answered
	if o.Err != nil {
		return o.Err
	}
	wait := time.Since(asked)
	if !opDone {
		opErr = <-op
	}
	if opErr != nil {
		return opErr
	}
	res["turn_sample_wait_s"] = wait.Seconds()
	res["turn_op_s"] = time.Since(start).Seconds()
	return nil
}

// peakRSS is the process's peak resident memory so far (Linux: VmHWM in /proc/self/status).
func peakRSS() (int64, error) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			var kb int64
			if _, err := fmt.Sscan(strings.TrimSuffix(strings.TrimSpace(v), " kB"), &kb); err != nil {
				return 0, err
			}
			return kb << 10, nil
		}
	}
	return 0, errors.New("no VmHWM in /proc/self/status")
}

// writeHeapProfile writes the heap profile (what is live as of the last collection) to path.
func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.WriteHeapProfile(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// limitMemoryToPlan sets a soft memory limit at the training plan for a training-only run.
func limitMemoryToPlan(e *engine.Engine, c benchConfig, log *slog.Logger) {
	// The collector's goal is twice the live heap, and a model's weights are Go memory: left
	// alone, garbage grows toward the weights' size again (the 1b preset in bf16: 4.4 GB
	// resident against 3.7 planned; with a limit at the plan, 3.8). A soft limit at the plan
	// (+5%) measures what training holds, not how lazily it is collected. At the plan itself
	// an 8B shape over Q4_K held 130 MB less but stepped 1.5× slower: its free step buffers
	// of other shapes put the live heap just over the plan, and the collector ran on and on.
	plan := e.PlanTraining(c.batch, c.seq, engine.LoraConfig{Rank: c.rank, TrainAttn: true, TrainMLP: true})
	limit := plan.Total() + plan.Total()/20
	debug.SetMemoryLimit(limit)
	log.Info("bench: soft memory limit at the plan", "bytes", limit)
}

// benchLoad loads the model and creates the bench's adapter, and reports loading apart from
// training: its seconds and peak resident memory (quantizing at load holds the file's pages and
// conversion copies that training never does). The peak is then reset (Linux clear_refs 5), so
// train_rss_mb is what training holds; where it cannot be, train_rss_mb is the process's.
func benchLoad(c benchConfig, ggmlAct bool, log *slog.Logger) (*engine.Engine, map[string]float64, error) {
	loadStart := time.Now()
	e, err := engine.Load(c.model, engine.Options{MaxBatchTokens: c.batch * c.seq, Precision: c.precision, GGMLActivations: ggmlAct, Device: c.device, Logger: log})
	if err != nil {
		return nil, nil, err
	}
	if _, err := e.CreateAdapter("bench", engine.LoraConfig{Rank: c.rank, TrainAttn: true, TrainMLP: true}); err != nil {
		return nil, nil, err
	}
	loaded := map[string]float64{"load_s": time.Since(loadStart).Seconds()}
	if hwm, err := peakRSS(); err == nil {
		loaded["load_rss_mb"] = float64(hwm) / (1 << 20)
		runtime.GC()
		debug.FreeOSMemory()
		loaded["rss_reset"] = 0
		if resetPeakRSS() == nil {
			loaded["rss_reset"] = 1
		}
	}
	return e, loaded, nil
}

// resetPeakRSS sets the process's peak resident memory back to what is resident now (Linux 4.0+:
// writing 5 to /proc/self/clear_refs).
func resetPeakRSS() error {
	return os.WriteFile("/proc/self/clear_refs", []byte("5"), 0)
}

// benchReport prints the results: one JSON object, or lines for a person.
func benchReport(e *engine.Engine, c benchConfig, res map[string]float64) error {
	if c.asJSON {
		out := map[string]any{"precision": c.precision,
			// The float32 GEMM (the peak's, and that of products over float32 weights); on a bf16
			// path, products over bf16 weights run in bf16 instead (gemm_path).
			"peak_gemm": engine.GEMMName(), "gemm_path": engine.KernelPath(), "gemm_paths": engine.KernelPaths(),
			// what "auto" picks here before the start-up check (the best of gemm_paths)
			"gemm_default": engine.DefaultKernelPath(), "device": e.Device()}
		for k, v := range res {
			out[k] = v
		}
		b, _ := json.Marshal(out)
		fmt.Fprintln(benchOutput, string(b))
		return nil
	}
	fmt.Fprintf(benchOutput, "model %s (%s, hidden %d, %d layers), batch %d × seq %d, LoRA rank %d\n", c.model, e.Config.Arch,
		e.Config.HiddenSize, e.Config.NumHiddenLayers, c.batch, c.seq, c.rank)
	fmt.Fprintf(benchOutput, "train: %.0f tokens/s, %.1f ms per forward_backward+optim_step (best; mean %.1f), %.1f GFLOP/s (matmul peak %.1f GFLOP/s, %.0f%%), %.0f MB of activations\n",
		res["train_tokens_per_s"], res["step_ms"], res["step_ms_mean"], res["train_gflops"], res["peak_gflops"], 100*res["train_gflops"]/res["peak_gflops"], res["step_peak_mb"])
	fmt.Fprintf(benchOutput, "load: %.1f s, peak resident %.0f MB\n", res["load_s"], res["load_rss_mb"])
	fmt.Fprintf(benchOutput, "memory: peak resident %.0f MB; through training %.0f MB (Go heap live after it %.0f MB), planned %.0f MB (weights %.0f, adapter %.0f, largest pass %.0f)\n",
		res["peak_rss_mb"], res["train_rss_mb"], res["heap_live_mb"], res["plan_train_mb"], res["plan_weights_mb"], res["plan_adapter_mb"], res["plan_step_mb"])
	fmt.Fprintf(benchOutput, "weights: %.0f MB (%s); kernel path %s (CPU has %v); first-step loss %.6f\n", res["weights_mb"], c.precision,
		engine.KernelPath(), engine.KernelPaths(), res["first_loss"])
	if c.trainOnly {
		return nil
	}
	fmt.Fprintf(benchOutput, "decode: %.1f tokens/s at batch 1, %.1f at batch 8, %.1f at batch 64\n", res["decode_tokens_per_s_b1"], res["decode_tokens_per_s_b8"], res["decode_tokens_per_s_b64"])
	if v, ok := res["tenants_sample_tokens_per_s"]; ok {
		fmt.Fprintf(benchOutput, "tenants: %.0f adapters with one request each %.1f tokens/s, one adapter with %.0f requests %.1f (ratio %.2f); 64 adapters %.1f tokens/s (%.2f of 8)\n",
			res["tenants"], v, res["tenants"], res["one_adapter_sample_tokens_per_s"], res["tenants_sample_ratio"], res["tenants64_sample_tokens_per_s"], res["tenants64_vs_8_ratio"])
	}
	if v, ok := res["tenants_train_ratio"]; ok {
		fmt.Fprintf(benchOutput, "tenants: 4 adapters' forward_backward at once %.0f tokens/s, one adapter's 4 back to back %.0f (ratio %.2f)\n",
			res["tenants_train_tokens_per_s"], res["one_adapter_train_tokens_per_s"], v)
	}
	fmt.Fprintf(benchOutput, "turns: a 1-token sample waited %.2f s while a %.1f s forward_backward ran\n", res["turn_sample_wait_s"], res["turn_op_s"])
	if v, ok := res["vision_images_per_s"]; ok {
		fmt.Fprintf(benchOutput, "vision: %.1f images/s (%d×%d pixels, tower alone); train with one image per sequence: %.0f tokens/s\n",
			v, c.imageSide, c.imageSide, res["train_tokens_per_s_images"])
	}
	cs := e.CompileStats()
	fmt.Fprintf(benchOutput, "matmul compiles: %d, %.3f s in all\n", cs.Count, cs.Total.Seconds())
	return nil
}

// benchToken is a random token of the vocabulary that is not the image pad token: a pad token
// in a sequence without images is refused.
func benchToken(rng *rand.Rand, c *engine.Config) int {
	for {
		t := rng.IntN(c.VocabSize)
		if c.ImageTokenID == nil || t != *c.ImageTokenID {
			return t
		}
	}
}

// benchImages adds a vision-language model's keys to res: vision_images_per_s, the vision tower
// alone on n images of side×side pixels, and train_tokens_per_s_images, the best of steps
// training steps on batch sequences of seq tokens that each hold one such image (its pad
// tokens count as tokens) and random text.
func benchImages(e *engine.Engine, res map[string]float64, step func([]engine.Datum) error, rng *rand.Rand, batch, seq, n, side, steps int) error {
	c := e.Config
	if c.VisionStartTokenID == nil || c.VisionEndTokenID == nil {
		return fmt.Errorf("bench: %s has no vision start and end tokens", c.Arch)
	}
	if n < 1 || n > 1024 {
		return fmt.Errorf("--images %d: want 1…1024", n)
	}
	img, err := engine.BenchImage(c.VisionConfig, side)
	if err != nil {
		return err
	}
	perS, err := e.VisionImagesPerSecond(img, n)
	if err != nil {
		return err
	}
	res["vision_images_per_s"] = perS

	g, m := img.Grids[0], c.VisionConfig.SpatialMergeSize
	pads := g[0] * (g[1] / m) * (g[2] / m)
	if seq < pads+3 {
		return fmt.Errorf("--seq %d is too short for a %d×%d image: it takes %d tokens, and start, end and one text token", seq, side, side, pads+2)
	}
	dim := len(img.PixelValues) / (g[0] * g[1] * g[2])
	data := make([]engine.Datum, batch)
	for i := range data {
		toks := append([]int{*c.VisionStartTokenID}, slices.Repeat([]int{*c.ImageTokenID}, pads)...)
		toks = append(toks, *c.VisionEndTokenID)
		for len(toks) < seq {
			toks = append(toks, benchToken(rng, c))
		}
		tg, w := make([]float64, seq), make([]float64, seq)
		for j := range tg {
			tg[j], w[j] = float64(benchToken(rng, c)), 1
		}
		data[i] = engine.Datum{Tokens: toks, Inputs: map[string]engine.TensorInput{
			"target_tokens":         {DType: "int64", Data: tg},
			"weights":               {DType: "float32", Data: w},
			engine.PixelValuesInput: {DType: "float32", Shape: []int{len(img.PixelValues) / dim, dim}, Data: img.PixelValues},
			engine.ImageGridInput:   {DType: "int64", Shape: []int{1, 3}, Data: []float64{float64(g[0]), float64(g[1]), float64(g[2])}}}}
	}
	if err := step(data); err != nil { // compile
		return err
	}
	best := time.Duration(1 << 62)
	for range steps {
		t0 := time.Now()
		if err := step(data); err != nil {
			return err
		}
		best = min(best, time.Since(t0))
	}
	res["train_tokens_per_s_images"] = float64(batch*seq) / best.Seconds()
	return nil
}
