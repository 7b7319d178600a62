package api

import (
	"encoding/base64"
	"errors"
	"fmt"
	"slices"

	"google.golang.org/protobuf/encoding/protowire"
)

// Bounds on image chunks, checked before anything is decoded.
const (
	// MaxImageBytes bounds one image's encoded bytes (engine/imageproc's default limit).
	MaxImageBytes = 32 << 20
	// MaxLocationLength bounds an image_asset_pointer's location (a data: URI or a path).
	MaxLocationLength = 4096 + MaxImageBytes/3*4
)

// ImageFormats are ImageChunk.format's values in the SDK.
var ImageFormats = []string{"png", "jpeg"}

// ErrBadChunk marks a model_input chunk the sender got wrong: a 400.
var ErrBadChunk = errors.New("bad model_input chunk")

func badChunk(chunk int, field, format string, args ...any) error {
	return fmt.Errorf("%w: chunk %d: %s: %s", ErrBadChunk, chunk, field, fmt.Sprintf(format, args...))
}

// ImageInput is one image chunk of a model_input, its shape checked: an ImageChunk's decoded
// bytes, or an ImageAssetPointerChunk's location (resolved by engine/imageproc, not here).
type ImageInput struct {
	Chunk          int    // index in model_input.chunks, for error messages
	Pointer        bool   // image_asset_pointer: Location is set, Data is nil
	Data           []byte // ImageChunk bytes
	Location       string
	Format         string // "png" or "jpeg"
	ExpectedTokens *int   // nil when not given
}

// Part is one run of a model_input, in order: text tokens, or one image.
type Part struct {
	Tokens []int       // encoded_text
	Image  *ImageInput // image or image_asset_pointer
}

// HasImages says whether any chunk is an image kind.
func (m ModelInput) HasImages() bool {
	for _, c := range m.Chunks {
		if c.Type == "image" || c.Type == "image_asset_pointer" {
			return true
		}
	}
	return false
}

// Parts checks every chunk and returns them in order, text and images. Images are checked for
// shape only (format, base64, sizes, expected_tokens ≥ 0); engine/imageproc decodes them.
// Errors are ErrBadChunk and name the chunk and field.
func (m ModelInput) Parts() ([]Part, error) {
	out := make([]Part, 0, len(m.Chunks))
	for i, c := range m.Chunks {
		switch c.Type {
		case "encoded_text", "":
			out = append(out, Part{Tokens: c.Tokens})
		case "image", "image_asset_pointer":
			img, err := c.image(i)
			if err != nil {
				return nil, err
			}
			out = append(out, Part{Image: img})
		default:
			return nil, badChunk(i, "type", "%q chunks are not supported", c.Type)
		}
	}
	return out, nil
}

func (c Chunk) image(i int) (*ImageInput, error) {
	if !slices.Contains(ImageFormats, c.Format) {
		return nil, badChunk(i, "format", "%q is not one of %q", c.Format, ImageFormats)
	}
	if c.ExpectedTokens != nil && *c.ExpectedTokens < 0 {
		return nil, badChunk(i, "expected_tokens", "%d is negative", *c.ExpectedTokens)
	}
	img := &ImageInput{Chunk: i, Format: c.Format, ExpectedTokens: c.ExpectedTokens}
	if c.Type == "image_asset_pointer" {
		if c.Location == "" {
			return nil, badChunk(i, "location", "empty")
		}
		if len(c.Location) > MaxLocationLength {
			return nil, badChunk(i, "location", "%d bytes: the limit is %d", len(c.Location), MaxLocationLength)
		}
		img.Pointer, img.Location = true, c.Location
		return img, nil
	}
	if c.Data == "" {
		return nil, badChunk(i, "data", "no image bytes")
	}
	data, err := DecodeBase64(c.Data, MaxImageBytes)
	if err != nil {
		return nil, badChunk(i, "data", "%v", err)
	}
	img.Data = data
	return img, nil
}

// DecodeBase64 decodes standard base64, padded or not (Python's b64encode pads), refusing
// before it allocates anything that would decode to over limit bytes.
func DecodeBase64(s string, limit int) ([]byte, error) {
	if n := base64.RawStdEncoding.DecodedLen(len(s)); n > limit+2 {
		return nil, fmt.Errorf("%d bytes of base64 decode to about %d bytes: the limit is %d", len(s), n, limit)
	}
	enc := base64.StdEncoding
	if len(s)%4 != 0 {
		enc = base64.RawStdEncoding
	}
	b, err := enc.DecodeString(s)
	if err != nil {
		return nil, fmt.Errorf("not valid base64: %w", err)
	}
	if len(b) > limit {
		return nil, fmt.Errorf("%d bytes: the limit is %d", len(b), limit)
	}
	return b, nil
}

// decodeImageChunk reads a protobuf ImageChunk: data=1 (bytes), format=2 (string),
// expected_tokens=3 (optional int32). The bytes are kept base64, as JSON carries them.
func decodeImageChunk(b []byte, idx int, c *Chunk) error {
	return eachField(b, func(n protowire.Number, t protowire.Type, val []byte, v uint64) error {
		switch n {
		case 1, 2:
			if t != protowire.BytesType {
				return protoErr("datum %d: image chunk field %d has wrong wire type", idx, n)
			}
			if n == 1 {
				if len(val) > MaxImageBytes {
					return protoErr("datum %d: image is %d bytes: the limit is %d", idx, len(val), MaxImageBytes)
				}
				c.Data = base64.StdEncoding.EncodeToString(val)
			} else {
				c.Format = string(val)
			}
		case 3:
			if t != protowire.VarintType {
				return protoErr("datum %d: image expected_tokens has wrong wire type", idx)
			}
			e := int(int32(v))
			c.ExpectedTokens = &e
		}
		return nil
	})
}

// appendImageChunk writes a Chunk message holding an ImageChunk (field 2). Data that is not
// valid base64 is written empty, for the server to refuse.
func appendImageChunk(c Chunk) []byte {
	data, _ := DecodeBase64(c.Data, MaxImageBytes)
	ic := appendBytesField(nil, 1, data)
	ic = appendStringField(ic, 2, c.Format)
	if c.ExpectedTokens != nil {
		ic = appendVarintField(ic, 3, uint64(int64(int32(*c.ExpectedTokens))))
	}
	return appendBytesField(nil, 2, ic)
}
