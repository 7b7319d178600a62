package imageproc

import (
	"encoding/base64"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"testing"
)

// referenceImage is one entry of testdata/expected.json (scripts/vision_reference.py: a
// numpy+PIL transcription of HF's Qwen2VLImageProcessor, run with Debian's python3-pil 9.4).
type referenceImage struct {
	Format        string    `json:"format"`
	ResizedHeight int       `json:"resized_height"`
	ResizedWidth  int       `json:"resized_width"`
	GridTHW       [3]int    `json:"grid_thw"`
	Tokens        int       `json:"tokens"`
	Shape         [2]int    `json:"shape"`
	ResizedRGB    string    `json:"resized_rgb_base64"`
	SampleIndex   []int     `json:"sample_index"`
	SampleValue   []float64 `json:"sample_value"`
	Sum           float64   `json:"sum"`
	AbsSum        float64   `json:"abs_sum"`
}

func loadReference(t *testing.T) (map[string]referenceImage, Config) {
	t.Helper()
	b, err := os.ReadFile("testdata/expected.json")
	if err != nil {
		t.Fatal(err)
	}
	var ref map[string]referenceImage
	if err := json.Unmarshal(b, &ref); err != nil {
		t.Fatal(err)
	}
	cfg, err := LoadConfig("testdata")
	if err != nil {
		t.Fatal(err)
	}
	return ref, cfg
}

// Tolerances. PNG decoding is exact in both libraries, so a PNG's resized pixels may differ
// from PIL's only by the ±1 of a last rounding (in practice: not at all). JPEG decoders differ
// (libjpeg's fancy chroma upsampling and IDCT against Go's), so a JPEG is compared loosely:
// each pixel within 12 levels and the mean absolute difference under 2 levels.
const (
	pngMaxLevelDiff  = 1
	jpegMaxLevelDiff = 12
	jpegMeanDiff     = 2.0
)

// TestPreprocessMatchesReference compares the whole pipeline against the PIL/numpy reference:
// smart_resize's size, the grid and token count, every resized uint8 pixel, and sampled
// pixel_values entries (which pin HF's flattening order) with the sums.
func TestPreprocessMatchesReference(t *testing.T) {
	ref, cfg := loadReference(t)
	if len(ref) < 5 {
		t.Fatalf("reference has %d images", len(ref))
	}
	for name, want := range ref {
		t.Run(name, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join("testdata", name))
			if err != nil {
				t.Fatal(err)
			}
			img, err := Preprocess(data, want.Format, cfg, DefaultLimits())
			if err != nil {
				t.Fatal(err)
			}
			if img.ResizedHeight != want.ResizedHeight || img.ResizedWidth != want.ResizedWidth || img.GridTHW != want.GridTHW || img.Tokens != want.Tokens {
				t.Fatalf("resized %d×%d grid %v tokens %d, want %d×%d grid %v tokens %d",
					img.ResizedHeight, img.ResizedWidth, img.GridTHW, img.Tokens, want.ResizedHeight, want.ResizedWidth, want.GridTHW, want.Tokens)
			}
			if img.Patches() != want.Shape[0] || len(img.PixelValues) != want.Shape[0]*want.Shape[1] || cfg.PatchDim() != want.Shape[1] {
				t.Fatalf("pixel_values has %d values (%d patches × %d), want shape %v", len(img.PixelValues), img.Patches(), cfg.PatchDim(), want.Shape)
			}

			// The resampler, pixel by pixel.
			wantRGB, err := base64.StdEncoding.DecodeString(want.ResizedRGB)
			if err != nil {
				t.Fatal(err)
			}
			data2, _ := os.ReadFile(filepath.Join("testdata", name))
			gotRGB := resizedRGB(t, data2, want.Format, img.Info)
			if len(gotRGB) != len(wantRGB) {
				t.Fatalf("resized image has %d bytes, want %d", len(gotRGB), len(wantRGB))
			}
			maxDiff, sumDiff, differing := 0, 0, 0
			for i := range gotRGB {
				d := int(gotRGB[i]) - int(wantRGB[i])
				if d < 0 {
					d = -d
				}
				maxDiff = max(maxDiff, d)
				sumDiff += d
				if d != 0 {
					differing++
				}
			}
			mean := float64(sumDiff) / float64(len(gotRGB))
			t.Logf("resized pixels: %d of %d differ from PIL, max %d levels, mean %.3f", differing, len(gotRGB), maxDiff, mean)
			if want.Format == "png" && maxDiff > pngMaxLevelDiff {
				t.Errorf("PNG path: a resized pixel differs from PIL's by %d levels (tolerance %d)", maxDiff, pngMaxLevelDiff)
			}
			if want.Format == "jpeg" && (maxDiff > jpegMaxLevelDiff || mean > jpegMeanDiff) {
				t.Errorf("JPEG path: resized pixels differ from PIL's by up to %d levels, mean %.3f (tolerance %d, %.1f)", maxDiff, mean, jpegMaxLevelDiff, jpegMeanDiff)
			}

			// pixel_values: one uint8 level is 1/(255·std) ≈ 0.015 after normalising.
			level := 1 / (255 * float64(min(cfg.ImageStd[0], cfg.ImageStd[1], cfg.ImageStd[2])))
			tol := (float64(pngMaxLevelDiff) + 1e-3) * level
			if want.Format == "jpeg" {
				tol = (jpegMaxLevelDiff + 1e-3) * level
			}
			for i, idx := range want.SampleIndex {
				if got := float64(img.PixelValues[idx]); math.Abs(got-want.SampleValue[i]) > tol {
					t.Errorf("pixel_values[%d] (row %d, col %d) = %v, want %v", idx, idx/want.Shape[1], idx%want.Shape[1], got, want.SampleValue[i])
					break
				}
			}
			var sum, abs float64
			for _, v := range img.PixelValues {
				sum += float64(v)
				abs += math.Abs(float64(v))
			}
			n := float64(len(img.PixelValues))
			sumTol := n * level * 0.05 // on average within 1/20 level
			if want.Format == "jpeg" {
				sumTol = n * level * jpegMeanDiff
			}
			if math.Abs(sum-want.Sum) > sumTol || math.Abs(abs-want.AbsSum) > sumTol {
				t.Errorf("sum %v abs-sum %v, want %v %v (±%v)", sum, abs, want.Sum, want.AbsSum, sumTol)
			}
		})
	}
}

// resizedRGB reruns the decode and resize steps of Preprocess, to compare the resampler's
// uint8 output with PIL's.
func resizedRGB(t *testing.T, data []byte, format string, info Info) []uint8 {
	t.Helper()
	img, err := decode(data, format)
	if err != nil {
		t.Fatal(err)
	}
	return resizeBicubic(toRGB(img), info.Width, info.Height, info.ResizedWidth, info.ResizedHeight)
}

// TestQwen3DefaultsMatchReference runs DefaultConfig (Qwen3-VL's released processor settings)
// on the PNG fixtures, which its min_pixels scales up, against the reference's samples and sums
// (testdata/expected_qwen3.json). PNG tolerance: one uint8 level per sampled value.
func TestQwen3DefaultsMatchReference(t *testing.T) {
	b, err := os.ReadFile("testdata/expected_qwen3.json")
	if err != nil {
		t.Fatal(err)
	}
	var ref map[string]referenceImage
	if err := json.Unmarshal(b, &ref); err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	level := 1 / (255 * float64(cfg.ImageStd[0]))
	for name, want := range ref {
		data, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			t.Fatal(err)
		}
		img, err := Preprocess(data, want.Format, cfg, DefaultLimits())
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if img.ResizedHeight != want.ResizedHeight || img.ResizedWidth != want.ResizedWidth || img.GridTHW != want.GridTHW || img.Tokens != want.Tokens || img.Patches() != want.Shape[0] {
			t.Fatalf("%s: %+v, want %d×%d grid %v tokens %d", name, img.Info, want.ResizedHeight, want.ResizedWidth, want.GridTHW, want.Tokens)
		}
		for i, idx := range want.SampleIndex {
			if got := float64(img.PixelValues[idx]); math.Abs(got-want.SampleValue[i]) > level*(pngMaxLevelDiff+1e-3) {
				t.Fatalf("%s: pixel_values[%d] = %v, want %v", name, idx, got, want.SampleValue[i])
			}
		}
		var sum, abs float64
		for _, v := range img.PixelValues {
			sum += float64(v)
			abs += math.Abs(float64(v))
		}
		tol := float64(len(img.PixelValues)) * level * 0.05
		if math.Abs(sum-want.Sum) > tol || math.Abs(abs-want.AbsSum) > tol {
			t.Fatalf("%s: sum %v abs-sum %v, want %v %v", name, sum, abs, want.Sum, want.AbsSum)
		}
	}
}
