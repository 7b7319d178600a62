package engine

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/skein-ai/skein/safetensors"
)

// bigHeadModel writes the tiny model of arch with its vocabulary grown to V (the tokenizer keeps
// its ids; the new embedding rows, and an untied head's, are deterministic noise), so that the
// head outweighs a layer as it does in real models (Qwen3-0.6B: ten layers' worth).
func bigHeadModel(t *testing.T, arch Arch, V int) string {
	t.Helper()
	src := tinyModel(t, arch)
	st, err := safetensors.ReadFile(filepath.Join(src, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]safetensors.Tensor{}
	for name, tn := range st.Tensors {
		out[name] = tn
		if name != "model.embed_tokens.weight" && name != "lm_head.weight" {
			continue
		}
		f, err := tn.Float32()
		if err != nil {
			t.Fatal(err)
		}
		D := tn.Shape[1]
		grown := make([]float32, V*D)
		copy(grown, f)
		for i := len(f); i < len(grown); i++ {
			grown[i] = float32(0.1 * math.Sin(float64(i)*0.7))
		}
		out[name] = safetensors.FromFloat32(grown, V, D)
	}
	cb, err := os.ReadFile(filepath.Join(src, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(cb, &cfg); err != nil {
		t.Fatal(err)
	}
	cfg["vocab_size"] = V
	cb, _ = json.Marshal(cfg)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "config.json"), cb, 0o644); err != nil {
		t.Fatal(err)
	}
	tok, err := os.ReadFile(filepath.Join(src, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), tok, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := safetensors.WriteFile(filepath.Join(dir, "model.safetensors"), out, nil); err != nil {
		t.Fatal(err)
	}
	return dir
}

// The step-memory estimate that sizes chunks bounds a training pass's measured peak when the
// head is big, in either precision: a bf16 pass also holds one widened weight at a time (the
// head, at the head's products), and a pass that merges the head's LoRA holds the merged head.
// One sequence of 80 tokens over a vocabulary of 4096: the head is a quarter of the estimate.
func TestStepMemoryEstimateCountsTheHead(t *testing.T) {
	for _, arch := range []Arch{ArchQwen3, ArchLlama} {
		dir := bigHeadModel(t, arch, 4096)
		for _, prec := range []string{PrecisionF32, PrecisionBF16} {
			for _, unembed := range []bool{false, true} {
				e, err := Load(dir, Options{Precision: prec})
				if err != nil {
					t.Fatal(err)
				}
				a, err := e.CreateAdapter("m", LoraConfig{Rank: 4, TrainAttn: true, TrainMLP: true, TrainUnembed: unembed})
				if err != nil {
					t.Fatal(err)
				}
				ids := make([]int, 81)
				for i := range ids {
					ids[i] = (i*37)%400 + 3
				}
				if _, err := e.ForwardBackward(context.Background(), "m", []Datum{textDatum(ids)}, "cross_entropy", nil); err != nil {
					t.Fatal(err)
				}
				T := padLen(80)
				estimate := 4 * e.stepElems(1, T, false, a)
				got := e.PeakStepBytes()
				t.Logf("%s %s, LoRA on the head %v: peak %d bytes, estimate %d", arch, prec, unembed, got, estimate)
				if got > estimate {
					t.Errorf("%s %s, LoRA on the head %v: a pass of %d tokens held %d bytes; the estimate is %d", arch, prec, unembed, T, got, estimate)
				}
			}
		}
	}
}
