package api

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
)

// TestImageChunksJSON: the SDK's ImageChunk (base64 data) and ImageAssetPointerChunk decode
// into typed parts, in order with the text around them.
func TestImageChunksJSON(t *testing.T) {
	png := []byte("\x89PNG fake bytes")
	body := `{"chunks": [
		{"type": "encoded_text", "tokens": [1, 2]},
		{"type": "image", "data": "` + base64.StdEncoding.EncodeToString(png) + `", "format": "png", "expected_tokens": 6},
		{"type": "encoded_text", "tokens": [3]},
		{"type": "image_asset_pointer", "location": "cats/1.jpeg", "format": "jpeg"}
	]}`
	var m ModelInput
	if err := json.Unmarshal([]byte(body), &m); err != nil {
		t.Fatal(err)
	}
	if !m.HasImages() {
		t.Fatal("HasImages = false")
	}
	parts, err := m.Parts()
	if err != nil {
		t.Fatal(err)
	}
	if len(parts) != 4 || len(parts[0].Tokens) != 2 || parts[1].Image == nil || len(parts[2].Tokens) != 1 || parts[3].Image == nil {
		t.Fatalf("parts %+v", parts)
	}
	img := parts[1].Image
	if img.Chunk != 1 || img.Pointer || !bytes.Equal(img.Data, png) || img.Format != "png" || img.ExpectedTokens == nil || *img.ExpectedTokens != 6 {
		t.Fatalf("image part %+v", img)
	}
	ptr := parts[3].Image
	if ptr.Chunk != 3 || !ptr.Pointer || ptr.Location != "cats/1.jpeg" || ptr.Format != "jpeg" || ptr.ExpectedTokens != nil || ptr.Data != nil {
		t.Fatalf("pointer part %+v", ptr)
	}
	// Text models keep refusing images, naming the chunk.
	if _, err := m.Tokens(); err == nil || !strings.Contains(err.Error(), "chunk 1") || !strings.Contains(err.Error(), "not supported by text models") {
		t.Fatalf("Tokens() = %v", err)
	}
}

// TestImageChunkProto: the protobuf ImageChunk (data=1 bytes, format=2, expected_tokens=3)
// decodes to the same typed part as JSON, and the encoder writes it back.
func TestImageChunkProto(t *testing.T) {
	data := []byte{0xFF, 0xD8, 0, 1, 2, 250}
	six := 6
	req := &ForwardBackwardRequest{ModelID: "m", Input: ForwardBackwardInput{LossFn: "cross_entropy", Data: []Datum{{
		ModelInput: ModelInput{Chunks: []Chunk{
			{Type: "encoded_text", Tokens: []int{5}},
			{Type: "image", Data: base64.StdEncoding.EncodeToString(data), Format: "jpeg", ExpectedTokens: &six},
			{Type: "image", Data: base64.StdEncoding.EncodeToString(data), Format: "png"},
		}},
		LossFnInputs: map[string]TensorData{"weights": {Data: []float64{1}, DType: "float32"}},
	}}}}
	got, err := DecodeForwardBackwardRequest(EncodeForwardBackwardRequest(req))
	if err != nil {
		t.Fatal(err)
	}
	parts, err := got.Input.Data[0].ModelInput.Parts()
	if err != nil {
		t.Fatal(err)
	}
	if len(parts) != 3 || parts[1].Image == nil || parts[2].Image == nil {
		t.Fatalf("parts %+v", parts)
	}
	a, b := parts[1].Image, parts[2].Image
	if !bytes.Equal(a.Data, data) || a.Format != "jpeg" || a.ExpectedTokens == nil || *a.ExpectedTokens != 6 || a.Chunk != 1 {
		t.Fatalf("first image %+v", a)
	}
	if !bytes.Equal(b.Data, data) || b.Format != "png" || b.ExpectedTokens != nil || b.Chunk != 2 {
		t.Fatalf("second image %+v", b)
	}

	// A hand-written ImageChunk whose fields have the wrong wire types is malformed.
	bad := protowire.AppendTag(nil, 1, protowire.VarintType)
	bad = protowire.AppendVarint(bad, 7)
	if _, err := decodeChunk(protowire.AppendBytes(protowire.AppendTag(nil, 2, protowire.BytesType), bad), 0); !errors.Is(err, ErrProto) {
		t.Fatalf("image data as a varint: %v", err)
	}
}

// TestBadImageChunks: every malformed image chunk is ErrBadChunk naming the chunk and field.
func TestBadImageChunks(t *testing.T) {
	neg := -1
	ok := base64.StdEncoding.EncodeToString([]byte("x"))
	cases := []struct {
		chunk Chunk
		want  string
	}{
		{Chunk{Type: "image", Data: ok, Format: "gif"}, "format"},
		{Chunk{Type: "image", Data: ok}, "format"},
		{Chunk{Type: "image", Format: "png"}, "data"},
		{Chunk{Type: "image", Data: "!!not base64!!", Format: "png"}, "base64"},
		{Chunk{Type: "image", Data: strings.Repeat("A", MaxImageBytes/3*4+8), Format: "png"}, "bytes"},
		{Chunk{Type: "image", Data: ok, Format: "png", ExpectedTokens: &neg}, "expected_tokens"},
		{Chunk{Type: "image_asset_pointer", Format: "png"}, "location"},
		{Chunk{Type: "image_asset_pointer", Format: "png", Location: strings.Repeat("a", MaxLocationLength+1)}, "location"},
		{Chunk{Type: "image_asset_pointer", Location: "a.png", Format: "webp"}, "format"},
		{Chunk{Type: "dmel"}, "dmel"},
	}
	for _, c := range cases {
		m := ModelInput{Chunks: []Chunk{{Type: "encoded_text", Tokens: []int{1}}, c.chunk}}
		_, err := m.Parts()
		if !errors.Is(err, ErrBadChunk) || !strings.Contains(err.Error(), "chunk 1") || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Parts(%+v) = %v; want ErrBadChunk naming chunk 1 and %q", c.chunk, err, c.want)
		}
	}
}

// imageRequest is sampleRequest with an image chunk between two text chunks.
func imageRequest() *ForwardBackwardRequest {
	r := sampleRequest()
	four := 4
	d := &r.Input.Data[0]
	d.ModelInput.Chunks = append(d.ModelInput.Chunks,
		Chunk{Type: "image", Data: base64.StdEncoding.EncodeToString([]byte("\x89PNG")), Format: "png", ExpectedTokens: &four},
		Chunk{Type: "encoded_text", Tokens: []int{9}})
	return r
}

// TestImageRequestRoundTrip: an image chunk survives protobuf encode and decode unchanged.
func TestImageRequestRoundTrip(t *testing.T) {
	r := imageRequest()
	got, err := DecodeForwardBackwardRequest(EncodeForwardBackwardRequest(r))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, r) {
		t.Fatalf("round trip:\n got  %+v\n want %+v", got, r)
	}
}
