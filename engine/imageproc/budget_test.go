package imageproc

import (
	"encoding/base64"
	"errors"
	"image/color"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/skein-ai/skein/api"
)

func pointers(locs ...string) api.ModelInput {
	m := api.ModelInput{Chunks: []api.Chunk{{Type: "encoded_text", Tokens: []int{1}}}}
	for _, l := range locs {
		m.Chunks = append(m.Chunks, api.Chunk{Type: "image_asset_pointer", Location: l, Format: "png"})
	}
	return m
}

// TestRequestBudgetReadsARepeatedFileOnce: one file named 200 times is read, counted and decoded
// once (the issue-19 attack: 200 pointers to one 8 MB file held 200 copies), while a second
// file that does not fit the request's bytes, or a second image that does not fit its pixels,
// is refused from its size and header alone, before it is read or decoded.
func TestRequestBudgetReadsARepeatedFileOnce(t *testing.T) {
	cfg := smallConfig()
	red := encodePNG(t, solid(64, 64, color.NRGBA{200, 10, 10, 255}))
	blue := encodePNG(t, solid(64, 64, color.NRGBA{10, 10, 200, 255}))
	dir := t.TempDir()
	for name, b := range map[string][]byte{"red.png": red, "blue.png": blue} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	src := Source{ImageDir: dir}
	locs := make([]string, 200)
	for i := range locs {
		locs[i] = "red.png"
		if i%2 == 1 {
			locs[i] = "./red.png" // the same file by another name
		}
	}
	b := NewBudget(len(red)+len(red)/2, 64*64+10) // one image's bytes and pixels, not two
	_, spans, err := LoadModelInput(pointers(locs...), padID, cfg, DefaultLimits(), src, 1<<20, b)
	if err != nil {
		t.Fatalf("one file 200 times within one image's budget: %v", err)
	}
	want, err := Preprocess(red, "png", cfg, DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	for i, sp := range spans {
		img, err := sp.Preprocess()
		if err != nil || len(img.PixelValues) != len(want.PixelValues) || img.PixelValues[7] != want.PixelValues[7] {
			t.Fatalf("span %d: %v", i, err)
		}
	}
	if b.Decodes() != 1 {
		t.Fatalf("%d decodes of one file, want 1", b.Decodes())
	}

	b = NewBudget(len(red)+len(red)/2, 1<<30)
	_, _, err = LoadModelInput(pointers("red.png", "blue.png"), padID, cfg, DefaultLimits(), src, 1<<20, b)
	var ce *ChunkError
	if !errors.As(err, &ce) || ce.Chunk != 2 || !errors.Is(err, ErrBadImage) || !strings.Contains(err.Error(), "encoded bytes") {
		t.Fatalf("two files over the bytes budget: %v, want a bad-image error naming chunk 2 and the bytes", err)
	}
	if b.Decodes() != 0 {
		t.Fatal("a refused request decoded something")
	}

	b = NewBudget(1<<30, 64*64+10)
	_, _, err = LoadModelInput(pointers("red.png", "blue.png"), padID, cfg, DefaultLimits(), src, 1<<20, b)
	if !errors.As(err, &ce) || ce.Chunk != 2 || !strings.Contains(err.Error(), "pixels") {
		t.Fatalf("two images over the pixel budget: %v, want a bad-image error naming chunk 2 and the pixels", err)
	}
	// Inline bytes count too.
	b = NewBudget(len(red)+len(red)/2, 1<<30)
	m := api.ModelInput{Chunks: []api.Chunk{imageChunkOf(red), imageChunkOf(red)}}
	if _, _, err := LoadModelInput(m, padID, cfg, DefaultLimits(), src, 1<<20, b); !errors.Is(err, ErrBadImage) || !strings.Contains(err.Error(), "encoded bytes") {
		t.Fatalf("two inline images over the bytes budget: %v", err)
	}
}

func imageChunkOf(b []byte) api.Chunk {
	return api.Chunk{Type: "image", Data: base64.StdEncoding.EncodeToString(b), Format: "png"}
}
