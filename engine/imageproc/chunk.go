package imageproc

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/skein-ai/skein/api"
)

// Source says where an image_asset_pointer's location may point: a data: URI always, a file
// only under ImageDir (the --image-dir flag; empty refuses files). Nothing is ever fetched.
type Source struct {
	ImageDir string
}

// ChunkError is a bad image chunk: which chunk of the model_input, which field, and why.
// It wraps ErrBadImage.
type ChunkError struct {
	Chunk int
	Field string // "data", "location" or "expected_tokens"
	Err   error
}

func (e *ChunkError) Error() string { return fmt.Sprintf("chunk %d: %s: %v", e.Chunk, e.Field, e.Err) }
func (e *ChunkError) Unwrap() error { return e.Err }

// TokenMismatchError is an image chunk whose expected_tokens differs from what the image costs.
type TokenMismatchError struct {
	Chunk, Expected, Actual int
	Info                    Info
}

func (e *TokenMismatchError) Error() string {
	return fmt.Sprintf("chunk %d: expected_tokens is %d but the image (%d×%d pixels, resized to %d×%d) is %d tokens",
		e.Chunk, e.Expected, e.Info.Width, e.Info.Height, e.Info.ResizedWidth, e.Info.ResizedHeight, e.Actual)
}
func (e *TokenMismatchError) Unwrap() error { return ErrBadImage }

// Pending is an image chunk whose bytes are resolved and whose header is checked: its Info says
// what it costs; Preprocess decodes it. Nothing has been decoded yet.
type Pending struct {
	Info
	chunk  int
	field  string
	data   []byte
	format string
	cfg    Config
	lim    Limits
	sh     *shared // a file's decode, kept for its other pointers (nil: not a file, or no Budget)
	budget *Budget
}

// Load resolves an image chunk's bytes (ImageChunk data, a data: URI, or a file under
// src.ImageDir), reads its header within lim, and checks expected_tokens: everything that can
// be refused is refused here, before any decoding. Errors wrap ErrBadImage (a 400) and name
// the chunk and field, except a server-side failure to open the image directory.
//
// b, when not nil, is the request's Budget: the image's encoded bytes are taken from it before
// a file is read, its pixels once its header is read; a file already loaded against b is
// neither read nor counted again.
func Load(in api.ImageInput, cfg Config, lim Limits, src Source, b *Budget) (*Pending, error) {
	field := "data"
	if in.Pointer {
		field = "location"
	}
	data, sh, err := resolve(in, lim, src, b)
	if err != nil {
		if errors.Is(err, ErrBadImage) {
			return nil, &ChunkError{Chunk: in.Chunk, Field: field, Err: err}
		}
		return nil, err
	}
	var info Info
	if sh != nil && sh.info != nil {
		info = *sh.info // this file's header was read and its pixels counted already
	} else {
		if info, err = Inspect(data, in.Format, cfg, lim); err == nil {
			err = b.spendPixels(info)
		}
		if err != nil {
			return nil, &ChunkError{Chunk: in.Chunk, Field: field, Err: err}
		}
		if sh != nil {
			sh.info = &info
		}
	}
	if in.ExpectedTokens != nil && *in.ExpectedTokens != info.Tokens {
		return nil, &TokenMismatchError{Chunk: in.Chunk, Expected: *in.ExpectedTokens, Actual: info.Tokens, Info: info}
	}
	return &Pending{Info: info, chunk: in.Chunk, field: field, data: data, format: in.Format, cfg: cfg, lim: lim, sh: sh, budget: b}, nil
}

// Preprocess decodes the image into pixel_values (see the package's Preprocess). A file named
// by several pointers of one request is decoded once; they share the Image (read-only).
func (p *Pending) Preprocess() (Image, error) {
	if p.sh != nil && p.sh.img != nil {
		return *p.sh.img, nil
	}
	img, err := Preprocess(p.data, p.format, p.cfg, p.lim)
	if err != nil {
		return Image{}, &ChunkError{Chunk: p.chunk, Field: p.field, Err: err}
	}
	if p.budget != nil {
		p.budget.decodes++
	}
	if p.sh != nil {
		p.sh.img = &img
	}
	return img, nil
}

// InspectChunk is Load's Info: the token count of an image chunk, from its header alone.
func InspectChunk(in api.ImageInput, cfg Config, lim Limits, src Source) (Info, error) {
	p, err := Load(in, cfg, lim, src, nil)
	if err != nil {
		return Info{}, err
	}
	return p.Info, nil
}

// FromChunk is Load then Preprocess: an image chunk's pixel_values, grid and token count.
func FromChunk(in api.ImageInput, cfg Config, lim Limits, src Source) (Image, error) {
	p, err := Load(in, cfg, lim, src, nil)
	if err != nil {
		return Image{}, err
	}
	return p.Preprocess()
}

// urlScheme matches a location that starts with a URL scheme (RFC 3986: letter, then letters,
// digits, +, -, .), as http:, https:, file:, s3: do.
var urlScheme = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.\-]*:`)

// resolve gives an image chunk's bytes, and for a file the record its other pointers share
// (when b is not nil). Bytes are taken from b: a file's size before it is read, inline and
// data: bytes (already bounded by the request body) once decoded.
func resolve(in api.ImageInput, lim Limits, src Source, b *Budget) ([]byte, *shared, error) {
	lim = lim.orDefault()
	if !in.Pointer {
		return in.Data, nil, b.spendBytes(int64(len(in.Data))) // Inspect checks its size
	}
	loc := in.Location
	switch {
	case strings.HasPrefix(loc, "data:"):
		data, err := parseDataURI(loc[len("data:"):], in.Format, lim.MaxBytes)
		if err == nil {
			err = b.spendBytes(int64(len(data)))
		}
		return data, nil, err
	case urlScheme.MatchString(loc):
		return nil, nil, badImage("%.80q looks like a URL: this server fetches nothing; send the bytes in an image chunk or a data: URI", loc)
	case src.ImageDir == "":
		return nil, nil, badImage("%.80q is a file path, and this server serves no image directory (--image-dir); send the bytes in an image chunk or a data: URI", loc)
	}
	return readUnder(src.ImageDir, loc, in.Format, lim.MaxBytes, b)
}

// parseDataURI reads "[<media type>][;params];base64,<data>"; the media type, when given,
// must agree with the chunk's format.
func parseDataURI(rest, format string, limit int) ([]byte, error) {
	comma := strings.IndexByte(rest, ',')
	if comma < 0 {
		return nil, badImage("data: URI has no comma before its data")
	}
	meta := strings.Split(rest[:comma], ";")
	if meta[len(meta)-1] != "base64" {
		return nil, badImage("data: URI must be base64 (data:image/%s;base64,...)", format)
	}
	if media := strings.ToLower(meta[0]); media != "" {
		mediaFormat := map[string]string{"image/png": "png", "image/jpeg": "jpeg", "image/jpg": "jpeg"}[media]
		if mediaFormat != format {
			return nil, badImage("data: URI media type %q does not match the chunk's format %q", media, format)
		}
	}
	b, err := api.DecodeBase64(rest[comma+1:], limit)
	if err != nil {
		return nil, badImage("data: URI: %v", err)
	}
	return b, nil
}

// readUnder reads a regular file at loc inside dir. loc is relative to dir, or absolute and
// inside it; ".." is refused outright, and os.Root refuses symlinks that lead out of dir. With
// a Budget, a file this request has read already (by its cleaned path) is not read again, and
// a new file's size is taken from the budget before it is read.
func readUnder(dir, loc, format string, limit int, b *Budget) ([]byte, *shared, error) {
	for _, el := range strings.Split(filepath.ToSlash(loc), "/") {
		if el == ".." {
			return nil, nil, badImage("%.80q: \"..\" is not allowed in image paths", loc)
		}
	}
	rel := loc
	if filepath.IsAbs(loc) {
		absDir, err := filepath.Abs(dir)
		if err != nil {
			return nil, nil, fmt.Errorf("image directory: %w", err)
		}
		if rel, err = filepath.Rel(absDir, filepath.Clean(loc)); err != nil {
			rel = loc
		}
	}
	rel = filepath.Clean(rel)
	if !filepath.IsLocal(rel) {
		return nil, nil, badImage("%.80q is outside the image directory", loc)
	}
	key := rel + "\x00" + format
	if sh := b.file(key); sh != nil {
		return sh.data, sh, nil
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("image directory: %w", err)
	}
	defer root.Close()
	// Stat before opening: opening a FIFO or device could block or read forever.
	fi, err := root.Stat(rel)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil, badImage("%.80q: no such image in the image directory", loc)
		}
		return nil, nil, badImage("%.80q cannot be read under the image directory: %v", loc, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, nil, badImage("%.80q is not a regular file", loc)
	}
	if fi.Size() > int64(limit) {
		return nil, nil, badImage("%.80q is %d bytes: this server's limit is %d", loc, fi.Size(), limit)
	}
	if err := b.spendBytes(fi.Size()); err != nil { // before a byte is read
		return nil, nil, err
	}
	f, err := root.Open(rel)
	if err != nil {
		return nil, nil, badImage("%.80q cannot be read under the image directory: %v", loc, err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, fi.Size()+1))
	if err != nil {
		return nil, nil, badImage("%.80q: %v", loc, err)
	}
	if int64(len(data)) > fi.Size() { // it grew since stat: what the budget took no longer holds
		return nil, nil, badImage("%.80q grew while it was read", loc)
	}
	return data, b.keep(key, data), nil
}

// CheckImageDir checks, at startup, that an --image-dir setting names a directory (empty:
// no image directory, file pointers refused).
func CheckImageDir(dir string) error {
	if dir == "" {
		return nil
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("--image-dir: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("--image-dir %s is not a directory", dir)
	}
	return nil
}
