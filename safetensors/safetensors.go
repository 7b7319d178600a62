// Package safetensors reads and writes the safetensors format used by Hugging Face
// checkpoints and PEFT adapters: an 8-byte little-endian header length, a JSON
// header mapping tensor names to dtype, shape and byte range, then the raw data.
//
// Only what skein needs is here: F32, F64, F16 and BF16 tensors, all read as
// float32 or float64 (bf16 and f16 are widened on load).
package safetensors

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
)

// Tensor is one named array as stored in a file.
type Tensor struct {
	DType string // "F32", "F64", "F16", "BF16"
	Shape []int
	Data  []byte // raw little-endian bytes
}

// ErrFormat is returned for a file that is not valid safetensors.
var ErrFormat = errors.New("safetensors: invalid file")

// Bounds on what a file may declare, checked before anything is allocated from it: a hostile or
// corrupt header must be an error, never a panic or an allocation the file does not back.
const (
	// MaxHeaderBytes is the largest JSON header accepted (the reference implementation's limit).
	MaxHeaderBytes = 100 << 20
	// MaxTensors is the most tensors one file may hold (real checkpoints have a few thousand).
	MaxTensors = 1 << 20
	// MaxDims is the most dimensions a tensor may have.
	MaxDims = 16
	// maxElements bounds a shape's element count, zero dimensions aside, so counts never overflow.
	maxElements = 1 << 50
)

type headerEntry struct {
	DType       string   `json:"dtype"`
	Shape       []int    `json:"shape"`
	DataOffsets [2]int64 `json:"data_offsets"`
}

// File is a parsed safetensors file.
type File struct {
	Metadata map[string]string
	Tensors  map[string]Tensor
}

// ReadFile parses a whole file into memory.
func ReadFile(path string) (*File, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	f, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return f, nil
}

// Parse decodes safetensors bytes. Tensor data slices alias b.
func Parse(b []byte) (*File, error) {
	if len(b) < 8 {
		return nil, fmt.Errorf("%w: too short", ErrFormat)
	}
	n := binary.LittleEndian.Uint64(b[:8])
	if n > uint64(len(b)-8) {
		return nil, fmt.Errorf("%w: header length %d beyond file", ErrFormat, n)
	}
	if n > MaxHeaderBytes {
		return nil, fmt.Errorf("%w: header of %d bytes is over the %d-byte limit", ErrFormat, n, MaxHeaderBytes)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b[8:8+n], &raw); err != nil {
		return nil, fmt.Errorf("%w: header: %v", ErrFormat, err)
	}
	if len(raw) > MaxTensors+1 { // +1: __metadata__
		return nil, fmt.Errorf("%w: %d tensors, over the limit of %d", ErrFormat, len(raw), MaxTensors)
	}
	data := b[8+n:]
	f := &File{Tensors: map[string]Tensor{}}
	for name, msg := range raw {
		if name == "__metadata__" {
			_ = json.Unmarshal(msg, &f.Metadata)
			continue
		}
		var e headerEntry
		if err := json.Unmarshal(msg, &e); err != nil {
			return nil, fmt.Errorf("%w: tensor %q: %v", ErrFormat, name, err)
		}
		size, ok := dtypeSize(e.DType)
		if !ok {
			return nil, fmt.Errorf("%w: tensor %q: unsupported dtype %s", ErrFormat, name, e.DType)
		}
		count, err := elements(e.Shape)
		if err != nil {
			return nil, fmt.Errorf("%w: tensor %q: %v", ErrFormat, name, err)
		}
		lo, hi := e.DataOffsets[0], e.DataOffsets[1]
		if lo < 0 || hi < lo || hi > int64(len(data)) || hi-lo != int64(count*size) {
			return nil, fmt.Errorf("%w: tensor %q: bad data offsets", ErrFormat, name)
		}
		f.Tensors[name] = Tensor{DType: e.DType, Shape: e.Shape, Data: data[lo:hi]}
	}
	return f, nil
}

// elements is a shape's element count, refusing shapes whose count (zero dimensions aside)
// would overflow.
func elements(shape []int) (int, error) {
	if len(shape) > MaxDims {
		return 0, fmt.Errorf("%d dimensions, over the limit of %d", len(shape), MaxDims)
	}
	count, nonZero := 1, 1
	for _, d := range shape {
		if d < 0 {
			return 0, errors.New("negative dimension")
		}
		if d == 0 {
			count = 0
			continue
		}
		if d > maxElements/nonZero {
			return 0, fmt.Errorf("shape %v is too large", shape)
		}
		nonZero *= d
		count *= d
	}
	return count, nil
}

func dtypeSize(dt string) (int, bool) {
	switch dt {
	case "F32", "I32":
		return 4, true
	case "F64", "I64":
		return 8, true
	case "F16", "BF16":
		return 2, true
	}
	return 0, false
}

// Float32 returns the tensor's values widened or narrowed to float32.
func (t Tensor) Float32() ([]float32, error) {
	size, ok := dtypeSize(t.DType)
	if !ok || t.DType == "I32" || t.DType == "I64" {
		return nil, fmt.Errorf("safetensors: cannot convert %s to float32", t.DType)
	}
	out := make([]float32, len(t.Data)/size)
	if err := t.Float32Into(out); err != nil {
		return nil, err
	}
	return out, nil
}

// Float32Into writes the tensor's values widened or narrowed to float32 into dst, which must
// hold exactly as many: a loader converting a big tensor a few rows at a time reuses one buffer
// rather than leaving a float32 copy of every part to the collector.
func (t Tensor) Float32Into(dst []float32) error {
	size, ok := dtypeSize(t.DType)
	if !ok || t.DType == "I32" || t.DType == "I64" {
		return fmt.Errorf("safetensors: cannot convert %s to float32", t.DType)
	}
	if len(dst)*size != len(t.Data) {
		return fmt.Errorf("safetensors: %d float32 values for %d bytes of %s", len(dst), len(t.Data), t.DType)
	}
	switch t.DType {
	case "F32":
		for i := range dst {
			dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(t.Data[4*i:]))
		}
	case "F64":
		for i := range dst {
			dst[i] = float32(math.Float64frombits(binary.LittleEndian.Uint64(t.Data[8*i:])))
		}
	case "BF16":
		for i := range dst {
			dst[i] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(t.Data[2*i:])) << 16)
		}
	case "F16":
		for i := range dst {
			dst[i] = halfToFloat(binary.LittleEndian.Uint16(t.Data[2*i:]))
		}
	}
	return nil
}

// Float64 returns the values as float64 (F64 exactly, others widened).
func (t Tensor) Float64() ([]float64, error) {
	if t.DType == "F64" {
		out := make([]float64, len(t.Data)/8)
		for i := range out {
			out[i] = math.Float64frombits(binary.LittleEndian.Uint64(t.Data[8*i:]))
		}
		return out, nil
	}
	f, err := t.Float32()
	if err != nil {
		return nil, err
	}
	out := make([]float64, len(f))
	for i, v := range f {
		out[i] = float64(v)
	}
	return out, nil
}

func halfToFloat(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	frac := uint32(h) & 0x3ff
	switch {
	case exp == 0 && frac == 0:
		return math.Float32frombits(sign)
	case exp == 0: // subnormal
		v := float32(frac) / 1024 * float32(math.Pow(2, -14))
		if sign != 0 {
			v = -v
		}
		return v
	case exp == 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | frac<<13)
	}
	return math.Float32frombits(sign | (exp+112)<<23 | frac<<13)
}

// FromFloat32 makes an F32 tensor.
func FromFloat32(v []float32, shape ...int) Tensor {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return Tensor{DType: "F32", Shape: shape, Data: b}
}

// FromFloat64 makes an F64 tensor.
func FromFloat64(v []float64, shape ...int) Tensor {
	b := make([]byte, 8*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint64(b[8*i:], math.Float64bits(x))
	}
	return Tensor{DType: "F64", Shape: shape, Data: b}
}

// Encode serializes tensors, names sorted so output is deterministic.
func Encode(tensors map[string]Tensor, metadata map[string]string) ([]byte, error) {
	names := make([]string, 0, len(tensors))
	for n := range tensors {
		names = append(names, n)
	}
	sort.Strings(names)
	header := map[string]any{}
	if len(metadata) > 0 {
		header["__metadata__"] = metadata
	}
	var off int64
	for _, n := range names {
		t := tensors[n]
		shape := t.Shape
		if shape == nil {
			shape = []int{}
		}
		header[n] = headerEntry{DType: t.DType, Shape: shape, DataOffsets: [2]int64{off, off + int64(len(t.Data))}}
		off += int64(len(t.Data))
	}
	h, err := json.Marshal(header)
	if err != nil {
		return nil, err
	}
	// Pad the header with spaces to 8-byte alignment, as the reference writer does.
	for len(h)%8 != 0 {
		h = append(h, ' ')
	}
	out := make([]byte, 8, 8+len(h)+int(off))
	binary.LittleEndian.PutUint64(out, uint64(len(h)))
	out = append(out, h...)
	for _, n := range names {
		out = append(out, tensors[n].Data...)
	}
	return out, nil
}

// WriteFile encodes and writes atomically (temp file + rename).
func WriteFile(path string, tensors map[string]Tensor, metadata map[string]string) error {
	b, err := Encode(tensors, metadata)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// Spec names one tensor of a file WriteStream writes: its bytes come later, from a function.
type Spec struct {
	Name  string
	DType string
	Shape []int
}

// WriteStream writes a safetensors file of the tensors in specs, in that order, atomically
// (temp file + rename), asking data for each tensor's bytes in turn: a file of many gigabytes
// never sits in memory whole. Each tensor must get exactly its size's bytes.
func WriteStream(path string, specs []Spec, metadata map[string]string, data func(i int, w io.Writer) error) error {
	header := map[string]any{}
	if len(metadata) > 0 {
		header["__metadata__"] = metadata
	}
	sizes := make([]int64, len(specs))
	var off int64
	for i, s := range specs {
		size, ok := dtypeSize(s.DType)
		if !ok {
			return fmt.Errorf("%w: tensor %q: unsupported dtype %s", ErrFormat, s.Name, s.DType)
		}
		n, err := elements(s.Shape)
		if err != nil {
			return fmt.Errorf("tensor %q: %w", s.Name, err)
		}
		shape := s.Shape
		if shape == nil {
			shape = []int{}
		}
		sizes[i] = int64(n) * int64(size)
		header[s.Name] = headerEntry{DType: s.DType, Shape: shape, DataOffsets: [2]int64{off, off + sizes[i]}}
		off += sizes[i]
	}
	h, err := json.Marshal(header)
	if err != nil {
		return err
	}
	for len(h)%8 != 0 {
		h = append(h, ' ')
	}
	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	defer os.Remove(tmp) // a no-op once renamed
	w := bufio.NewWriterSize(f, 1<<20)
	var n8 [8]byte
	binary.LittleEndian.PutUint64(n8[:], uint64(len(h)))
	w.Write(n8[:])
	w.Write(h)
	for i, s := range specs {
		c := &countingWriter{w: w}
		if err := data(i, c); err != nil {
			f.Close()
			return fmt.Errorf("tensor %q: %w", s.Name, err)
		}
		if c.n != sizes[i] {
			f.Close()
			return fmt.Errorf("%w: tensor %q got %d bytes, its shape and dtype take %d", ErrFormat, s.Name, c.n, sizes[i])
		}
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}
