package gguf

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"os"
)

// Writer builds a GGUF file: metadata and tensors in the order added, data aligned to
// general.alignment if it is set, else to DefaultAlignment.
type Writer struct {
	kvs     []KV
	tensors []TensorInfo
}

// NewWriter starts an empty file.
func NewWriter() *Writer { return &Writer{} }

// Set adds a metadata entry (a value of a type KV lists; an int is written as int32, a []int
// as an int32 array). Setting a key twice is an error at Write.
func (w *Writer) Set(key string, v any) {
	switch x := v.(type) {
	case int:
		v = int32(x)
	case []int:
		a := make([]int32, len(x))
		for i, e := range x {
			a[i] = int32(e)
		}
		v = Array{Type: TypeInt32, Values: a}
	case []string:
		v = Array{Type: TypeString, Values: x}
	case []float32:
		v = Array{Type: TypeFloat32, Values: x}
	case []int32:
		v = Array{Type: TypeInt32, Values: x}
	}
	w.kvs = append(w.kvs, KV{Key: key, Value: v})
}

// AddTensor adds a tensor of ggml type t with dims innermost first and its raw bytes.
func (w *Writer) AddTensor(name string, t GGMLType, dims []int, data []byte) {
	w.tensors = append(w.tensors, TensorInfo{Name: name, Type: t, Dims: dims, Data: data})
}

// AddF32 adds a float32 tensor given in torch shape (outermost first).
func (w *Writer) AddF32(name string, shape []int, v []float32) {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	w.AddTensor(name, F32, reverse(shape), b)
}

func reverse(s []int) []int {
	out := make([]int, len(s))
	for i, d := range s {
		out[len(s)-1-i] = d
	}
	return out
}

// WriteFile writes the file to path (through a temporary file renamed into place).
func (w *Writer) WriteFile(path string) error {
	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	if err := w.Write(f); err != nil {
		f.Close()
		os.Remove(tmp)
		return err
	}
	if err := f.Close(); err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, path)
}

// Write writes the file to out (buffered: the encoding writes field by field).
func (w *Writer) Write(out io.Writer) error {
	bw := bufio.NewWriterSize(out, 1<<16)
	if err := w.write(bw); err != nil {
		return err
	}
	return bw.Flush()
}

func (w *Writer) write(out io.Writer) error {
	e := &enc{w: out, align: DefaultAlignment}
	for _, kv := range w.kvs {
		if kv.Key == "general.alignment" {
			a, ok := kv.Value.(uint32)
			if !ok || a == 0 || a&(a-1) != 0 || a > MaxAlignment {
				return fmt.Errorf("gguf: general.alignment %v is not a power of two uint32 up to %d", kv.Value, MaxAlignment)
			}
			e.align = int(a)
		}
	}
	e.bytes([]byte(Magic))
	e.u32(Version)
	e.u64(uint64(len(w.tensors)))
	e.u64(uint64(len(w.kvs)))
	seen := map[string]bool{}
	for _, kv := range w.kvs {
		if seen[kv.Key] {
			return fmt.Errorf("gguf: metadata key %q set twice", kv.Key)
		}
		seen[kv.Key] = true
		e.str(kv.Key)
		if err := e.value(kv.Value, true); err != nil {
			return fmt.Errorf("gguf: %s: %w", kv.Key, err)
		}
	}
	names := map[string]bool{}
	offset := uint64(0)
	for i := range w.tensors {
		t := &w.tensors[i]
		if names[t.Name] {
			return fmt.Errorf("gguf: tensor %q added twice", t.Name)
		}
		names[t.Name] = true
		if len(t.Dims) == 0 || len(t.Dims) > MaxDims {
			return fmt.Errorf("gguf: tensor %q has %d dimensions", t.Name, len(t.Dims))
		}
		rowBytes, err := t.Type.RowBytes(t.Dims[0])
		if err != nil {
			return fmt.Errorf("gguf: tensor %q: %w", t.Name, err)
		}
		size := rowBytes
		for _, d := range t.Dims[1:] {
			size *= d
		}
		if size != len(t.Data) {
			return fmt.Errorf("gguf: tensor %q: %d bytes of data, its dims %v of %s need %d", t.Name, len(t.Data), t.Dims, t.Type, size)
		}
		e.str(t.Name)
		e.u32(uint32(len(t.Dims)))
		for _, d := range t.Dims {
			e.u64(uint64(d))
		}
		e.u32(uint32(t.Type))
		e.u64(offset)
		t.Offset = offset
		offset += uint64((size + e.align - 1) / e.align * e.align)
	}
	e.pad()
	for _, t := range w.tensors {
		e.bytes(t.Data)
		e.pad()
	}
	return e.err
}

type enc struct {
	w     io.Writer
	n     int
	align int
	err   error
}

func (e *enc) bytes(b []byte) {
	if e.err != nil {
		return
	}
	n, err := e.w.Write(b)
	e.n += n
	e.err = err
}

func (e *enc) u32(v uint32) { e.bytes(binary.LittleEndian.AppendUint32(nil, v)) }
func (e *enc) u64(v uint64) { e.bytes(binary.LittleEndian.AppendUint64(nil, v)) }
func (e *enc) str(s string) { e.u64(uint64(len(s))); e.bytes([]byte(s)) }
func (e *enc) pad() {
	if r := e.n % e.align; r != 0 {
		e.bytes(make([]byte, e.align-r))
	}
}

// value writes a value with its type tag (tag false: an array element, untagged).
func (e *enc) value(v any, tag bool) error {
	t := func(vt ValueType) {
		if tag {
			e.u32(uint32(vt))
		}
	}
	switch x := v.(type) {
	case uint8:
		t(TypeUint8)
		e.bytes([]byte{x})
	case int8:
		t(TypeInt8)
		e.bytes([]byte{byte(x)})
	case bool:
		t(TypeBool)
		b := byte(0)
		if x {
			b = 1
		}
		e.bytes([]byte{b})
	case uint16:
		t(TypeUint16)
		e.bytes(binary.LittleEndian.AppendUint16(nil, x))
	case int16:
		t(TypeInt16)
		e.bytes(binary.LittleEndian.AppendUint16(nil, uint16(x)))
	case uint32:
		t(TypeUint32)
		e.u32(x)
	case int32:
		t(TypeInt32)
		e.u32(uint32(x))
	case float32:
		t(TypeFloat32)
		e.u32(math.Float32bits(x))
	case uint64:
		t(TypeUint64)
		e.u64(x)
	case int64:
		t(TypeInt64)
		e.u64(uint64(x))
	case float64:
		t(TypeFloat64)
		e.u64(math.Float64bits(x))
	case string:
		t(TypeString)
		e.str(x)
	case Array:
		if !tag {
			return fmt.Errorf("nested array")
		}
		e.u32(uint32(TypeArray))
		e.u32(uint32(x.Type))
		return e.array(x)
	default:
		return fmt.Errorf("unsupported value type %T", v)
	}
	return nil
}

func (e *enc) array(a Array) error {
	var n int
	var each func(i int) any
	switch s := a.Values.(type) {
	case []string:
		n, each = len(s), func(i int) any { return s[i] }
	case []float32:
		n, each = len(s), func(i int) any { return s[i] }
	case []int32:
		n, each = len(s), func(i int) any { return s[i] }
	case []uint32:
		n, each = len(s), func(i int) any { return s[i] }
	case []int64:
		n, each = len(s), func(i int) any { return s[i] }
	case []uint8:
		n, each = len(s), func(i int) any { return s[i] }
	case []bool:
		n, each = len(s), func(i int) any { return s[i] }
	default:
		return fmt.Errorf("unsupported array %T", a.Values)
	}
	e.u64(uint64(n))
	for i := range n {
		if err := e.value(each(i), false); err != nil {
			return err
		}
	}
	return nil
}
