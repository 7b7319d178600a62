package engine

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
)

// presetModels are generated models by arch and preset, made once a test binary.
var presetModels sync.Map

// tinyPresetModel is the generated model of arch at preset (seed 1), shared by the tests.
func tinyPresetModel(t testing.TB, arch Arch, preset string) string {
	t.Helper()
	key := string(arch) + "/" + preset
	if d, ok := presetModels.Load(key); ok {
		return d.(string)
	}
	dir := filepath.Join(tempRoot(t), string(arch)+"-"+preset)
	if err := InitTiny(dir, arch, preset, 1); err != nil {
		t.Fatal(err)
	}
	presetModels.Store(key, dir)
	return dir
}

// Qwen3.5 with images: the tiny VL model's logits on a prompt with two images of different
// grids match a float64 transcription (scripts/reference_qwen35_vl.py: Qwen3-VL's tower without
// DeepStack, get_rope_index, interleaved mRoPE over the rotating quarter of each head, the
// hybrid LM), to 1e-4 in float32 (the DeltaNet's gated norm amplifies float32 rounding: see
// qwen35RefTol); so do the multimodal position ids.
func TestQwen35ImagesMatchReference(t *testing.T) {
	checkVLReference(t, tinyPresetModel(t, ArchQwen3_5, "tiny-vl"), loadVLReference(t, "testdata/reference_qwen35_vl.json"), 1e-4)
}

// A Qwen3.5 VL model trains and samples with images as Qwen3-VL does: a datum with
// pixel_values and image_grid_thw lowers its loss under training, and a sample's logprobs of its
// own tokens equal the forward pass's over the same prompt and images.
func TestQwen35TrainsAndSamplesWithImages(t *testing.T) {
	e, err := Load(tinyPresetModel(t, ArchQwen3_5, "tiny-vl"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !e.Info().TakesImages() {
		t.Fatal("the Qwen3.5 VL model does not take images")
	}
	ref := loadVLReference(t, "testdata/reference_qwen35_vl.json")
	im := referenceImages(e.Config, ref.Grids)
	d := textDatum(ref.Tokens)
	for k, v := range imageInputs(e.Config, im) {
		d.Inputs[k] = v
	}
	if _, err := e.CreateAdapter("v", LoraConfig{Rank: 4, Seed: 1, TrainAttn: true, TrainMLP: true}); err != nil {
		t.Fatal(err)
	}
	var losses []float64
	for range 6 {
		r, err := e.ForwardBackward(context.Background(), "v", []Datum{d}, "cross_entropy", nil)
		if err != nil {
			t.Fatal(err)
		}
		losses = append(losses, r.Loss)
		if _, err := e.OptimStep(context.Background(), "v", AdamParams{LearningRate: 1e-2, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8}); err != nil {
			t.Fatal(err)
		}
	}
	if !(losses[len(losses)-1] < losses[0]*0.8) {
		t.Fatalf("losses with images %v: training does not lower them", losses)
	}
	// Other pixels under the same tokens give other logprobs: the images reach the LM.
	other := textDatum(ref.Tokens)
	neg := &Images{Grids: im.Grids, PixelValues: make([]float64, len(im.PixelValues))}
	for i, v := range im.PixelValues {
		neg.PixelValues[i] = -v
	}
	for k, v := range imageInputs(e.Config, neg) {
		other.Inputs[k] = v
	}
	a, err := e.Forward(context.Background(), "v", []Datum{d}, "cross_entropy", nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := e.Forward(context.Background(), "v", []Datum{other}, "cross_entropy", nil)
	if err != nil {
		t.Fatal(err)
	}
	if maxDiff(a.Logprobs[0], b.Logprobs[0]) < 1e-3 {
		t.Fatal("the images change nothing")
	}
}
