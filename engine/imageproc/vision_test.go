package imageproc

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"hash/crc32"
	"image"
	"image/color"
	"image/gif"
	"image/jpeg"
	"image/png"
	"os"
	"runtime"
	"strings"
	"testing"
)

// TestSmartResizeMatchesReference checks SmartResize against Python's smart_resize over sizes
// that reach every branch (testdata/smart_resize.json, written by scripts/vision_reference.py).
func TestSmartResizeMatchesReference(t *testing.T) {
	b, err := os.ReadFile("testdata/smart_resize.json")
	if err != nil {
		t.Fatal(err)
	}
	var cases []struct {
		Height, Width, Factor int
		MinPixels             int  `json:"min_pixels"`
		MaxPixels             int  `json:"max_pixels"`
		ResizedHeight         int  `json:"resized_height"`
		ResizedWidth          int  `json:"resized_width"`
		Error                 bool `json:"error"`
	}
	if err := json.Unmarshal(b, &cases); err != nil {
		t.Fatal(err)
	}
	errorsSeen := 0
	for _, c := range cases {
		h, w, err := SmartResize(c.Height, c.Width, c.Factor, c.MinPixels, c.MaxPixels)
		if c.Error {
			errorsSeen++
			if !errors.Is(err, ErrBadImage) {
				t.Errorf("%d×%d: got %d×%d, %v; want the aspect-ratio error", c.Height, c.Width, h, w, err)
			}
			continue
		}
		if err != nil || h != c.ResizedHeight || w != c.ResizedWidth {
			t.Errorf("SmartResize(%d, %d, %d, %d, %d) = %d, %d, %v; want %d, %d", c.Height, c.Width, c.Factor, c.MinPixels, c.MaxPixels, h, w, err, c.ResizedHeight, c.ResizedWidth)
		}
	}
	if errorsSeen == 0 || errorsSeen == len(cases) {
		t.Fatalf("%d of %d reference cases are errors: the table does not cover both", errorsSeen, len(cases))
	}
}

func TestParseConfig(t *testing.T) {
	// Qwen2-VL style: top-level min/max pixels win over size; absent fields keep Qwen3-VL's.
	c, err := ParseConfig([]byte(`{"patch_size": 14, "min_pixels": 3136, "max_pixels": 1003520,
		"size": {"shortest_edge": 1, "longest_edge": 2}, "image_mean": [0.1, 0.2, 0.3]}`))
	if err != nil {
		t.Fatal(err)
	}
	d := DefaultConfig()
	if c.PatchSize != 14 || c.MergeSize != d.MergeSize || c.TemporalPatchSize != d.TemporalPatchSize ||
		c.MinPixels != 3136 || c.MaxPixels != 1003520 || c.ImageMean != [3]float32{0.1, 0.2, 0.3} || c.ImageStd != d.ImageStd {
		t.Fatalf("parsed %+v", c)
	}
	// Qwen3-VL style: size.shortest_edge/longest_edge.
	c, err = ParseConfig([]byte(`{"size": {"shortest_edge": 4096, "longest_edge": 8192}}`))
	if err != nil || c.MinPixels != 4096 || c.MaxPixels != 8192 {
		t.Fatalf("parsed %+v, %v", c, err)
	}
	// A directory without the file gets the defaults.
	c, err = LoadConfig(t.TempDir())
	if err != nil || c != DefaultConfig() {
		t.Fatalf("LoadConfig(empty dir) = %+v, %v", c, err)
	}
	for _, bad := range []string{
		`{"patch_size": 0}`, `{"merge_size": -1}`, `{"temporal_patch_size": 1000}`,
		`{"min_pixels": 10, "max_pixels": 5}`, `{"image_std": [0.5, 0, 0.5]}`, `{"image_mean": [0.5]}`,
		`{"rescale_factor": -1}`, `{"patch_size": "16"}`, `not json`,
	} {
		if _, err := ParseConfig([]byte(bad)); !errors.Is(err, ErrBadConfig) {
			t.Errorf("ParseConfig(%s) = %v, want ErrBadConfig", bad, err)
		}
	}
}

// smallConfig keeps test images small: Qwen3-VL's patches with low pixel bounds.
func smallConfig() Config {
	c := DefaultConfig()
	c.MinPixels, c.MaxPixels = 32*32, 128*128
	return c
}

func encodePNG(t testing.TB, img image.Image) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := png.Encode(&buf, img); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func solid(w, h int, c color.Color) *image.NRGBA {
	img := image.NewNRGBA(image.Rect(0, 0, w, h))
	for y := range h {
		for x := range w {
			img.Set(x, y, c)
		}
	}
	return img
}

// pngHeader is a PNG signature and an IHDR chunk (valid CRC) claiming width×height, and
// nothing else: what a decompression bomb's first bytes look like.
func pngHeader(width, height uint32) []byte {
	b := []byte("\x89PNG\r\n\x1a\n")
	ihdr := binary.BigEndian.AppendUint32([]byte("IHDR"), width)
	ihdr = binary.BigEndian.AppendUint32(ihdr, height)
	ihdr = append(ihdr, 8, 6, 0, 0, 0) // 8-bit RGBA, no interlace
	b = binary.BigEndian.AppendUint32(b, 13)
	b = append(b, ihdr...)
	return binary.BigEndian.AppendUint32(b, crc32.ChecksumIEEE(ihdr))
}

// jpegHeader is SOI, a baseline SOF0 claiming width×height and the start of a scan: enough
// for a header reader, with no image data.
func jpegHeader(width, height uint16) []byte {
	b := []byte{0xFF, 0xD8, 0xFF, 0xC0, 0, 11, 8}
	b = binary.BigEndian.AppendUint16(b, height)
	b = binary.BigEndian.AppendUint16(b, width)
	b = append(b, 1, 1, 0x11, 0)
	return append(b, 0xFF, 0xDA, 0, 8, 1, 1, 0, 0, 63, 0)
}

// TestBadImagesAreRefused covers every bad-input class: each is ErrBadImage with a message
// that names the problem.
func TestBadImagesAreRefused(t *testing.T) {
	good := encodePNG(t, solid(40, 30, color.NRGBA{200, 10, 10, 255}))
	var gifBuf bytes.Buffer
	if err := gif.Encode(&gifBuf, solid(8, 8, color.White), nil); err != nil {
		t.Fatal(err)
	}
	var jpgBuf bytes.Buffer
	if err := jpeg.Encode(&jpgBuf, solid(40, 30, color.White), nil); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, format string
		data         []byte
		want         string
	}{
		{"empty", "png", nil, "no image data"},
		{"garbage", "png", []byte("definitely not an image"), "not a readable png"},
		{"garbage jpeg", "jpeg", []byte{0xFF, 0xD8, 1, 2, 3}, "not a readable jpeg"},
		{"unsupported format", "gif", gifBuf.Bytes(), "unsupported image format"},
		{"no format", "", good, "unsupported image format"},
		{"gif labelled png", "png", gifBuf.Bytes(), "not a readable png"},
		{"png labelled jpeg", "jpeg", good, "not a readable jpeg"},
		{"jpeg labelled png", "png", jpgBuf.Bytes(), "not a readable png"},
		{"truncated png", "png", good[:len(good)-20], "png image"},
		{"header only", "png", pngHeader(40, 30), "png image"},
		{"zero-sized png", "png", pngHeader(0, 10), "png"},
		{"zero-sized jpeg", "jpeg", jpegHeader(0, 10), "no pixels"},
		{"enormous png", "png", pngHeader(100000, 100000), "limit is"},
		{"enormous jpeg", "jpeg", jpegHeader(60000, 60000), "limit is"},
		{"aspect ratio over 200", "png", encodePNG(t, solid(402, 2, color.White)), "aspect ratio"},
	}
	lim := DefaultLimits()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			img, err := Preprocess(c.data, c.format, smallConfig(), lim)
			if !errors.Is(err, ErrBadImage) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Preprocess = %d values, %v; want ErrBadImage mentioning %q", len(img.PixelValues), err, c.want)
			}
		})
	}
	// The good image passes these limits, so the refusals above are about their inputs.
	if _, err := Preprocess(good, "png", smallConfig(), lim); err != nil {
		t.Fatal(err)
	}
	lim.MaxBytes = len(good) - 1
	if _, err := Preprocess(good, "png", smallConfig(), lim); !errors.Is(err, ErrBadImage) || !strings.Contains(err.Error(), "bytes") {
		t.Fatalf("over the byte limit: %v", err)
	}
}

// TestEnormousImageRefusedWithoutAllocating: a 33-byte PNG header claiming 100k×100k pixels
// (40 GB decoded) is refused from its header, allocating next to nothing.
func TestEnormousImageRefusedWithoutAllocating(t *testing.T) {
	bomb := pngHeader(100000, 100000)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, err := Preprocess(bomb, "png", DefaultConfig(), DefaultLimits())
	runtime.ReadMemStats(&after)
	if !errors.Is(err, ErrBadImage) {
		t.Fatalf("Preprocess(bomb) = %v, want ErrBadImage", err)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 1<<20 {
		t.Fatalf("refusing the bomb allocated %d bytes", alloc)
	}
}

// TestTokenLimit: an image whose resized grid is over MaxTokens is refused by Inspect.
func TestTokenLimit(t *testing.T) {
	data := encodePNG(t, solid(128, 128, color.White)) // 128×128 → 4×4 merged tokens = 16
	lim := DefaultLimits()
	info, err := Inspect(data, "png", smallConfig(), lim)
	if err != nil || info.Tokens != 16 || info.GridTHW != [3]int{1, 8, 8} {
		t.Fatalf("Inspect = %+v, %v", info, err)
	}
	lim.MaxTokens = 15
	if _, err := Inspect(data, "png", smallConfig(), lim); !errors.Is(err, ErrBadImage) || !strings.Contains(err.Error(), "16 tokens") {
		t.Fatalf("Inspect over MaxTokens = %v", err)
	}
}

// TestAlphaDropped: convert("RGB") keeps a transparent pixel's stored colour; it does not
// composite on white or black. A fully transparent red image preprocesses as opaque red.
func TestAlphaDropped(t *testing.T) {
	cfg := smallConfig()
	clear, err := Preprocess(encodePNG(t, solid(32, 32, color.NRGBA{255, 0, 0, 0})), "png", cfg, DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	opaque, err := Preprocess(encodePNG(t, solid(32, 32, color.NRGBA{255, 0, 0, 255})), "png", cfg, DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	for i := range opaque.PixelValues {
		if clear.PixelValues[i] != opaque.PixelValues[i] {
			t.Fatalf("pixel_values[%d]: transparent red %v, opaque red %v", i, clear.PixelValues[i], opaque.PixelValues[i])
		}
	}
	// Red normalises to +1 in channel 0 and -1 in the others (mean = std = 0.5).
	if v := opaque.PixelValues[0]; v != 1 {
		t.Fatalf("red channel = %v, want 1", v)
	}
	if v := opaque.PixelValues[cfg.PatchDim()/3]; v != -1 {
		t.Fatalf("green channel = %v, want -1", v)
	}
}

// TestPatchOrder builds an image whose every pixel encodes its own position and checks that
// each pixel_values entry holds the pixel HF's reshape/transpose puts there.
func TestPatchOrder(t *testing.T) {
	cfg := smallConfig()
	cfg.ImageMean, cfg.ImageStd, cfg.RescaleFactor = [3]float32{}, [3]float32{1, 1, 1}, 1
	const W, H = 64, 96 // already multiples of 32, within bounds: not resized
	img := image.NewNRGBA(image.Rect(0, 0, W, H))
	for y := range H {
		for x := range W {
			img.Set(x, y, color.NRGBA{uint8(x), uint8(y), uint8(x ^ y), 255})
		}
	}
	got, err := Preprocess(encodePNG(t, img), "png", cfg, DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	if got.ResizedWidth != W || got.ResizedHeight != H || got.GridTHW != [3]int{1, H / 16, W / 16} || got.Tokens != (H/32)*(W/32) {
		t.Fatalf("info %+v", got.Info)
	}
	P, M, T, dim := cfg.PatchSize, cfg.MergeSize, cfg.TemporalPatchSize, cfg.PatchDim()
	gw := W / P
	for row := range got.Patches() {
		// Rows run over (h/merge, w/merge, merge_h, merge_w).
		mw, mh := row%M, (row/M)%M
		bw, bh := (row/(M*M))%(gw/M), row/(M*M)/(gw/M)
		for col := range dim {
			pw, ph, tt, c := col%P, (col/P)%P, (col/(P*P))%T, col/(P*P*T)
			_ = tt // every temporal copy is the same frame
			x, y := (bw*M+mw)*P+pw, (bh*M+mh)*P+ph
			want := [3]float32{float32(x), float32(y), float32(x ^ y)}[c]
			if v := got.PixelValues[row*dim+col]; v != want {
				t.Fatalf("row %d col %d = %v, want %v (pixel %d,%d channel %d)", row, col, v, want, x, y, c)
			}
		}
	}
}

// FuzzPreprocess: arbitrary bytes under either format never panic, and what is accepted has
// the promised shape and stays within the limits.
func FuzzPreprocess(f *testing.F) {
	f.Add(encodePNG(f, solid(20, 30, color.NRGBA{1, 2, 3, 4})), true)
	var jb bytes.Buffer
	_ = jpeg.Encode(&jb, solid(17, 9, color.White), nil)
	f.Add(jb.Bytes(), false)
	f.Add(pngHeader(100000, 100000), true)
	f.Add(jpegHeader(1, 1), false)
	cfg := smallConfig()
	lim := Limits{MaxBytes: 1 << 16, MaxPixels: 256 * 256, MaxTokens: 64}
	f.Fuzz(func(t *testing.T, data []byte, isPNG bool) {
		format := "jpeg"
		if isPNG {
			format = "png"
		}
		img, err := Preprocess(data, format, cfg, lim)
		if err != nil {
			if !errors.Is(err, ErrBadImage) {
				t.Fatalf("error not ErrBadImage: %v", err)
			}
			return
		}
		if img.Tokens > lim.MaxTokens || img.Width*img.Height > lim.MaxPixels ||
			len(img.PixelValues) != img.Patches()*cfg.PatchDim() || img.Tokens*cfg.MergeSize*cfg.MergeSize != img.Patches() {
			t.Fatalf("accepted image with info %+v and %d values", img.Info, len(img.PixelValues))
		}
	})
}

// TestZeroLimitsAreDefaults: a zero Limits (a caller that set none) means DefaultLimits, not
// "refuse everything" and not "no limit".
func TestZeroLimitsAreDefaults(t *testing.T) {
	good := encodePNG(t, solid(40, 30, color.White))
	if _, err := Preprocess(good, "png", smallConfig(), Limits{}); err != nil {
		t.Fatalf("zero limits: %v", err)
	}
	if _, err := Preprocess(pngHeader(100000, 100000), "png", smallConfig(), Limits{}); !errors.Is(err, ErrBadImage) {
		t.Fatalf("zero limits let a 100k×100k image through: %v", err)
	}
}
