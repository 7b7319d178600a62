package gguf

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"math"
	"os"
	"slices"
	"strings"
	"testing"
)

// Q6_K and Q4_0 (types skein only reads: Q4_K_M files keep some tensors in Q6_K) dequantize bit
// for bit as ggml's dequantize_row_q6_K / dequantize_row_q4_0 do, on blocks made by ggml's
// reference quantizers (testdata/ggml_dequant.json, from scripts/ggml_dequant_fixture.c).
func TestDequantizeMatchesGGML(t *testing.T) {
	b, err := os.ReadFile("testdata/ggml_dequant.json")
	if err != nil {
		t.Fatal(err)
	}
	var fx map[string][]struct{ Blocks, Values string }
	if err := json.Unmarshal(b, &fx); err != nil {
		t.Fatal(err)
	}
	for name, typ := range map[string]GGMLType{"q6_k": Q6_K, "q4_0": Q4_0} {
		if len(fx[name]) == 0 {
			t.Fatalf("no %s cases", name)
		}
		for i, c := range fx[name] {
			blocks, _ := hex.DecodeString(c.Blocks)
			vals, _ := hex.DecodeString(c.Values)
			n := len(vals) / 4
			got, err := Float32s(&TensorInfo{Name: name, Dims: []int{n}, Type: typ, Data: blocks})
			if err != nil {
				t.Fatal(err)
			}
			for j := range n {
				want := math.Float32frombits(binary.LittleEndian.Uint32(vals[4*j:]))
				if math.Float32bits(got[j]) != math.Float32bits(want) {
					t.Fatalf("%s case %d: element %d = %v, ggml %v", name, i, j, got[j], want)
				}
			}
		}
	}
}

// What Writer writes, Parse reads back: every metadata type, arrays, tensors of each type at
// aligned offsets.
func TestWriteParseRoundTrip(t *testing.T) {
	w := NewWriter()
	vals := []any{uint8(1), int8(-2), uint16(3), int16(-4), uint32(5), int32(-6), float32(7.5), true, "eight",
		uint64(9), int64(-10), float64(11.25)}
	for i, v := range vals {
		w.Set("k"+string(rune('a'+i)), v)
	}
	w.Set("strs", []string{"x", "", "zz"})
	w.Set("ints", []int{1, -2, 3})
	w.Set("floats", []float32{0.5, -1})
	w.AddF32("t.f32", []int{2, 3}, []float32{1, 2, 3, 4, 5, 6})
	w.AddTensor("t.q8", Q8_0, []int{32, 2}, make([]byte, 2*34))
	w.AddTensor("t.q4k", Q4_K, []int{256}, make([]byte, 144))
	var buf bytes.Buffer
	if err := w.Write(&buf); err != nil {
		t.Fatal(err)
	}
	f, err := Parse(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range vals {
		if got, _ := f.Value("k" + string(rune('a'+i))); got != v {
			t.Fatalf("key %d: %v (%T), want %v (%T)", i, got, got, v, v)
		}
	}
	if s, _, _ := f.Strings("strs"); !slices.Equal(s, []string{"x", "", "zz"}) {
		t.Fatalf("strs %v", s)
	}
	if s, _, _ := f.Ints("ints"); !slices.Equal(s, []int64{1, -2, 3}) {
		t.Fatalf("ints %v", s)
	}
	if s, _, _ := f.Float32s("floats"); !slices.Equal(s, []float32{0.5, -1}) {
		t.Fatalf("floats %v", s)
	}
	tf, ok := f.Tensor("t.f32")
	if !ok || !slices.Equal(tf.Dims, []int{3, 2}) || !slices.Equal(tf.Shape(), []int{2, 3}) {
		t.Fatalf("t.f32 %+v", tf)
	}
	v, _ := Float32s(tf)
	if !slices.Equal(v, []float32{1, 2, 3, 4, 5, 6}) {
		t.Fatalf("t.f32 values %v", v)
	}
	for _, tn := range f.Tensors {
		if tn.Offset%DefaultAlignment != 0 {
			t.Fatalf("%s at offset %d", tn.Name, tn.Offset)
		}
	}
	if q, _ := f.Tensor("t.q8"); len(q.Data) != 68 {
		t.Fatalf("t.q8 has %d bytes", len(q.Data))
	}
	// Typed accessors refuse the wrong type rather than guess.
	if _, _, err := f.String("ka"); err == nil {
		t.Fatal("a uint8 read as a string")
	}
	if _, _, err := f.Int("ki"); err == nil {
		t.Fatal("a string read as an integer")
	}
}

// Writer refuses what would be an invalid file: a row that is not whole blocks, data of the wrong
// size, a key or tensor twice.
func TestWriterRefusesInvalid(t *testing.T) {
	for name, w := range map[string]*Writer{
		"partial block": func() *Writer { w := NewWriter(); w.AddTensor("q", Q8_0, []int{16}, make([]byte, 17)); return w }(),
		"short data":    func() *Writer { w := NewWriter(); w.AddTensor("f", F32, []int{4}, make([]byte, 12)); return w }(),
		"key twice":     func() *Writer { w := NewWriter(); w.Set("a", "x"); w.Set("a", "y"); return w }(),
		"tensor twice": func() *Writer {
			w := NewWriter()
			w.AddF32("t", []int{1}, []float32{1})
			w.AddF32("t", []int{1}, []float32{1})
			return w
		}(),
	} {
		if err := w.Write(&bytes.Buffer{}); err == nil {
			t.Errorf("%s: written", name)
		}
	}
}

// Hostile headers are errors naming the fault, checked before anything is allocated from them.
func TestParseRefusesHostileHeaders(t *testing.T) {
	w := NewWriter()
	w.Set("general.alignment", uint32(64))
	w.Set("name", "v")
	w.AddF32("t", []int{16}, make([]float32, 16)) // 64 bytes: the file ends where its data does
	var buf bytes.Buffer
	if err := w.Write(&buf); err != nil {
		t.Fatal(err)
	}
	good := buf.Bytes()
	if _, err := Parse(good); err != nil {
		t.Fatalf("good file: %v", err)
	}
	le := binary.LittleEndian
	cases := map[string]func(b []byte){
		"magic":          func(b []byte) { b[0] = 'X' },
		"version":        func(b []byte) { le.PutUint32(b[4:], 7) },
		"tensor count":   func(b []byte) { le.PutUint64(b[8:], 1<<40) },
		"kv count":       func(b []byte) { le.PutUint64(b[16:], 1<<40) },
		"key length":     func(b []byte) { le.PutUint64(b[24:], 1<<60) },
		"alignment":      func(b []byte) { le.PutUint32(b[24+8+len("general.alignment")+4:], 48) },
		"value type":     func(b []byte) { le.PutUint32(b[24+8+len("general.alignment"):], 99) },
		"alignment type": func(b []byte) { le.PutUint32(b[24+8+len("general.alignment"):], uint32(TypeUint64)) },
	}
	for name, mutate := range cases {
		b := slices.Clone(good)
		mutate(b)
		if _, err := Parse(b); err == nil {
			t.Errorf("%s: parsed", name)
		}
	}
	for n := range len(good) - 1 {
		if _, err := Parse(good[:n]); err == nil {
			t.Fatalf("cut at %d: parsed", n)
		}
	}
}

// Tensors whose byte ranges overlap are refused: one range served as several weights (six on
// one, in the report) is a malformed file, never two weights (issue 40, item 15). Ranges that
// only touch are fine.
func TestParseRefusesOverlappingTensors(t *testing.T) {
	w := NewWriter()
	w.Set("general.alignment", uint32(32))
	w.AddF32("a", []int{16}, make([]float32, 16)) // 64 bytes at 0
	w.AddF32("b", []int{16}, make([]float32, 16)) // 64 bytes at 64
	w.AddF32("c", []int{8}, make([]float32, 8))   // 32 bytes at 128
	var buf bytes.Buffer
	if err := w.Write(&buf); err != nil {
		t.Fatal(err)
	}
	good := buf.Bytes()
	f, err := Parse(good)
	if err != nil {
		t.Fatalf("good file: %v", err)
	}
	if f.Tensors[1].Offset != 64 || f.Tensors[2].Offset != 128 {
		t.Fatalf("offsets %d %d", f.Tensors[1].Offset, f.Tensors[2].Offset)
	}
	// A tensor's offset is the 8 bytes after its name, dims count, dims and type.
	offsetAt := func(name string, dims int) int {
		i := bytes.Index(good, []byte{byte(len(name)), 0, 0, 0, 0, 0, 0, 0, name[0]})
		if i < 0 {
			t.Fatalf("tensor %q not found", name)
		}
		return i + 8 + len(name) + 4 + 8*dims + 4
	}
	for _, tc := range []struct {
		name   string
		offset uint64
	}{{"b", 0}, {"b", 32}, {"c", 96}, {"c", 0}} {
		b := slices.Clone(good)
		binary.LittleEndian.PutUint64(b[offsetAt(tc.name, 1):], tc.offset)
		_, err := Parse(b)
		if err == nil || !strings.Contains(err.Error(), "overlap") {
			t.Errorf("%s moved to %d: %v; want an error saying the tensors overlap", tc.name, tc.offset, err)
		}
	}
}
