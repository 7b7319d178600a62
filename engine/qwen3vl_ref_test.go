package engine

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"testing"
)

// vlReference is testdata/reference_vl.json, written by scripts/reference_vl.py.
type vlReference struct {
	Tokens    []int     `json:"tokens"`
	Grids     [][3]int  `json:"grids"`
	Positions [3][]int  `json:"positions"`
	Delta     int       `json:"delta"`
	Vocab     int       `json:"vocab"`
	Logits    []float64 `json:"logits"`
}

func loadVLReference(t testing.TB, path string) vlReference {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var r vlReference
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	return r
}

// referencePixel is the fixture's pixel_values[i][j] (scripts/reference_vl.py: pixel).
func referencePixel(i, j int) float64 {
	return float64(float32(math.Sin(0.731*float64(i)+0.0137*float64(j)) * 1.5))
}

// referenceImages are the fixture's two images (grids of different shapes) as twinkle sends them.
func referenceImages(c *Config, grids [][3]int) *Images {
	dim := c.VisionConfig.patchDim()
	n := 0
	for _, g := range grids {
		n += g[0] * g[1] * g[2]
	}
	im := &Images{Grids: grids, PixelValues: make([]float64, n*dim)}
	for i := range n {
		for j := range dim {
			im.PixelValues[i*dim+j] = referencePixel(i, j)
		}
	}
	return im
}

// imageInputs are im as loss_fn_inputs (twinkle's path).
func imageInputs(c *Config, im *Images) map[string]TensorInput {
	var grid []float64
	for _, g := range im.Grids {
		grid = append(grid, float64(g[0]), float64(g[1]), float64(g[2]))
	}
	dim := c.VisionConfig.patchDim()
	return map[string]TensorInput{
		PixelValuesInput: {DType: "float32", Shape: []int{len(im.PixelValues) / dim, dim}, Data: im.PixelValues},
		ImageGridInput:   {DType: "int64", Shape: []int{len(im.Grids), 3}, Data: grid},
	}
}

// vlLogits runs the sampler's prefill over tokens with images and returns logits [T×V].
func vlLogits(t testing.TB, e *Engine, tokens []int, im *Images) []float64 {
	T := len(tokens)
	S := bucket(T, 16)
	tok, pos := make([]int, S), make([]int, S)
	for i := range S {
		pos[i] = i
		if i < T {
			tok[i] = tokens[i]
		}
	}
	feats, err := e.encodeImages([]*Images{im})
	if err != nil {
		t.Fatal(err)
	}
	rows := []*imageRow{{tokens: tokens, images: im, feats: feats[0]}}
	step, done := e.newDecodeStepImages(context.Background(), nil, 1, S, rows)
	defer done()
	out, err := step([][]int{tok}, [][]int{pos}, func(_, t int) bool { return t < T }, nil)
	if err != nil {
		t.Fatal(err)
	}
	var logits []float64
	for i := range T {
		logits = append(logits, out[i]...)
	}
	return logits
}

// The tiny VL model's logits on a prompt with two images of different grids match a float64
// torch transcription of HF's Qwen3-VL forward (vision tower, DeepStack, interleaved mRoPE),
// to 1e-4 in float32; so do the multimodal position ids.
func TestQwen3VLMatchesReference(t *testing.T) {
	checkVLReference(t, tinyModel(t, ArchQwen3VL), loadVLReference(t, "testdata/reference_vl.json"), 1e-4)
}

// checkVLReference compares the model in dir, in float32 (within tol) and float64, with a
// fixture of a prompt with two images: position ids, delta and logits.
func checkVLReference(t *testing.T, dir string, ref vlReference, tol32 float64) {
	for _, f64 := range []bool{false, true} {
		e, err := Load(dir, Options{Float64: f64})
		if err != nil {
			t.Fatal(err)
		}
		c := e.Config
		if ref.Vocab != c.VocabSize {
			t.Fatalf("fixture vocab %d, model %d", ref.Vocab, c.VocabSize)
		}
		pos, delta := mropePositions(ref.Tokens, *c.ImageTokenID, c.VisionConfig.SpatialMergeSize, ref.Grids)
		for i, p := range pos {
			for a := range 3 {
				if p[a] != ref.Positions[a][i] {
					t.Fatalf("position %d axis %d: %d, want %d", i, a, p[a], ref.Positions[a][i])
				}
			}
		}
		if delta != ref.Delta {
			t.Fatalf("delta %d, want %d", delta, ref.Delta)
		}
		got := vlLogits(t, e, ref.Tokens, referenceImages(c, ref.Grids))
		tol := tol32
		if f64 {
			tol = 1e-6 // the fixture is rounded to 7 digits
		}
		worst := 0.0
		for i, want := range ref.Logits {
			worst = max(worst, math.Abs(got[i]-want))
		}
		t.Logf("float64 %v: max |Δ logit| = %.2g", f64, worst)
		if worst > tol {
			t.Fatalf("float64 %v: logits differ from the reference by %.3g (> %g)", f64, worst, tol)
		}
	}
}
