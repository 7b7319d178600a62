package engine

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/skein-ai/skein/safetensors"
)

// isMoEArch reports the mixture-of-experts families (their tiny models use the tiny-moe preset).
func isMoEArch(a Arch) bool {
	return a == ArchQwen3MoE || a == ArchQwen3_5MoE || a == ArchQwen3_5MoEText
}

var moeArchs = []Arch{ArchQwen3MoE, ArchQwen3_5MoE}

// Every LoRA parameter of a mixture of experts — the experts' shared-outer factors (w1, w3, w2),
// the shared expert's, attention's — has the gradient finite differences give, in float64,
// through the router (frozen, but on the path to everything below it). Three tokens take 6
// expert slots of 8, so at least two experts see no token: their per-expert factors' gradients
// are exactly zero.
func TestMoEGradientsMatchFiniteDifferences(t *testing.T) {
	for _, arch := range moeArchs {
		t.Run(string(arch), func(t *testing.T) {
			e := loadTiny(t, arch, Options{Float64: true})
			checkMoEGradients(t, e, []int{5, 17, 300, 42})
		})
	}
}

func checkMoEGradients(t *testing.T, e *Engine, ids []int) {
	a := adapterWithB(t, e, "g", LoraConfig{Rank: 2, Seed: 5, TrainAttn: true, TrainMLP: true, TrainUnembed: true},
		func(i, j int) float64 { return 0.05 * math.Sin(float64(5*j+i)) })
	data := []Datum{textDatum(ids)}
	if _, err := e.ForwardBackward(context.Background(), "g", data, "cross_entropy", nil); err != nil {
		t.Fatal(err)
	}
	lossAt := func() float64 {
		r, err := e.Forward(context.Background(), "g", data, "cross_entropy", nil)
		if err != nil {
			t.Fatal(err)
		}
		return r.Loss
	}
	checked := map[string]int{}
	zeroExperts := 0
	for _, p := range a.params {
		if !strings.Contains(p.name, "layers.0.") && !strings.Contains(p.name, "layers.1.") && !strings.Contains(p.name, "lm_head") {
			continue
		}
		n := hostState(numbersOf[float64](p))
		js := []int{0, len(n.w) / 3, len(n.w) - 1}
		for _, j := range js {
			orig := n.w[j]
			const h = 1e-6
			n.w[j] = orig + h
			up := lossAt()
			n.w[j] = orig - h
			down := lossAt()
			n.w[j] = orig
			fd := (up - down) / (2 * h)
			if g := n.g[j]; math.Abs(fd-g) > 1e-6*(1+math.Abs(fd)) {
				t.Fatalf("%s elem %d: backward %.10g, finite difference %.10g", p.name, j, g, fd)
			}
		}
		checked[p.name]++
		if strings.Contains(p.name, "experts.w") && (strings.Contains(p.name, "w2.lora_A") || strings.Contains(p.name, "w1.lora_B")) {
			// Per-expert blocks of the gradient: an expert no token reached has a zero block.
			rows := len(n.g) / len(modelOf[float64](e.base).moes[0].experts)
			for b := 0; b < len(n.g); b += rows {
				zero := true
				for _, g := range n.g[b : b+rows] {
					zero = zero && g == 0
				}
				if zero {
					zeroExperts++
				}
			}
		}
	}
	for _, want := range []string{"experts.w1.lora_A", "experts.w1.lora_B", "experts.w3.lora_A", "experts.w3.lora_B",
		"experts.w2.lora_A", "experts.w2.lora_B", "q_proj.lora_A", "lm_head.lora_B", "mlp."} {
		found := false
		for name := range checked {
			found = found || strings.Contains(name, want)
		}
		if !found {
			t.Fatalf("no %s checked (%v)", want, checked)
		}
	}
	if zeroExperts < 2 {
		t.Fatalf("%d idle experts' gradient blocks are zero, want at least 2 (6 slots for 8 experts, two factors)", zeroExperts)
	}
}

// The released-shape presets are Qwen3-30B-A3B's and Qwen3.5/3.6-35B-A3B's text stacks, and a
// LoRA on them has, per rank and component, the parameters of Tinker's cookbook table
// (hyperparam_utils._LORA_PARAMS_PER_RANK_BY_COMPONENT): only the shared-outer layout (one
// factor on the hidden side shared by every expert, no router term) gives those counts; at the
// SDK's default rank 32, Qwen3-30B-A3B's MLP part alone is 462 M parameters.
func TestMoEPresetsAreTheReleasedShapesAndCountLikeTinker(t *testing.T) {
	for _, c := range []struct {
		arch                Arch
		preset              string
		params              int
		mlp, attn, unembed  int
		layers, attention   int
		experts, perTok, sh int
	}{
		{ArchQwen3MoE, "qwen3-30b-a3b", 30_532_122_624, 14_450_688, 835_584, 153_984, 48, 48, 128, 8, 0},
		{ArchQwen3_5MoE, "qwen3_5-35b-a3b", 0, 16_281_600, 1_013_760, 250_368, 40, 10, 256, 8, 512},
	} {
		_, cfg, err := tinyConfigFile(families[c.arch].(tinyFamily), nil, Presets[c.preset], nil, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		if c.params > 0 {
			if got := tinyParams(cfg); got != c.params {
				t.Errorf("%s: %d parameters, the released model has %d", c.preset, got, c.params)
			}
		}
		moeLayers := 0
		for l := range cfg.NumHiddenLayers {
			if cfg.isMoE(l) {
				moeLayers++
			}
		}
		if cfg.NumHiddenLayers != c.layers || cfg.attentionLayers() != c.attention || moeLayers != c.layers ||
			cfg.NumExperts != c.experts || cfg.NumExpertsPerTok != c.perTok || cfg.SharedExpertIntermediateSize != c.sh || !cfg.moeRenorm {
			t.Fatalf("%s: %d layers (%d attention, %d MoE), %d experts, %d a token, shared %d, renormalised %v", c.preset,
				cfg.NumHiddenLayers, cfg.attentionLayers(), moeLayers, cfg.NumExperts, cfg.NumExpertsPerTok, cfg.SharedExpertIntermediateSize, cfg.moeRenorm)
		}
		perRank := func(s loraSpec) int {
			n := 0
			for _, m := range cfg.loraModules(s) {
				n += m.params(1)
			}
			return n
		}
		for _, w := range []struct {
			name string
			spec loraSpec
			want int
		}{{"mlp", loraSpec{MLP: true}, c.mlp}, {"attn", loraSpec{Attn: true}, c.attn}, {"unembed", loraSpec{Unembed: true}, c.unembed}} {
			if got := perRank(w.spec); got != w.want {
				t.Errorf("%s %s: %d LoRA parameters per rank, Tinker counts %d", c.preset, w.name, got, w.want)
			}
		}
	}
}

// copyModelDir copies a generated model's files but its weights into a new directory.
func copyModelDir(t *testing.T, src string) string {
	t.Helper()
	dst := t.TempDir()
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range entries {
		if f.Name() == "model.safetensors" {
			continue
		}
		b, err := os.ReadFile(filepath.Join(src, f.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, f.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

// A checkpoint with fused experts (transformers 5's and Qwen3.5-MoE's mlp.experts.gate_up_proj
// [E, 2I, D], gate rows first, and mlp.experts.down_proj [E, D, I]) loads to the very model its
// per-expert form does: the same logits bit for bit, with and without an adapter.
func TestMoEFusedExpertCheckpointLoadsTheSame(t *testing.T) {
	for _, arch := range moeArchs {
		t.Run(string(arch), func(t *testing.T) {
			src := tinyModel(t, arch)
			f, err := safetensors.ReadFile(filepath.Join(src, "model.safetensors"))
			if err != nil {
				t.Fatal(err)
			}
			c, err := LoadConfig(src)
			if err != nil {
				t.Fatal(err)
			}
			out := map[string]safetensors.Tensor{}
			for name, tt := range f.Tensors {
				if !strings.Contains(name, ".mlp.experts.") {
					out[name] = tt
				}
			}
			E, I, D := c.NumExperts, c.MoeIntermediateSize, c.HiddenSize
			for l := range c.NumHiddenLayers {
				if !c.isMoE(l) {
					continue
				}
				p := c.layerPrefix(l) + "mlp.experts."
				var gateUp, down []byte
				for e := range E {
					x := p + strconv.Itoa(e) + "."
					gateUp = append(gateUp, f.Tensors[x+"gate_proj.weight"].Data...)
					gateUp = append(gateUp, f.Tensors[x+"up_proj.weight"].Data...)
					down = append(down, f.Tensors[x+"down_proj.weight"].Data...)
				}
				dt := f.Tensors[p+"0.gate_proj.weight"].DType
				out[p+"gate_up_proj"] = safetensors.Tensor{DType: dt, Shape: []int{E, 2 * I, D}, Data: gateUp}
				out[p+"down_proj"] = safetensors.Tensor{DType: dt, Shape: []int{E, D, I}, Data: down}
			}
			dst := copyModelDir(t, src)
			if err := safetensors.WriteFile(filepath.Join(dst, "model.safetensors"), out, map[string]string{"format": "pt"}); err != nil {
				t.Fatal(err)
			}
			sep := loadTiny(t, arch, Options{})
			fused, err := Load(dst, Options{})
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range []*Engine{sep, fused} {
				adapterWithB(t, e, "x", LoraConfig{Rank: 3, Seed: 2, TrainAttn: true, TrainMLP: true},
					func(i, j int) float64 { return 0.05 * math.Cos(float64(3*j+i)) })
			}
			for _, id := range []string{"", "x"} {
				a, b := logitsOf(t, sep, id, referenceTokens), logitsOf(t, fused, id, referenceTokens)
				if !slices.Equal(a, b) {
					t.Fatalf("adapter %q: fused experts give other logits (max difference %.3g)", id, maxDiff(a, b))
				}
			}
			// A fused tensor of the wrong shape is refused at load, naming it.
			bad := copyModelDir(t, src)
			p := c.layerPrefix(0) + "mlp.experts.down_proj"
			tt := out[p]
			out[p] = safetensors.Tensor{DType: tt.DType, Shape: []int{E, I, D}, Data: tt.Data}
			if err := safetensors.WriteFile(filepath.Join(bad, "model.safetensors"), out, nil); err != nil {
				t.Fatal(err)
			}
			if _, err := Load(bad, Options{}); err == nil || !strings.Contains(err.Error(), "down_proj") {
				t.Fatalf("a transposed fused down_proj: %v", err)
			}
			out[p] = tt
		})
	}
}

// norm_topk_prob false (transformers' default for Qwen3-MoE) weights experts by their plain
// probabilities: the router's gradient then reaches every expert's logit, not only the chosen
// ones'. The gradients still match finite differences, and the model differs from the
// renormalised one.
func TestMoEWithoutRenormalisation(t *testing.T) {
	src := tinyModel(t, ArchQwen3MoE)
	dst := copyModelDir(t, src)
	b, err := os.ReadFile(filepath.Join(src, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dst, "model.safetensors"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	cb, _ := os.ReadFile(filepath.Join(src, "config.json"))
	if err := json.Unmarshal(cb, &cfg); err != nil {
		t.Fatal(err)
	}
	delete(cfg, "norm_topk_prob") // absent: transformers' default, false
	cb, _ = json.Marshal(cfg)
	if err := os.WriteFile(filepath.Join(dst, "config.json"), cb, 0o644); err != nil {
		t.Fatal(err)
	}
	e, err := Load(dst, Options{Float64: true})
	if err != nil {
		t.Fatal(err)
	}
	if e.Config.moeRenorm {
		t.Fatal("a config without norm_topk_prob renormalises")
	}
	checkMoEGradients(t, e, []int{5, 17, 300, 42})
	if a, b := logitsOf(t, e, "", referenceTokens), logitsOf(t, loadTiny(t, ArchQwen3MoE, Options{Float64: true}), "", referenceTokens); maxDiff(a, b) < 1e-3 {
		t.Fatalf("renormalising changes the logits by %.3g only", maxDiff(a, b))
	}
}

// Writes the inputs for scripts/reference_moe.py (development time only): the generated MoE
// models (InitTiny is deterministic), each with the fixture's adapter saved in Tinker's layout.
//
//	SKEIN_REFERENCE_INPUTS=/tmp/moe go test ./engine -run TestWriteMoEReferenceInputs
//	/usr/bin/python3 scripts/reference_moe.py /tmp/moe engine/testdata/reference_moe.json
func TestWriteMoEReferenceInputs(t *testing.T) {
	dir := os.Getenv("SKEIN_REFERENCE_INPUTS")
	if dir == "" {
		t.Skip("set SKEIN_REFERENCE_INPUTS=DIR to write the reference inputs")
	}
	var cases []referenceCase
	for _, arch := range moeArchs {
		md := filepath.Join(dir, string(arch))
		if err := InitTiny(md, arch, "tiny-moe", 1); err != nil {
			t.Fatal(err)
		}
		e, err := Load(md, Options{})
		if err != nil {
			t.Fatal(err)
		}
		referenceAdapter(t, e)
		if err := e.SaveAdapter(context.Background(), "ref", filepath.Join(md, "adapter"), false); err != nil {
			t.Fatal(err)
		}
		cases = append(cases, referenceCase{Arch: arch, Tokens: referenceTokens}, referenceCase{Arch: arch, Tokens: referenceTokens, Adapter: true})
	}
	b, _ := json.Marshal(map[string]any{"cases": cases})
	if err := os.WriteFile(filepath.Join(dir, "inputs.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// The engine's MoE logits equal an independent float64 transcription of Hugging Face's sparse
// blocks (scripts/reference_moe.py: a loop over the experts that received tokens, index_add of
// each one's output times its weight; each expert's LoRA applied to its own weight as the
// cookbook expands Tinker's layout for PEFT), with and without an adapter on every module kind
// (attention, DeltaNet, experts, shared expert, head), through the sampler's prefill and a
// training pass's logprobs; in float64 to 1e-10, in float32 to 1e-4.
func TestMoELogitsMatchReference(t *testing.T) {
	b, err := os.ReadFile("testdata/reference_moe.json")
	if err != nil {
		t.Fatal(err)
	}
	var fix struct {
		Cases []referenceCase `json:"cases"`
	}
	if err := json.Unmarshal(b, &fix); err != nil {
		t.Fatal(err)
	}
	if len(fix.Cases) != 2*len(moeArchs) {
		t.Fatalf("fixture has %d cases", len(fix.Cases))
	}
	for _, c := range fix.Cases {
		for _, f64 := range []bool{true, false} {
			tol := map[bool]float64{true: 1e-10, false: 1e-4}[f64]
			checkReferenceCase(t, loadTinyFresh(t, c.Arch, Options{Float64: f64}), c, f64, tol)
		}
	}
}

// A MoE adapter saved with its optimizer state (Tinker's 3-D expert files) loads back to the
// same numbers and trains on as the one that never left memory; its PEFT export expands each
// expert's LoRA onto the expert's own modules (the form vLLM loads), slice for slice.
func TestMoEAdapterSavesLoadsAndExportsExpanded(t *testing.T) {
	e := loadTiny(t, ArchQwen3_5MoE, Options{})
	a := adapterWithB(t, e, "s", LoraConfig{Rank: 3, Seed: 4, TrainAttn: true, TrainMLP: true},
		func(i, j int) float64 { return 0.02 * math.Sin(float64(7*j+i)) })
	ids := e.Tokenizer.Encode("Experts in a row, each with its own adapter.")
	trainSteps(t, e, "s", ids, 2)
	dir := t.TempDir()
	if err := e.SaveAdapter(context.Background(), "s", dir, true); err != nil {
		t.Fatal(err)
	}
	f, err := safetensors.ReadFile(filepath.Join(dir, AdapterWeightsFile))
	if err != nil {
		t.Fatal(err)
	}
	p := "base_model.model." + e.Config.layerPrefix(0) + "mlp.experts."
	E, I, D, r := e.Config.NumExperts, e.Config.MoeIntermediateSize, e.Config.HiddenSize, 3
	for name, shape := range map[string][]int{"w1.lora_A": {1, r, D}, "w1.lora_B": {E, I, r}, "w3.lora_A": {1, r, D},
		"w2.lora_A": {E, r, I}, "w2.lora_B": {1, D, r}} {
		if got := f.Tensors[p+name+".weight"].Shape; !slices.Equal(got, shape) {
			t.Fatalf("%s saved as %v, Tinker's layout is %v", name, got, shape)
		}
	}
	if err := e.LoadAdapter(context.Background(), "back", dir, true); err != nil {
		t.Fatal(err)
	}
	b, _ := e.adapter("back")
	for i, q := range a.params {
		if !slices.Equal(q.float64s('w'), b.params[i].float64s('w')) || !slices.Equal(q.float64s('v'), b.params[i].float64s('v')) {
			t.Fatalf("%s: loaded numbers differ", q.name)
		}
	}
	trainSteps(t, e, "s", ids, 1)
	trainSteps(t, e, "back", ids, 1)
	for i, q := range a.params {
		if !slices.Equal(q.float64s('w'), b.params[i].float64s('w')) {
			t.Fatalf("%s: a step after the reload differs", q.name)
		}
	}
	out := t.TempDir()
	if err := ExportAdapterPEFT(dir, e.Config, out); err != nil {
		t.Fatal(err)
	}
	x, err := safetensors.ReadFile(filepath.Join(out, AdapterWeightsFile))
	if err != nil {
		t.Fatal(err)
	}
	f32 := func(tt safetensors.Tensor) []float32 { v, _ := tt.Float32(); return v }
	w1B, w2A, w1A, w2B := f32(f.Tensors[p+"w1.lora_B.weight"]), f32(f.Tensors[p+"w2.lora_A.weight"]), f32(f.Tensors[p+"w1.lora_A.weight"]), f32(f.Tensors[p+"w2.lora_B.weight"])
	for _, ex := range []int{0, E - 1} {
		q := p + strconv.Itoa(ex) + "."
		if got := f32(x.Tensors[q+"gate_proj.lora_B.weight"]); !slices.Equal(got, w1B[ex*I*r:(ex+1)*I*r]) {
			t.Fatalf("expert %d gate_proj B is not w1.B[%d]", ex, ex)
		}
		if got := f32(x.Tensors[q+"gate_proj.lora_A.weight"]); !slices.Equal(got, w1A) {
			t.Fatalf("expert %d gate_proj A is not the shared w1.A", ex)
		}
		if got := f32(x.Tensors[q+"down_proj.lora_A.weight"]); !slices.Equal(got, w2A[ex*r*I:(ex+1)*r*I]) || !slices.Equal(x.Tensors[q+"down_proj.lora_A.weight"].Shape, []int{r, I}) {
			t.Fatalf("expert %d down_proj A is not w2.A[%d]", ex, ex)
		}
		if got := f32(x.Tensors[q+"down_proj.lora_B.weight"]); !slices.Equal(got, w2B) {
			t.Fatalf("expert %d down_proj B is not the shared w2.B", ex)
		}
	}
	if _, ok := x.Tensors[p+"w1.lora_A.weight"]; ok {
		t.Fatal("the expanded export kept Tinker's 3-D tensors")
	}
	cfg, err := ReadAdapterConfig(out)
	if err != nil || !cfg.TrainMLP || !cfg.TrainAttn || cfg.Rank != r {
		t.Fatalf("exported adapter config %+v, %v", cfg, err)
	}
}
