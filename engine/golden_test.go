package engine

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/skein-ai/skein/engine/internal/kernels"
)

// The golden bits: a hash of the float32 bits of what the engine computes — logprobs and
// per-token losses of forward_backward under two losses, the LoRA gradients, the weights after
// one AdamW step, a forward-only pass, and seeded samples (tokens, their logprobs, prompt
// logprobs, two adapters in one batch) — for tiny llama, qwen3, qwen3_5 and qwen3_vl (with
// images), in f32, bf16 and q8_0 and the float64 engine, on the kernel path this test runs on.
// Each path has its own file in testdata/golden (paths round differently); .ci/run runs the engine
// suite on every path the CPU has. A refactor of the engine (the backend seam) must keep every
// hash; a change that means to change numbers regenerates the files with -golden-update and says
// why in its commit. A change that moves a path no machine at hand has (AMX, on most of ours)
// marks those hashes goldenUnrecorded in that path's file: they go unchecked there, and the rest
// of that file is still checked, until a machine with the path rewrites the file.
var goldenUpdate = flag.Bool("golden-update", false, "rewrite testdata/golden/<kernel path>.txt from this run")

// goldenUnrecorded stands in a golden file for a hash that changed on purpose on a machine that
// could not compute it for that file's path.
const goldenUnrecorded = "unrecorded"

// goldenHash hashes float32 bits (all bits, f64: the float64 engine's), ints and strings in order.
type goldenHash struct {
	b   []byte
	f64 bool
}

func (g *goldenHash) f(vs ...float64) {
	for _, v := range vs {
		if g.f64 {
			g.b = binary.LittleEndian.AppendUint64(g.b, math.Float64bits(v))
		} else {
			g.b = binary.LittleEndian.AppendUint32(g.b, math.Float32bits(float32(v)))
		}
	}
}

func (g *goldenHash) i(vs ...int) {
	for _, v := range vs {
		g.b = binary.LittleEndian.AppendUint64(g.b, uint64(v))
	}
}

func (g *goldenHash) s(v string) { g.b = append(append(g.b, v...), 0) }

func (g *goldenHash) sum() string {
	h := sha256.Sum256(g.b)
	return hex.EncodeToString(h[:12])
}

// goldenCase is one model and precision.
type goldenCase struct {
	arch  Arch
	opts  Options
	name  string
	tweak func(e *Engine) // the engine's memory choices forced the other way (nil: as they are)
}

func goldenCases() []goldenCase {
	var cs []goldenCase
	for _, arch := range []Arch{ArchLlama, ArchQwen3, ArchQwen3_5, ArchQwen3VL} {
		for _, prec := range []string{PrecisionF32, PrecisionBF16} {
			cs = append(cs, goldenCase{arch: arch, opts: Options{Precision: prec}, name: string(arch) + "/" + prec})
		}
	}
	cs = append(cs,
		goldenCase{arch: ArchQwen3, opts: Options{Precision: PrecisionQ8_0}, name: "qwen3/q8_0"},
		goldenCase{arch: ArchQwen3, opts: Options{Float64: true}, name: "qwen3/f64"},
		goldenCase{arch: ArchQwen3_5, opts: Options{Float64: true}, name: "qwen3_5/f64"})
	// Recomputed layers and probabilities, merged weights not kept, the head and attention in
	// small tiles and chunks, quantized pairs in chunks: the memory plan's other branches.
	for _, prec := range []string{PrecisionF32, PrecisionQ8_0} {
		cs = append(cs, goldenCase{arch: ArchQwen3, opts: Options{Precision: prec}, name: "qwen3/" + prec + "/low-memory",
			tweak: func(e *Engine) {
				yes, no := true, false
				e.recompute, e.keepMerged = &yes, &no
				e.recomputeProbs = func(int) bool { return true }
				e.headTile, e.attnChunk, e.pairsChunk = 16, 8, 32
			}})
	}
	return cs
}

// goldenRun computes one case's hashes, one per stage, so a mismatch names what changed.
func goldenRun(t *testing.T, gc goldenCase) map[string]string {
	e := loadTiny(t, gc.arch, gc.opts)
	if gc.tweak != nil {
		gc.tweak(e)
	}
	ctx := context.Background()
	out := map[string]string{}
	text := []string{
		"The quick brown fox jumps over the lazy dog. The dog sleeps in the sun all day long.",
		"Pack my box with five dozen liquor jugs.",
	}
	var data []Datum
	for _, s := range text {
		data = append(data, textDatum(e.Tokenizer.Encode(s)))
	}
	var images *Images
	if gc.arch == ArchQwen3VL {
		ref := loadVLReference(t, "testdata/reference_vl.json")
		images = referenceImages(e.Config, ref.Grids)
		data = append(data, vlDatum(e.Config, ref.Tokens, images))
	}
	// importance_sampling's inputs: logprobs and advantages per position.
	is := make([]Datum, len(data))
	for i, d := range data {
		n := len(d.Tokens)
		lp, adv := make([]float64, n), make([]float64, n)
		for j := range n {
			lp[j], adv[j] = -2-0.01*float64(j), float64(j%3)-1
		}
		in := map[string]TensorInput{}
		for k, v := range d.Inputs {
			if k != "weights" {
				in[k] = v
			}
		}
		in["logprobs"] = TensorInput{DType: "float32", Data: lp}
		in["advantages"] = TensorInput{DType: "float32", Data: adv}
		is[i] = Datum{Tokens: d.Tokens, Inputs: in}
	}
	a, err := e.CreateAdapter("a", LoraConfig{Rank: 4, Seed: 7, TrainAttn: true, TrainMLP: true, TrainUnembed: true})
	if err != nil {
		t.Fatal(err)
	}
	// B is zero at creation: give it numbers so every product of the LoRA counts.
	for i := 1; i < len(a.params); i += 2 {
		w := make([]float64, a.params[i].size())
		for j := range w {
			w[j] = 0.01 * math.Sin(float64(7*i+j))
		}
		a.params[i].setFloat64s('w', w)
	}
	hashResult := func(stage string, r *ForwardResult) {
		g := goldenHash{f64: gc.opts.Float64}
		for _, lp := range r.Logprobs {
			g.f(lp...)
		}
		for _, l := range r.Losses {
			g.f(l...)
		}
		g.f(r.Loss)
		keys := make([]string, 0, len(r.Metrics))
		for k := range r.Metrics {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			g.s(k)
			g.f(r.Metrics[k])
		}
		out[stage] = g.sum()
	}
	for _, loss := range []struct {
		name string
		data []Datum
	}{{"cross_entropy", data}, {"importance_sampling", is}, {"cross_entropy", data[:1]}} {
		r, err := e.ForwardBackward(ctx, "a", loss.data, loss.name, nil)
		if err != nil {
			t.Fatalf("%s: %v", loss.name, err)
		}
		hashResult(fmt.Sprintf("forward_backward/%s/%d", loss.name, len(loss.data)), r)
	}
	g := goldenHash{f64: gc.opts.Float64}
	for _, p := range a.params {
		g.s(p.name)
		g.f(p.float64s('g')...)
	}
	out["gradients"] = g.sum()
	p := DefaultAdamParams()
	p.LearningRate = 1e-2
	p.WeightDecay = 0.01
	metrics, err := e.OptimStep(ctx, "a", p)
	if err != nil {
		t.Fatal(err)
	}
	g = goldenHash{f64: gc.opts.Float64}
	for _, q := range a.params {
		g.f(q.float64s('w')...)
		g.f(q.float64s('m')...)
		g.f(q.float64s('v')...)
	}
	keys := make([]string, 0, len(metrics))
	for k := range metrics {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		g.s(k)
		g.f(metrics[k])
	}
	out["adamw"] = g.sum()
	r, err := e.Forward(ctx, "a", data, "cross_entropy", nil)
	if err != nil {
		t.Fatal(err)
	}
	hashResult("forward", r)

	// Samples: one adapter with prompt logprobs; then the adapter and the base model in one batch.
	if _, err := e.CreateAdapter("b", LoraConfig{Rank: 2, Seed: 9, TrainAttn: true}); err != nil {
		t.Fatal(err)
	}
	seed := int64(11)
	prompt := e.Tokenizer.Encode("Once upon a time")
	req := SampleRequest{Prompt: prompt, NumSamples: 3, PromptLogprobs: true, TopKPromptLogprobs: 2,
		Params: SampleParams{MaxTokens: 6, Temperature: 1, TopK: 20, TopP: 0.9, Seed: &seed}}
	reqs := []SampleRequest{req}
	if images != nil {
		ref := loadVLReference(t, "testdata/reference_vl.json")
		vl := req
		vl.Prompt, vl.Images, vl.PromptLogprobs = ref.Tokens, images, false
		reqs = append(reqs, vl)
	}
	hashSamples := func(stage string, res []*SampleResult) {
		g := goldenHash{f64: gc.opts.Float64}
		for _, sr := range res {
			for _, sq := range sr.Sequences {
				g.i(sq.Tokens...)
				g.f(sq.Logprobs...)
			}
			g.f(sr.PromptLogprobs...)
			for _, row := range sr.TopKPrompt {
				for _, tk := range row {
					g.i(tk.Token)
					g.f(tk.Logprob)
				}
			}
		}
		out[stage] = g.sum()
	}
	res, err := e.SampleBatch(ctx, "a", reqs)
	if err != nil {
		t.Fatal(err)
	}
	hashSamples("sample", res)
	mixed := []SampleRequest{req, req, req}
	mixed[0].Adapter, mixed[1].Adapter, mixed[2].Adapter = "a", "b", ""
	mixed[1].Params.Temperature = 0
	for i := range mixed {
		mixed[i].PromptLogprobs, mixed[i].TopKPromptLogprobs = false, 0
	}
	res, err = e.SampleBatch(ctx, "a", mixed)
	if err != nil {
		t.Fatal(err)
	}
	hashSamples("sample/adapters", res)
	return out
}

func TestGoldenBits(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	path := kernels.Active().String()
	file := filepath.Join("testdata", "golden", path+".txt")
	got := map[string]string{}
	for _, gc := range goldenCases() {
		for stage, h := range goldenRun(t, gc) {
			got[gc.name+" "+stage] = h
		}
	}
	keys := make([]string, 0, len(got))
	for k := range got {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	if *goldenUpdate {
		var b strings.Builder
		fmt.Fprintf(&b, "# engine golden bits on kernel path %s (go test ./engine -run TestGoldenBits -golden-update)\n", path)
		for _, k := range keys {
			fmt.Fprintf(&b, "%s %s\n", k, got[k])
		}
		if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(file, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %s (%d hashes)", file, len(keys))
		return
	}
	raw, err := os.ReadFile(file)
	if os.IsNotExist(err) {
		t.Skipf("no golden bits for kernel path %s yet: run with -golden-update on a machine that has it (and check the commit before)", path)
	}
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	for _, line := range strings.Split(string(raw), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		want[line[:i]] = line[i+1:]
	}
	var bad, unrecorded []string
	for _, k := range keys {
		if want[k] == goldenUnrecorded {
			unrecorded = append(unrecorded, k)
			continue
		}
		if want[k] != got[k] {
			bad = append(bad, fmt.Sprintf("%s: %s, golden %s", k, got[k], want[k]))
		}
	}
	for k := range want {
		if _, ok := got[k]; !ok {
			bad = append(bad, k+": not computed")
		}
	}
	if len(unrecorded) > 0 {
		t.Logf("on kernel path %s, %d hashes are %q in %s (a change to their numbers landed on a machine without this path): rewrite the file here with -golden-update: %s",
			path, len(unrecorded), goldenUnrecorded, file, strings.Join(unrecorded, ", "))
	}
	if len(bad) > 0 {
		slices.Sort(bad)
		t.Fatalf("on kernel path %s, %d of %d hashes differ from %s:\n%s", path, len(bad), len(want), file, strings.Join(bad, "\n"))
	}
}
