package safetensors

import (
	"encoding/binary"
	"math"
	"testing"
)

func TestRoundTripAndConversions(t *testing.T) {
	f32 := []float32{1, -2.5, 3e-8, float32(math.Inf(1))}
	bf := Tensor{DType: "BF16", Shape: []int{3}, Data: []byte{0x80, 0x3f, 0x20, 0xc0, 0x00, 0x00}} // 1, -2.5, 0
	h := Tensor{DType: "F16", Shape: []int{3}, Data: make([]byte, 6)}
	for i, v := range []uint16{0x3c00, 0xc100, 0x0001} { // 1, -2.5, smallest subnormal
		binary.LittleEndian.PutUint16(h.Data[2*i:], v)
	}
	b, err := Encode(map[string]Tensor{"a": FromFloat32(f32, 2, 2), "b": bf, "h": h}, map[string]string{"format": "pt"})
	if err != nil {
		t.Fatal(err)
	}
	f, err := Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	if f.Metadata["format"] != "pt" {
		t.Fatalf("metadata %v", f.Metadata)
	}
	got, _ := f.Tensors["a"].Float32()
	for i := range f32 {
		if got[i] != f32[i] {
			t.Fatalf("f32[%d] = %v", i, got[i])
		}
	}
	if v, _ := f.Tensors["b"].Float32(); v[0] != 1 || v[1] != -2.5 || v[2] != 0 {
		t.Fatalf("bf16 %v", v)
	}
	if v, _ := f.Tensors["h"].Float32(); v[0] != 1 || v[1] != -2.5 || math.Abs(float64(v[2])-5.960464477539063e-08) > 1e-15 {
		t.Fatalf("f16 %v", v)
	}
}

func TestParseRejectsCorruptFiles(t *testing.T) {
	good, _ := Encode(map[string]Tensor{"a": FromFloat32([]float32{1, 2}, 2)}, nil)
	cases := map[string][]byte{
		"short":         good[:4],
		"header beyond": append([]byte{0xff, 0xff, 0, 0, 0, 0, 0, 0}, good[8:]...),
		"truncated":     good[:len(good)-1],
		"bad json":      append(append([]byte{}, good[:8]...), []byte("{not json}")...),
	}
	for name, b := range cases {
		if _, err := Parse(b); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// Float32Into converts into the caller's buffer the values Float32 returns, and refuses a buffer
// of another length or a dtype that is not a float, writing nothing.
func TestFloat32IntoConvertsIntoTheBuffer(t *testing.T) {
	bf := Tensor{DType: "BF16", Shape: []int{3}, Data: []byte{0x80, 0x3f, 0x20, 0xc0, 0x00, 0x00}}
	dst := make([]float32, 3)
	if err := bf.Float32Into(dst); err != nil || dst[0] != 1 || dst[1] != -2.5 || dst[2] != 0 {
		t.Fatalf("bf16 into %v: %v", dst, err)
	}
	for name, c := range map[string]struct {
		t   Tensor
		dst []float32
	}{
		"short buffer": {bf, make([]float32, 2)},
		"long buffer":  {bf, make([]float32, 4)},
		"int32":        {Tensor{DType: "I32", Shape: []int{1}, Data: make([]byte, 4)}, make([]float32, 1)},
		"unknown":      {Tensor{DType: "Q4", Shape: []int{1}, Data: make([]byte, 4)}, make([]float32, 1)},
	} {
		for i := range c.dst {
			c.dst[i] = 7
		}
		if err := c.t.Float32Into(c.dst); err == nil {
			t.Errorf("%s: no error", name)
		}
		for _, v := range c.dst {
			if v != 7 {
				t.Errorf("%s: wrote %v", name, c.dst)
				break
			}
		}
	}
}
