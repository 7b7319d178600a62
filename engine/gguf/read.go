package gguf

import (
	"encoding/binary"
	"math"
	"sort"
)

// reader walks the file's bytes; every read checks what is left first.
type reader struct {
	b   []byte
	off int
	err error
}

func (r *reader) fail(format string, args ...any) {
	if r.err == nil {
		r.err = formatErr(format, args...)
	}
}

func (r *reader) take(n int, what string) []byte {
	if r.err != nil {
		return nil
	}
	if n < 0 || n > len(r.b)-r.off {
		r.fail("%s at byte %d: %d bytes needed, %d left", what, r.off, n, len(r.b)-r.off)
		return nil
	}
	s := r.b[r.off : r.off+n]
	r.off += n
	return s
}

func (r *reader) u32(what string) uint32 {
	b := r.take(4, what)
	if b == nil {
		return 0
	}
	return binary.LittleEndian.Uint32(b)
}

func (r *reader) u64(what string) uint64 {
	b := r.take(8, what)
	if b == nil {
		return 0
	}
	return binary.LittleEndian.Uint64(b)
}

// count reads a uint64 count and bounds it by max and by the bytes left, at least minBytes per item.
func (r *reader) count(what string, max, minBytes int) int {
	n := r.u64(what)
	if r.err != nil {
		return 0
	}
	left := uint64(len(r.b) - r.off)
	if n > uint64(max) {
		r.fail("%s %d is over the limit of %d", what, n, max)
		return 0
	}
	if minBytes > 0 && n > left/uint64(minBytes) {
		r.fail("%s %d cannot fit in the %d bytes left", what, n, left)
		return 0
	}
	return int(n)
}

func (r *reader) str(what string) string {
	n := r.count(what+" length", MaxString, 1)
	b := r.take(n, what)
	if b == nil {
		return ""
	}
	return string(b) // a copy: nothing keeps the file's bytes alive through metadata
}

// value reads one value of type t (arrays one level deep, as ggml allows).
func (r *reader) value(t ValueType, key string, inArray bool) any {
	switch t {
	case TypeUint8:
		if b := r.take(1, key); b != nil {
			return b[0]
		}
	case TypeInt8:
		if b := r.take(1, key); b != nil {
			return int8(b[0])
		}
	case TypeBool:
		if b := r.take(1, key); b != nil {
			if b[0] > 1 {
				r.fail("%s: bool byte %d", key, b[0])
			}
			return b[0] == 1
		}
	case TypeUint16:
		if b := r.take(2, key); b != nil {
			return binary.LittleEndian.Uint16(b)
		}
	case TypeInt16:
		if b := r.take(2, key); b != nil {
			return int16(binary.LittleEndian.Uint16(b))
		}
	case TypeUint32:
		return r.u32(key)
	case TypeInt32:
		return int32(r.u32(key))
	case TypeFloat32:
		return math.Float32frombits(r.u32(key))
	case TypeUint64:
		return r.u64(key)
	case TypeInt64:
		return int64(r.u64(key))
	case TypeFloat64:
		return math.Float64frombits(r.u64(key))
	case TypeString:
		return r.str(key)
	case TypeArray:
		if inArray {
			r.fail("%s: nested arrays are not supported", key)
			return nil
		}
		et := ValueType(r.u32(key + " array type"))
		if r.err != nil {
			return nil
		}
		minBytes := et.size()
		if et == TypeString {
			minBytes = 8
		}
		if minBytes == 0 {
			r.fail("%s: array of type %d", key, et)
			return nil
		}
		n := r.count(key+" array length", MaxArray, minBytes)
		if r.err != nil {
			return nil
		}
		return Array{Type: et, Values: r.array(et, n, key)}
	default:
		r.fail("%s: unknown value type %d", key, t)
	}
	return nil
}

func (r *reader) array(et ValueType, n int, key string) any {
	switch et {
	case TypeString:
		out := make([]string, n)
		for i := range out {
			if out[i] = r.str(key); r.err != nil {
				return nil
			}
		}
		return out
	}
	// Fixed-size elements: count bounded by the bytes left (count above), read in one slice.
	b := r.take(n*et.size(), key)
	if b == nil {
		return nil
	}
	le := binary.LittleEndian
	switch et {
	case TypeUint8:
		return append([]uint8(nil), b...)
	case TypeInt8:
		return decodeArray(b, 1, func(e []byte) int8 { return int8(e[0]) })
	case TypeBool:
		return decodeArray(b, 1, func(e []byte) bool { return e[0] != 0 })
	case TypeUint16:
		return decodeArray(b, 2, le.Uint16)
	case TypeInt16:
		return decodeArray(b, 2, func(e []byte) int16 { return int16(le.Uint16(e)) })
	case TypeUint32:
		return decodeArray(b, 4, le.Uint32)
	case TypeInt32:
		return decodeArray(b, 4, func(e []byte) int32 { return int32(le.Uint32(e)) })
	case TypeFloat32:
		return decodeArray(b, 4, func(e []byte) float32 { return math.Float32frombits(le.Uint32(e)) })
	case TypeUint64:
		return decodeArray(b, 8, le.Uint64)
	case TypeInt64:
		return decodeArray(b, 8, func(e []byte) int64 { return int64(le.Uint64(e)) })
	case TypeFloat64:
		return decodeArray(b, 8, func(e []byte) float64 { return math.Float64frombits(le.Uint64(e)) })
	}
	return nil
}

// decodeArray decodes b as elements of size bytes each, little-endian.
func decodeArray[T any](b []byte, size int, decode func([]byte) T) []T {
	out := make([]T, len(b)/size)
	for i := range out {
		out[i] = decode(b[size*i:])
	}
	return out
}

// Parse decodes a whole GGUF file. Tensor Data slices alias b; metadata is copied. Its stages:
// the header, the metadata, the tensor infos, each tensor's bytes placed in the data section, and
// the check that no two tensors share bytes.
func Parse(b []byte) (*File, error) {
	r := &reader{b: b}
	if m := r.take(4, "magic"); m == nil || string(m) != Magic {
		return nil, formatErr("not a GGUF file (no GGUF magic)")
	}
	f := &File{Version: r.u32("version"), kv: map[string]any{}, tensors: map[string]*TensorInfo{}}
	if r.err == nil && f.Version != 2 && f.Version != 3 {
		return nil, formatErr("version %d (versions 2 and 3 are read)", f.Version)
	}
	// A tensor info takes at least 8+4+8+4+8 bytes, a KV at least 8+4+1.
	nt := r.count("tensor count", MaxTensors, 32)
	nkv := r.count("metadata count", MaxKVs, 13)
	if err := f.readMetadata(r, nkv); err != nil {
		return nil, err
	}
	if err := f.readTensorInfos(r, nt); err != nil {
		return nil, err
	}
	if err := f.placeData(b, r.off); err != nil {
		return nil, err
	}
	if err := f.checkOverlaps(); err != nil {
		return nil, err
	}
	return f, nil
}

// readMetadata reads n key-value pairs and the alignment they may set.
func (f *File) readMetadata(r *reader, n int) error {
	for range n {
		key := r.str("metadata key")
		t := ValueType(r.u32("value type of " + key))
		v := r.value(t, key, false)
		if r.err != nil {
			return r.err
		}
		if _, dup := f.kv[key]; dup {
			return formatErr("metadata key %q given twice", key)
		}
		f.kv[key] = v
		f.KVs = append(f.KVs, KV{Key: key, Value: v})
	}
	f.Alignment = DefaultAlignment
	if v, ok := f.kv["general.alignment"]; ok {
		a, isU32 := v.(uint32)
		if !isU32 || a == 0 || a&(a-1) != 0 || a > MaxAlignment {
			return formatErr("general.alignment %v is not a power of two uint32 up to %d", v, MaxAlignment)
		}
		f.Alignment = int(a)
	}
	return nil
}

// readTensorInfos reads n tensor infos: name, shape (bounded), type and offset.
func (f *File) readTensorInfos(r *reader, n int) error {
	f.Tensors = make([]TensorInfo, n)
	for i := range f.Tensors {
		t := &f.Tensors[i]
		t.Name = r.str("tensor name")
		nd := r.u32("dimension count of " + t.Name)
		if r.err != nil {
			return r.err
		}
		if nd == 0 || nd > MaxDims {
			return formatErr("tensor %q has %d dimensions (1 to %d)", t.Name, nd, MaxDims)
		}
		t.Dims = make([]int, nd)
		elems := uint64(1)
		for d := range t.Dims {
			v := r.u64("dimension of " + t.Name)
			if r.err == nil && (v == 0 || v > maxElements/elems) {
				return formatErr("tensor %q: dimension %d is zero or the shape is too large", t.Name, v)
			}
			elems *= max(v, 1)
			t.Dims[d] = int(v)
		}
		t.Type = GGMLType(r.u32("type of " + t.Name))
		t.Offset = r.u64("offset of " + t.Name)
		if r.err != nil {
			return r.err
		}
		if _, ok := typeInfo[t.Type]; !ok {
			return formatErr("tensor %q has ggml type %d, which skein does not read (F32, F16, BF16, Q4_0, Q8_0, Q4_K, Q6_K)", t.Name, uint32(t.Type))
		}
		if _, dup := f.tensors[t.Name]; dup {
			return formatErr("tensor %q given twice", t.Name)
		}
		f.tensors[t.Name] = t
	}
	return r.err
}

// placeData points each tensor's Data at its bytes in the data section, which starts at the
// first aligned offset after the infos (end): aligned, and wholly inside the file.
func (f *File) placeData(b []byte, end int) error {
	data := (end + f.Alignment - 1) / f.Alignment * f.Alignment
	if data > len(b) {
		return formatErr("tensor data starts at %d, past the file's end (%d)", data, len(b))
	}
	section := b[data:]
	for i := range f.Tensors {
		t := &f.Tensors[i]
		rowBytes, err := t.Type.RowBytes(t.Dims[0])
		if err != nil {
			return formatErr("tensor %q: %v", t.Name, err)
		}
		size := uint64(rowBytes)
		for _, d := range t.Dims[1:] {
			size *= uint64(d) // bounded: elements ≤ 2⁵⁰ and a block is at most 210 bytes for 256
		}
		if t.Offset%uint64(f.Alignment) != 0 {
			return formatErr("tensor %q: offset %d is not a multiple of the alignment %d", t.Name, t.Offset, f.Alignment)
		}
		if t.Offset > uint64(len(section)) || size > uint64(len(section))-t.Offset {
			return formatErr("tensor %q: %d bytes at offset %d run past the data section (%d bytes)", t.Name, size, t.Offset, len(section))
		}
		t.Data = section[t.Offset : t.Offset+size : t.Offset+size]
	}
	return nil
}

// checkOverlaps refuses tensors that share bytes: a range read as several weights is a malformed
// file.
func (f *File) checkOverlaps() error {
	order := make([]int, len(f.Tensors))
	for i := range order {
		order[i] = i
	}
	sort.Slice(order, func(a, b int) bool { return f.Tensors[order[a]].Offset < f.Tensors[order[b]].Offset })
	var last *TensorInfo // the tensor reaching furthest so far
	for _, i := range order {
		t := &f.Tensors[i]
		if len(t.Data) == 0 {
			continue
		}
		if last != nil {
			if end := last.Offset + uint64(len(last.Data)); end > t.Offset {
				return formatErr("tensors %q (bytes %d to %d) and %q (from %d) overlap in the data section", last.Name, last.Offset, end, t.Name, t.Offset)
			}
		}
		last = t
	}
	return nil
}
