package engine

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/skein-ai/skein/engine/internal/kernels"
	"github.com/skein-ai/skein/safetensors"
)

// A BF16 preset writes what its f32 twin writes, rounded to bfloat16 (to nearest even), says so
// in config.json, and loads.
func TestInitTinyWritesBF16Presets(t *testing.T) {
	p := Presets["tiny"]
	p.BF16 = true
	Presets["tiny-bf16-test"] = p
	defer delete(Presets, "tiny-bf16-test")
	f32Dir, bfDir := t.TempDir(), t.TempDir()
	if err := InitTiny(f32Dir, ArchQwen3, "tiny", 7); err != nil {
		t.Fatal(err)
	}
	if err := InitTiny(bfDir, ArchQwen3, "tiny-bf16-test", 7); err != nil {
		t.Fatal(err)
	}
	want, err := safetensors.ReadFile(filepath.Join(f32Dir, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	got, err := safetensors.ReadFile(filepath.Join(bfDir, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Tensors) != len(want.Tensors) {
		t.Fatalf("%d tensors, want %d", len(got.Tensors), len(want.Tensors))
	}
	for name, w := range want.Tensors {
		g := got.Tensors[name]
		if g.DType != "BF16" {
			t.Fatalf("%s: dtype %s", name, g.DType)
		}
		f, _ := w.Float32()
		if len(g.Data) != 2*len(f) {
			t.Fatalf("%s: %d bytes for %d values", name, len(g.Data), len(f))
		}
		for i, v := range f {
			if h := uint16(g.Data[2*i]) | uint16(g.Data[2*i+1])<<8; h != kernels.BF16Of(v) {
				t.Fatalf("%s[%d]: bf16 bits %#04x, want %#04x (of %g)", name, i, h, kernels.BF16Of(v), v)
			}
		}
	}
	var cfg struct {
		DType string `json:"torch_dtype"`
	}
	b, _ := os.ReadFile(filepath.Join(bfDir, "config.json"))
	if err := json.Unmarshal(b, &cfg); err != nil || cfg.DType != "bfloat16" {
		t.Fatalf("torch_dtype %q (%v)", cfg.DType, err)
	}
	if _, err := Load(bfDir, Options{Precision: PrecisionBF16}); err != nil {
		t.Fatal(err)
	}
}
