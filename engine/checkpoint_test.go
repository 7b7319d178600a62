package engine

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/skein-ai/skein/safetensors"
)

// A checkpoint whose framing is valid but whose tensors do not fit this adapter (wrong shape,
// missing, extra, non-float) is an error of that load, never a panic now or at the next step.
func TestLoadAdapterRejectsMismatchedTensors(t *testing.T) {
	e := loadTiny(t, ArchQwen3, Options{})
	ids := e.Tokenizer.Encode("Good software is small, clear and tested.")
	if _, err := e.CreateAdapter("a", LoraConfig{Rank: 4, Seed: 2, TrainAttn: true}); err != nil {
		t.Fatal(err)
	}
	trainSteps(t, e, "a", ids, 1)
	if _, err := e.ForwardBackward(context.Background(), "a", []Datum{textDatum(ids)}, "cross_entropy", nil); err != nil {
		t.Fatal(err)
	}
	a, _ := e.adapter("a")
	name := a.params[0].name
	edits := map[string]struct {
		file string
		edit func(ts map[string]safetensors.Tensor)
	}{
		"short moment": {OptimizerFile, func(ts map[string]safetensors.Tensor) {
			ts[name+".exp_avg"] = safetensors.FromFloat64([]float64{1}, 1)
		}},
		"short accumulator": {OptimizerFile, func(ts map[string]safetensors.Tensor) {
			ts[name+".grad_accum"] = safetensors.FromFloat64([]float64{1, 2}, 2)
		}},
		"integer moment": {OptimizerFile, func(ts map[string]safetensors.Tensor) {
			t := ts[name+".exp_avg_sq"]
			t.DType = "I64"
			ts[name+".exp_avg_sq"] = t
		}},
		"extra optimizer tensor": {OptimizerFile, func(ts map[string]safetensors.Tensor) {
			ts["huge.exp_avg"] = safetensors.FromFloat64(make([]float64, 1000), 1000)
		}},
		"integer weight": {AdapterWeightsFile, func(ts map[string]safetensors.Tensor) {
			t := ts[name]
			t.DType = "I32"
			ts[name] = t
		}},
		"extra weight": {AdapterWeightsFile, func(ts map[string]safetensors.Tensor) {
			ts["base_model.model.lm_head.weight"] = safetensors.FromFloat32(make([]float32, 1000), 1000)
		}},
	}
	for what, c := range edits {
		dir := t.TempDir()
		if err := e.SaveAdapter(context.Background(), "a", dir, true); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, c.file)
		f, err := safetensors.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		c.edit(f.Tensors)
		if err := safetensors.WriteFile(path, f.Tensors, f.Metadata); err != nil {
			t.Fatal(err)
		}
		func() {
			defer func() {
				if v := recover(); v != nil {
					t.Errorf("%s: panic: %v", what, v)
				}
			}()
			err := e.LoadAdapter(context.Background(), "b", dir, true)
			if err == nil {
				_, err = e.OptimStep(context.Background(), "b", DefaultAdamParams())
				t.Errorf("%s: loaded (the step then said %v)", what, err)
			} else if !strings.Contains(err.Error(), "engine") {
				t.Errorf("%s: error %q does not say where it comes from", what, err)
			}
		}()
		e.DeleteAdapter(context.Background(), "b")
	}
}
