package imageproc

import (
	"bytes"
	"encoding/base64"
	"errors"
	"image/color"
	"image/jpeg"
	"os"
	"path/filepath"
	"testing"

	"github.com/skein-ai/skein/api"
)

// FuzzModelInputImages: a model input's image chunks as the API gives them (an image chunk's
// base64 data; an image_asset_pointer's data: URI or file path; any format string; any
// expected_tokens), twice in one input, under a request Budget: never a panic, every refusal
// a user error (IsUserError), and what is accepted keeps to the budget and the limits and
// decodes to its header's size (issue 19).
func FuzzModelInputImages(f *testing.F) {
	red := encodePNG(f, solid(20, 30, color.NRGBA{200, 1, 2, 255}))
	var jb bytes.Buffer
	_ = jpeg.Encode(&jb, solid(17, 9, color.White), nil)
	dir := f.TempDir()
	for name, b := range map[string][]byte{"red.png": red, "w.jpg": jb.Bytes(), "bomb.png": pngHeader(100000, 100000)} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			f.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
		f.Fatal(err)
	}
	b64 := base64.StdEncoding.EncodeToString
	f.Add(uint8(0), b64(red), "png", int16(-1))
	f.Add(uint8(1), "data:image/png;base64,"+b64(red), "png", int16(4))
	f.Add(uint8(1), "red.png", "png", int16(-1))
	f.Add(uint8(1), "./sub/../red.png", "png", int16(-1))
	f.Add(uint8(1), "w.jpg", "jpeg", int16(2))
	f.Add(uint8(1), "bomb.png", "png", int16(-1))
	f.Add(uint8(1), "data:image/jpeg;base64,"+b64(jb.Bytes()), "png", int16(-1))
	f.Add(uint8(0), "!!notbase64", "gif", int16(0))
	f.Add(uint8(1), "https://example.com/x.png", "png", int16(-1))
	f.Add(uint8(1), "/etc/passwd", "png", int16(-1))
	f.Add(uint8(1), "sub", "png", int16(-1))
	cfg := smallConfig()
	lim := Limits{MaxBytes: 1 << 16, MaxPixels: 256 * 256, MaxTokens: 64}
	f.Fuzz(func(t *testing.T, kind uint8, payload, format string, expected int16) {
		c := api.Chunk{Type: "image", Data: payload, Format: format}
		if kind%2 == 1 {
			c = api.Chunk{Type: "image_asset_pointer", Location: payload, Format: format}
		}
		if expected >= 0 {
			e := int(expected)
			c.ExpectedTokens = &e
		}
		m := api.ModelInput{Chunks: []api.Chunk{{Type: "encoded_text", Tokens: []int{1}}, c, c}}
		const maxBytes, maxPixels = 1 << 17, 128 * 128
		b := NewBudget(maxBytes, maxPixels)
		toks, spans, err := LoadModelInput(m, padID, cfg, lim, Source{ImageDir: dir}, 4096, b)
		if err != nil {
			if !IsUserError(err) {
				t.Fatalf("not a user error: %v", err)
			}
			return
		}
		if b.bytes < 0 || b.pixels < 0 {
			t.Fatalf("over the budget: %s", b)
		}
		pads := 0
		for _, tk := range toks {
			if tk == padID {
				pads++
			}
		}
		want := 0
		for _, sp := range spans {
			want += sp.Tokens
			if sp.Tokens > lim.MaxTokens || sp.Width*sp.Height > lim.MaxPixels {
				t.Fatalf("accepted %+v", sp.Info)
			}
			img, err := sp.Preprocess()
			if err != nil {
				if !errors.Is(err, ErrBadImage) {
					t.Fatalf("decode error not ErrBadImage: %v", err)
				}
				continue
			}
			if len(img.PixelValues) != sp.Patches()*cfg.PatchDim() {
				t.Fatalf("%d pixel values for %+v", len(img.PixelValues), sp.Info)
			}
		}
		if pads != want {
			t.Fatalf("%d pads for %d image tokens", pads, want)
		}
	})
}
