// Package gguf reads and writes GGUF files, llama.cpp's (ggml's) model format: a header, typed
// metadata (key → value), tensor infos (name, dimensions innermost first, ggml type, offset) and
// the aligned tensor data. See ggml's docs/gguf.md.
//
// A file is hostile input: every count, length, offset and size is checked against the bytes the
// file has before anything is allocated from it, so a corrupt or crafted file is an error, never a
// panic or an allocation the file does not back. Tensor data slices alias the bytes parsed.
package gguf

import (
	"errors"
	"fmt"
)

// Magic starts every GGUF file ("GGUF" in ASCII, little-endian uint32 0x46554747).
const Magic = "GGUF"

// Version is the format version this package writes; versions 2 and 3 are read (same layout).
const Version = 3

// DefaultAlignment of tensor data when general.alignment is absent.
const DefaultAlignment = 32

// Bounds on what a file may declare (real models: a few hundred tensors, a few dozen keys, a
// vocabulary of at most a few hundred thousand strings). They keep loops and allocations
// proportional to what a real model needs even where the file's size would allow more.
const (
	MaxTensors   = 1 << 20
	MaxKVs       = 1 << 16
	MaxString    = 64 << 20 // one string (a chat template is a few kB; a tokens array has many short ones)
	MaxArray     = 1 << 26  // elements of one array
	MaxDims      = 4        // GGML_MAX_DIMS
	MaxAlignment = 1 << 16
	maxElements  = 1 << 50
)

// ErrFormat wraps every fault of a file's bytes.
var ErrFormat = errors.New("gguf: invalid file")

func formatErr(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrFormat, fmt.Sprintf(format, args...))
}

// ValueType is a metadata value's type tag.
type ValueType uint32

// Metadata value types (gguf_type).
const (
	TypeUint8   ValueType = 0
	TypeInt8    ValueType = 1
	TypeUint16  ValueType = 2
	TypeInt16   ValueType = 3
	TypeUint32  ValueType = 4
	TypeInt32   ValueType = 5
	TypeFloat32 ValueType = 6
	TypeBool    ValueType = 7
	TypeString  ValueType = 8
	TypeArray   ValueType = 9
	TypeUint64  ValueType = 10
	TypeInt64   ValueType = 11
	TypeFloat64 ValueType = 12
)

// size of a fixed-size value type; 0 for string and array.
func (t ValueType) size() int {
	switch t {
	case TypeUint8, TypeInt8, TypeBool:
		return 1
	case TypeUint16, TypeInt16:
		return 2
	case TypeUint32, TypeInt32, TypeFloat32:
		return 4
	case TypeUint64, TypeInt64, TypeFloat64:
		return 8
	}
	return 0
}

// GGMLType is a tensor's element type (ggml_type).
type GGMLType uint32

// The tensor types this package knows; others are refused at parse with their number.
const (
	F32  GGMLType = 0
	F16  GGMLType = 1
	Q4_0 GGMLType = 2
	Q8_0 GGMLType = 8
	Q4_K GGMLType = 12
	Q6_K GGMLType = 14
	BF16 GGMLType = 30
)

// typeInfo is a type's block geometry: elements per block and bytes per block.
var typeInfo = map[GGMLType]struct {
	name         string
	block, bytes int
}{
	F32:  {"F32", 1, 4},
	F16:  {"F16", 1, 2},
	Q4_0: {"Q4_0", 32, 18},
	Q8_0: {"Q8_0", 32, 34},
	Q4_K: {"Q4_K", 256, 144},
	Q6_K: {"Q6_K", 256, 210},
	BF16: {"BF16", 1, 2},
}

func (t GGMLType) String() string {
	if i, ok := typeInfo[t]; ok {
		return i.name
	}
	return fmt.Sprintf("type %d", uint32(t))
}

// BlockSize is the elements of one block of the type (1 for float types); 0 if unknown.
func (t GGMLType) BlockSize() int { return typeInfo[t].block }

// BlockBytes is the bytes of one block of the type; 0 if unknown.
func (t GGMLType) BlockBytes() int { return typeInfo[t].bytes }

// RowBytes is the bytes of a row of n elements, or an error if n is not whole blocks.
func (t GGMLType) RowBytes(n int) (int, error) {
	i, ok := typeInfo[t]
	if !ok {
		return 0, fmt.Errorf("gguf: unsupported tensor type %s", t)
	}
	if n%i.block != 0 {
		return 0, fmt.Errorf("gguf: a row of %d elements is not whole %s blocks of %d", n, t, i.block)
	}
	return n / i.block * i.bytes, nil
}

// KV is one metadata entry. Value is one of uint8, int8, uint16, int16, uint32, int32, float32,
// bool, string, uint64, int64, float64, or an Array.
type KV struct {
	Key   string
	Value any
}

// Array is a metadata array: its element type and the elements as a typed Go slice ([]string,
// []float32, []int32, []uint32, …, one of the scalar types' slices). Nested arrays are refused.
type Array struct {
	Type   ValueType
	Values any
}

// TensorInfo is one tensor: its name, dimensions innermost first (ggml's ne: a torch [out, in]
// matrix is [in, out] here), type, offset into the data section and, once parsed, its bytes.
type TensorInfo struct {
	Name   string
	Dims   []int
	Type   GGMLType
	Offset uint64
	Data   []byte
}

// Elements is the tensor's element count.
func (t *TensorInfo) Elements() int {
	n := 1
	for _, d := range t.Dims {
		n *= d
	}
	return n
}

// Shape is the tensor's shape in torch order (outermost first): Dims reversed.
func (t *TensorInfo) Shape() []int {
	s := make([]int, len(t.Dims))
	for i, d := range t.Dims {
		s[len(t.Dims)-1-i] = d
	}
	return s
}

// File is a parsed GGUF file.
type File struct {
	Version   uint32
	KVs       []KV // in file order
	Tensors   []TensorInfo
	Alignment int

	kv      map[string]any
	tensors map[string]*TensorInfo
}

// Tensor finds a tensor by name.
func (f *File) Tensor(name string) (*TensorInfo, bool) {
	t, ok := f.tensors[name]
	return t, ok
}

// Value is a key's value (nil, false if absent).
func (f *File) Value(key string) (any, bool) {
	v, ok := f.kv[key]
	return v, ok
}

// String is a string value; ok is false if absent; an error if of another type.
func (f *File) String(key string) (string, bool, error) {
	v, ok := f.kv[key]
	if !ok {
		return "", false, nil
	}
	s, isStr := v.(string)
	if !isStr {
		return "", true, fmt.Errorf("gguf: %s is %T, want a string", key, v)
	}
	return s, true, nil
}

// Int is an integer value of any integer type, as int64 (uint64 values above 2⁶³ are refused).
func (f *File) Int(key string) (int64, bool, error) {
	v, ok := f.kv[key]
	if !ok {
		return 0, false, nil
	}
	switch x := v.(type) {
	case uint8:
		return int64(x), true, nil
	case int8:
		return int64(x), true, nil
	case uint16:
		return int64(x), true, nil
	case int16:
		return int64(x), true, nil
	case uint32:
		return int64(x), true, nil
	case int32:
		return int64(x), true, nil
	case uint64:
		if x > 1<<62 {
			return 0, true, fmt.Errorf("gguf: %s = %d is out of range", key, x)
		}
		return int64(x), true, nil
	case int64:
		return x, true, nil
	}
	return 0, true, fmt.Errorf("gguf: %s is %T, want an integer", key, v)
}

// Float is a float (or integer) value as float64.
func (f *File) Float(key string) (float64, bool, error) {
	v, ok := f.kv[key]
	if !ok {
		return 0, false, nil
	}
	switch x := v.(type) {
	case float32:
		return float64(x), true, nil
	case float64:
		return x, true, nil
	}
	i, ok, err := f.Int(key)
	return float64(i), ok, err
}

// Bool is a bool value.
func (f *File) Bool(key string) (bool, bool, error) {
	v, ok := f.kv[key]
	if !ok {
		return false, false, nil
	}
	b, isBool := v.(bool)
	if !isBool {
		return false, true, fmt.Errorf("gguf: %s is %T, want a bool", key, v)
	}
	return b, true, nil
}

// Strings is a string array value.
func (f *File) Strings(key string) ([]string, bool, error) {
	v, ok := f.kv[key]
	if !ok {
		return nil, false, nil
	}
	a, isArr := v.(Array)
	s, isStr := a.Values.([]string)
	if !isArr || !isStr {
		return nil, true, fmt.Errorf("gguf: %s is not an array of strings", key)
	}
	return s, true, nil
}

// Float32s is an array of float32 values.
func (f *File) Float32s(key string) ([]float32, bool, error) {
	v, ok := f.kv[key]
	if !ok {
		return nil, false, nil
	}
	a, isArr := v.(Array)
	s, isF := a.Values.([]float32)
	if !isArr || !isF {
		return nil, true, fmt.Errorf("gguf: %s is not an array of float32", key)
	}
	return s, true, nil
}

// Ints is an array of any integer type, as int64s.
func (f *File) Ints(key string) ([]int64, bool, error) {
	v, ok := f.kv[key]
	if !ok {
		return nil, false, nil
	}
	a, isArr := v.(Array)
	if !isArr {
		return nil, true, fmt.Errorf("gguf: %s is not an array", key)
	}
	var out []int64
	switch s := a.Values.(type) {
	case []int32:
		out = make([]int64, len(s))
		for i, x := range s {
			out[i] = int64(x)
		}
	case []uint32:
		out = make([]int64, len(s))
		for i, x := range s {
			out[i] = int64(x)
		}
	case []int64:
		out = s
	case []uint8:
		out = make([]int64, len(s))
		for i, x := range s {
			out[i] = int64(x)
		}
	case []int8:
		out = make([]int64, len(s))
		for i, x := range s {
			out[i] = int64(x)
		}
	case []uint16:
		out = make([]int64, len(s))
		for i, x := range s {
			out[i] = int64(x)
		}
	case []int16:
		out = make([]int64, len(s))
		for i, x := range s {
			out[i] = int64(x)
		}
	default:
		return nil, true, fmt.Errorf("gguf: %s is not an array of integers", key)
	}
	return out, true, nil
}
