package imageproc

import (
	"encoding/base64"
	"errors"
	"image/color"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/skein-ai/skein/api"
)

func imageDir(t *testing.T, png []byte) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "sub", "red.png"), png, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestFromChunk: ImageChunk bytes, a data: URI and a file under the image directory all give
// the same pixel_values, and the token count is checked against expected_tokens.
func TestFromChunk(t *testing.T) {
	png := encodePNG(t, solid(64, 32, color.NRGBA{200, 10, 10, 255}))
	dir := imageDir(t, png)
	cfg, lim := smallConfig(), DefaultLimits()
	src := Source{ImageDir: dir}

	want, err := Preprocess(png, "png", cfg, lim)
	if err != nil {
		t.Fatal(err)
	}
	n := want.Tokens
	inputs := []api.ImageInput{
		{Chunk: 0, Data: png, Format: "png", ExpectedTokens: &n},
		{Chunk: 1, Pointer: true, Location: "data:image/png;base64," + base64.StdEncoding.EncodeToString(png), Format: "png"},
		{Chunk: 2, Pointer: true, Location: "data:;base64," + base64.StdEncoding.EncodeToString(png), Format: "png"},
		{Chunk: 3, Pointer: true, Location: "sub/red.png", Format: "png"},
		{Chunk: 4, Pointer: true, Location: filepath.Join(dir, "sub", "red.png"), Format: "png"},
	}
	for _, in := range inputs {
		got, err := FromChunk(in, cfg, lim, src)
		if err != nil {
			t.Fatalf("chunk %d: %v", in.Chunk, err)
		}
		if got.Info != want.Info || len(got.PixelValues) != len(want.PixelValues) {
			t.Fatalf("chunk %d: info %+v, want %+v", in.Chunk, got.Info, want.Info)
		}
		for i := range got.PixelValues {
			if got.PixelValues[i] != want.PixelValues[i] {
				t.Fatalf("chunk %d: pixel_values[%d] differs", in.Chunk, i)
			}
		}
	}

	// expected_tokens that differ: a typed error naming the chunk and both numbers, before decoding.
	wrong := n + 1
	_, err = FromChunk(api.ImageInput{Chunk: 7, Data: png, Format: "png", ExpectedTokens: &wrong}, cfg, lim, src)
	var mismatch *TokenMismatchError
	if !errors.As(err, &mismatch) || !errors.Is(err, ErrBadImage) || mismatch.Chunk != 7 || mismatch.Expected != wrong || mismatch.Actual != n {
		t.Fatalf("mismatch: %v", err)
	}
	msg := err.Error()
	if !strings.Contains(msg, "chunk 7") || !strings.Contains(msg, "expected_tokens") ||
		!strings.Contains(msg, strconv.Itoa(wrong)) || !strings.Contains(msg, strconv.Itoa(n)) {
		t.Fatalf("mismatch message %q does not name the chunk and both numbers", msg)
	}
	// InspectChunk answers the same count from the header alone.
	info, err := InspectChunk(inputs[3], cfg, lim, src)
	if err != nil || info.Tokens != n {
		t.Fatalf("InspectChunk = %+v, %v", info, err)
	}
}

// TestBadLocations: everything but a data: URI or a file under the image directory is refused,
// naming the chunk and the location field; nothing is fetched.
func TestBadLocations(t *testing.T) {
	png := encodePNG(t, solid(32, 32, color.White))
	dir := imageDir(t, png)
	outside := t.TempDir()
	if err := os.WriteFile(filepath.Join(outside, "secret.png"), png, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(outside, "secret.png"), filepath.Join(dir, "link.png")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(dir, "linkdir")); err != nil {
		t.Fatal(err)
	}
	b64 := base64.StdEncoding.EncodeToString(png)
	cases := []struct{ loc, want string }{
		{"https://example.com/cat.png", "URL"},
		{"http://127.0.0.1/cat.png", "URL"},
		{"file:///etc/passwd", "URL"},
		{"s3://bucket/cat.png", "URL"},
		{"../secret.png", ".."},
		{"sub/../../secret.png", ".."},
		{"sub/../red.png", ".."},
		{filepath.Join(outside, "secret.png"), "outside"},
		{"/etc/passwd", "outside"},
		{"link.png", "link.png"},
		{"linkdir/secret.png", "linkdir"},
		{"missing.png", "missing.png"},
		{"sub", "not a regular file"},
		{"data:image/png," + b64, "base64"},
		{"data:image/jpeg;base64," + b64, "format"},
		{"data:text/plain;base64," + b64, "format"},
		{"data:image/png;base64,!!!", "base64"},
		{"data:image/png;base64", "comma"},
	}
	cfg, lim := smallConfig(), DefaultLimits()
	for _, c := range cases {
		_, err := FromChunk(api.ImageInput{Chunk: 2, Pointer: true, Location: c.loc, Format: "png"}, cfg, lim, Source{ImageDir: dir})
		if !errors.Is(err, ErrBadImage) || !strings.Contains(err.Error(), "chunk 2") || !strings.Contains(err.Error(), "location") || !strings.Contains(err.Error(), c.want) {
			t.Errorf("location %.60q: %v; want ErrBadImage naming chunk 2, location and %q", c.loc, err, c.want)
		}
	}
	// No image directory: file pointers are refused, data: URIs still work.
	_, err := FromChunk(api.ImageInput{Chunk: 0, Pointer: true, Location: "sub/red.png", Format: "png"}, cfg, lim, Source{})
	if !errors.Is(err, ErrBadImage) || !strings.Contains(err.Error(), "--image-dir") {
		t.Fatalf("no image dir: %v", err)
	}
	if _, err := FromChunk(api.ImageInput{Chunk: 0, Pointer: true, Location: "data:image/png;base64," + b64, Format: "png"}, cfg, lim, Source{}); err != nil {
		t.Fatalf("data: URI without an image dir: %v", err)
	}
	// A file over the byte limit is refused from its size.
	lim.MaxBytes = len(png) - 1
	if _, err := FromChunk(api.ImageInput{Chunk: 0, Pointer: true, Location: "sub/red.png", Format: "png"}, cfg, lim, Source{ImageDir: dir}); !errors.Is(err, ErrBadImage) || !strings.Contains(err.Error(), "limit") {
		t.Fatalf("file over the byte limit: %v", err)
	}
}
