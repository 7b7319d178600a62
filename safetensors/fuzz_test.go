package safetensors

import (
	"encoding/binary"
	"testing"
)

// header builds a file with a raw JSON header and n bytes of data.
func header(json string, n int) []byte {
	b := make([]byte, 8, 8+len(json)+n)
	binary.LittleEndian.PutUint64(b, uint64(len(json)))
	b = append(b, json...)
	return append(b, make([]byte, n)...)
}

// A shape whose element count overflows must not pass as a small tensor (the count used to wrap
// to 0, so an empty byte range "matched" a shape of 2^62 × 4 elements).
func TestParseRejectsOverflowingShapes(t *testing.T) {
	cases := map[string][]byte{
		"wraps to zero":  header(`{"a":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,0]}}`, 0),
		"wraps negative": header(`{"a":{"dtype":"F32","shape":[4611686018427387904,2],"data_offsets":[0,0]}}`, 0),
		"zero then huge": header(`{"a":{"dtype":"F32","shape":[0,9223372036854775807,9223372036854775807],"data_offsets":[0,0]}}`, 0),
		"too many dims":  header(`{"a":{"dtype":"F32","shape":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1],"data_offsets":[0,4]}}`, 4),
	}
	for name, b := range cases {
		if _, err := Parse(b); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// Parse never panics, and what it accepts is consistent: every tensor's bytes are exactly its
// shape's elements, so converting it cannot read out of range or allocate past the input.
func FuzzParse(f *testing.F) {
	good, _ := Encode(map[string]Tensor{"a": FromFloat32([]float32{1, 2}, 2), "b": FromFloat64([]float64{3}, 1, 1)},
		map[string]string{"format": "pt"})
	f.Add(good)
	f.Add(header(`{"a":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]},"__metadata__":{"x":"y"}}`, 4))
	f.Add(header(`{"a":{"dtype":"F16","shape":[],"data_offsets":[0,2]}}`, 2))
	f.Add(header(`{"a":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}}`, 8))
	f.Add(header(`{"a":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,0]}}`, 0))
	f.Fuzz(func(t *testing.T, b []byte) {
		file, err := Parse(b)
		if err != nil {
			return
		}
		for name, tn := range file.Tensors {
			size, _ := dtypeSize(tn.DType)
			count := 1
			for _, d := range tn.Shape {
				count *= d
			}
			if count < 0 || count > len(b) || count*size != len(tn.Data) {
				t.Fatalf("tensor %q: shape %v (%d elements) over %d bytes", name, tn.Shape, count, len(tn.Data))
			}
			if v, err := tn.Float64(); err == nil && len(v) != count {
				t.Fatalf("tensor %q: %d values for %d elements", name, len(v), count)
			}
		}
	})
}
