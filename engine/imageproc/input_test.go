package imageproc

import (
	"encoding/base64"
	"errors"
	"image/color"
	"math"
	"strings"
	"testing"

	"github.com/skein-ai/skein/api"
)

const padID = 151655 // Qwen3-VL's <|image_pad|>

// TestLoadModelInput: images expand to their token counts of pads at the right positions, in
// order with the text, and each span preprocesses to what its chunk alone gives.
func TestLoadModelInput(t *testing.T) {
	cfg, lim := smallConfig(), DefaultLimits()
	wide := encodePNG(t, solid(64, 32, color.NRGBA{200, 10, 10, 255}))
	tall := encodePNG(t, solid(40, 130, color.NRGBA{0, 10, 250, 255}))
	m := api.ModelInput{Chunks: []api.Chunk{
		{Type: "encoded_text", Tokens: []int{1, 2}},
		{Type: "image", Data: base64.StdEncoding.EncodeToString(wide), Format: "png"},
		{Type: "encoded_text", Tokens: []int{3}},
		{Type: "image_asset_pointer", Location: "data:image/png;base64," + base64.StdEncoding.EncodeToString(tall), Format: "png"},
		{Type: "encoded_text", Tokens: []int{4, 5}},
	}}
	a, err := Preprocess(wide, "png", cfg, lim)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Preprocess(tall, "png", cfg, lim)
	if err != nil {
		t.Fatal(err)
	}
	if a.Tokens == b.Tokens {
		t.Fatalf("test images should differ in token count, both %d", a.Tokens)
	}
	tokens, spans, err := LoadModelInput(m, padID, cfg, lim, Source{}, 1000, nil)
	if err != nil {
		t.Fatal(err)
	}
	var want []int
	want = append(want, 1, 2)
	for range a.Tokens {
		want = append(want, padID)
	}
	want = append(want, 3)
	for range b.Tokens {
		want = append(want, padID)
	}
	want = append(want, 4, 5)
	if len(tokens) != len(want) {
		t.Fatalf("%d tokens, want %d", len(tokens), len(want))
	}
	for i := range want {
		if tokens[i] != want[i] {
			t.Fatalf("token %d = %d, want %d", i, tokens[i], want[i])
		}
	}
	if len(spans) != 2 || spans[0].Start != 2 || spans[1].Start != 3+a.Tokens || spans[0].Tokens != a.Tokens || spans[1].Tokens != b.Tokens {
		t.Fatalf("spans %+v", spans)
	}
	got, err := spans[1].Preprocess()
	if err != nil || got.Info != b.Info || len(got.PixelValues) != len(b.PixelValues) || got.PixelValues[7] != b.PixelValues[7] {
		t.Fatalf("span 1 preprocesses to %+v, %v", got.Info, err)
	}
	// Too long with its images: refused before anything is expanded.
	if _, _, err := LoadModelInput(m, padID, cfg, lim, Source{}, len(want)-1, nil); !IsUserError(err) || !strings.Contains(err.Error(), "limit") {
		t.Fatalf("over maxLen: %v", err)
	}
	// A bad chunk is a user error naming it.
	m.Chunks[1].Format = "bmp"
	if _, _, err := LoadModelInput(m, padID, cfg, lim, Source{}, 1000, nil); !IsUserError(err) || !strings.Contains(err.Error(), "chunk 1") {
		t.Fatalf("bad format: %v", err)
	}
}

func tensor(dtype string, shape []int, data []float64) api.TensorData {
	return api.TensorData{DType: dtype, Shape: shape, Data: data}
}

// TestFromTensors: twinkle's pixel_values + image_grid_thw split into the same images the
// chunk path makes; every inconsistency is refused naming the field.
func TestFromTensors(t *testing.T) {
	cfg, lim := smallConfig(), DefaultLimits()
	var imgs []Image
	for _, size := range [][2]int{{64, 32}, {40, 130}} {
		im, err := Preprocess(encodePNG(t, solid(size[0], size[1], color.NRGBA{9, 99, 199, 255})), "png", cfg, lim)
		if err != nil {
			t.Fatal(err)
		}
		imgs = append(imgs, im)
	}
	var px, grid []float64
	rows := 0
	for _, im := range imgs {
		for _, v := range im.PixelValues {
			px = append(px, float64(v))
		}
		for _, g := range im.GridTHW {
			grid = append(grid, float64(g))
		}
		rows += im.Patches()
	}
	dim := cfg.PatchDim()
	pv := tensor("float32", []int{rows, dim}, px)
	gt := tensor("int64", []int{2, 3}, grid)
	got, err := FromTensors(pv, gt, cfg, lim)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 {
		t.Fatalf("%d images", len(got))
	}
	for i := range got {
		if got[i].GridTHW != imgs[i].GridTHW || got[i].Tokens != imgs[i].Tokens || len(got[i].PixelValues) != len(imgs[i].PixelValues) {
			t.Fatalf("image %d: %+v, want %+v", i, got[i].Info, imgs[i].Info)
		}
		for k := range got[i].PixelValues {
			if got[i].PixelValues[k] != imgs[i].PixelValues[k] {
				t.Fatalf("image %d value %d differs", i, k)
			}
		}
	}
	// Pads: as many as the grids stand for.
	pads := make([]int, imgs[0].Tokens+imgs[1].Tokens)
	for i := range pads {
		pads[i] = padID
	}
	if err := CheckPadTokens(append([]int{1}, pads...), padID, got); err != nil {
		t.Fatal(err)
	}
	if err := CheckPadTokens(pads[1:], padID, got); !errors.Is(err, ErrBadImage) {
		t.Fatalf("one pad short: %v", err)
	}

	nan := append([]float64(nil), px...)
	nan[dim+3] = math.NaN()
	cases := []struct {
		name   string
		pv, gt api.TensorData
		want   string
	}{
		{"grid not [n,3]", pv, tensor("int64", []int{3, 2}, grid), "image_grid_thw"},
		{"grid shape lies", pv, tensor("int64", []int{3, 3}, grid), "image_grid_thw"},
		{"grid not a merge multiple", pv, tensor("int64", []int{1, 3}, []float64{1, 3, 4}), "merge_size"},
		{"grid_t 2", pv, tensor("int64", []int{1, 3}, []float64{2, 2, 2}), "grid_t"},
		{"grid zero", pv, tensor("int64", []int{1, 3}, []float64{1, 0, 2}), "positive"},
		{"grid fractional", pv, tensor("int64", []int{1, 3}, []float64{1, 2.5, 2}), "positive"},
		{"grid enormous", pv, tensor("int64", []int{1, 3}, []float64{1, 1 << 20, 1 << 20}), "limit"},
		{"grid beyond bounds", pv, tensor("int64", []int{1, 3}, []float64{1, 1e300, 2}), "positive"},
		{"rows disagree", tensor("float32", []int{rows - 1, dim}, px[:len(px)-dim]), gt, "pixel_values"},
		{"width wrong", tensor("float32", []int{rows * 2, dim / 2}, px), gt, "pixel_values"},
		{"shape lies", tensor("float32", []int{rows, dim}, px[:10]), gt, "pixel_values"},
		{"NaN", tensor("float32", []int{rows, dim}, nan), gt, "finite"},
	}
	for _, c := range cases {
		if _, err := FromTensors(c.pv, c.gt, cfg, lim); !errors.Is(err, ErrBadImage) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want ErrBadImage mentioning %q", c.name, err, c.want)
		}
	}
}
