package api

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sort"

	"google.golang.org/protobuf/encoding/protowire"
)

// Proto enums of tinker_public.proto.
const (
	DTypeFloat32  = 1
	DTypeInt64    = 2
	DTypeInt32    = 3
	DTypeBFloat16 = 4

	StopReasonStop   = 0
	StopReasonLength = 1
)

// ErrProto is returned for a malformed protobuf body.
var ErrProto = errors.New("malformed protobuf")

func protoErr(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrProto, fmt.Sprintf(format, args...))
}

// field iterates the top-level fields of a message.
func eachField(b []byte, fn func(num protowire.Number, typ protowire.Type, val []byte, v uint64) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protoErr("bad tag")
		}
		b = b[n:]
		var val []byte
		var v uint64
		switch typ {
		case protowire.VarintType:
			v, n = protowire.ConsumeVarint(b)
		case protowire.Fixed64Type:
			v, n = protowire.ConsumeFixed64(b)
		case protowire.Fixed32Type:
			var x uint32
			x, n = protowire.ConsumeFixed32(b)
			v = uint64(x)
		case protowire.BytesType:
			val, n = protowire.ConsumeBytes(b)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return protoErr("bad value for field %d", num)
		}
		b = b[n:]
		if err := fn(num, typ, val, v); err != nil {
			return err
		}
	}
	return nil
}

func want(typ, w protowire.Type, field string) error {
	if typ != w {
		return protoErr("field %s has wire type %d, want %d", field, typ, w)
	}
	return nil
}

// DecodeForwardBackwardRequest parses a tinker_public.ForwardBackwardRequest.
// ForwardBackwardModelID reads only the model_id of a protobuf forward_backward request, without
// decoding its data ("" if it has none or is malformed): a gateway routes a request to the one
// sequencing its run before it decodes it (issue 38).
func ForwardBackwardModelID(b []byte) string {
	var id string
	_ = eachField(b, func(num protowire.Number, typ protowire.Type, val []byte, _ uint64) error {
		if num == 1 && typ == protowire.BytesType {
			id = string(val)
			return errFound
		}
		return nil
	})
	return id
}

// errFound stops a scan of fields that found what it looked for.
var errFound = errors.New("found")

func DecodeForwardBackwardRequest(b []byte) (*ForwardBackwardRequest, error) {
	r := &ForwardBackwardRequest{Input: ForwardBackwardInput{LossFnConfig: map[string]float64{}}}
	err := eachField(b, func(num protowire.Number, typ protowire.Type, val []byte, v uint64) error {
		switch num {
		case 1:
			if err := want(typ, protowire.BytesType, "model_id"); err != nil {
				return err
			}
			r.ModelID = string(val)
		case 2:
			if err := want(typ, protowire.VarintType, "seq_id"); err != nil {
				return err
			}
			s := int(int32(v))
			r.SeqID = &s
		case 3:
			if err := want(typ, protowire.BytesType, "data"); err != nil {
				return err
			}
			d, err := decodeDatum(val, len(r.Input.Data))
			if err != nil {
				return err
			}
			r.Input.Data = append(r.Input.Data, d)
		case 4:
			if err := want(typ, protowire.BytesType, "loss_fn"); err != nil {
				return err
			}
			r.Input.LossFn = string(val)
		case 5:
			if err := want(typ, protowire.BytesType, "loss_fn_config"); err != nil {
				return err
			}
			var key string
			var value float64
			if err := eachField(val, func(n protowire.Number, t protowire.Type, kv []byte, x uint64) error {
				switch n {
				case 1:
					key = string(kv)
				case 2:
					if t != protowire.Fixed64Type {
						return protoErr("loss_fn_config value is not a double")
					}
					value = math.Float64frombits(x)
				}
				return nil
			}); err != nil {
				return err
			}
			r.Input.LossFnConfig[key] = value
		case 6:
			if err := want(typ, protowire.VarintType, "forward_only"); err != nil {
				return err
			}
			r.ForwardOnly = v != 0
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if err := DensifyAll(r.Input.Data); err != nil {
		return nil, err
	}
	return r, nil
}

func decodeDatum(b []byte, idx int) (Datum, error) {
	d := Datum{LossFnInputs: map[string]TensorData{}}
	err := eachField(b, func(num protowire.Number, typ protowire.Type, val []byte, _ uint64) error {
		if typ != protowire.BytesType {
			return protoErr("datum %d: field %d has wrong wire type", idx, num)
		}
		switch num {
		case 1:
			c, err := decodeChunk(val, idx)
			if err != nil {
				return err
			}
			d.ModelInput.Chunks = append(d.ModelInput.Chunks, c)
		case 2:
			var key string
			var t TensorData
			var haveValue bool
			if err := eachField(val, func(n protowire.Number, tt protowire.Type, kv []byte, _ uint64) error {
				if tt != protowire.BytesType {
					return protoErr("datum %d: loss_fn_inputs entry has wrong wire type", idx)
				}
				switch n {
				case 1:
					key = string(kv)
				case 2:
					var err error
					t, err = decodeTensor(kv)
					haveValue = err == nil
					return err
				}
				return nil
			}); err != nil {
				return fmt.Errorf("datum %d: loss_fn_inputs[%q]: %w", idx, key, err)
			}
			if !haveValue {
				return protoErr("datum %d: loss_fn_inputs[%q] has no tensor", idx, key)
			}
			d.LossFnInputs[key] = t
		}
		return nil
	})
	return d, err
}

func decodeChunk(b []byte, idx int) (Chunk, error) {
	var c Chunk
	err := eachField(b, func(num protowire.Number, typ protowire.Type, val []byte, _ uint64) error {
		switch num {
		case 1:
			c.Type = "encoded_text"
			return eachField(val, func(n protowire.Number, t protowire.Type, tv []byte, _ uint64) error {
				if n != 1 {
					return nil
				}
				if t != protowire.BytesType || len(tv)%4 != 0 {
					return protoErr("datum %d: tokens must be int32 bytes", idx)
				}
				for i := 0; i < len(tv); i += 4 {
					c.Tokens = append(c.Tokens, int(int32(binary.LittleEndian.Uint32(tv[i:]))))
				}
				return nil
			})
		case 2:
			c.Type = "image"
			if typ != protowire.BytesType {
				return protoErr("datum %d: image chunk has wrong wire type", idx)
			}
			return decodeImageChunk(val, idx, &c)
		case 3:
			c.Type = "dmel"
		}
		return nil
	})
	return c, err
}

func decodeTensor(b []byte) (TensorData, error) {
	var t TensorData
	var dtype uint64
	var dense []byte
	var sparse []byte
	haveDense := false
	err := eachField(b, func(num protowire.Number, typ protowire.Type, val []byte, v uint64) error {
		switch num {
		case 1:
			dense, haveDense = val, true
		case 2:
			sparse = val
		case 3:
			dtype = v
		case 4:
			if typ == protowire.BytesType { // packed
				for len(val) > 0 {
					x, n := protowire.ConsumeVarint(val)
					if n < 0 {
						return protoErr("bad shape")
					}
					t.Shape = append(t.Shape, int(int64(x)))
					val = val[n:]
				}
			} else {
				t.Shape = append(t.Shape, int(int64(v)))
			}
		}
		return nil
	})
	if err != nil {
		return t, err
	}
	switch dtype {
	case DTypeFloat32, DTypeBFloat16:
		t.DType = "float32"
	case DTypeInt64, DTypeInt32:
		t.DType = "int64"
	default:
		return t, protoErr("unsupported tensor dtype %d", dtype)
	}
	if sparse != nil {
		var vals, crow, col []byte
		if err := eachField(sparse, func(n protowire.Number, _ protowire.Type, val []byte, _ uint64) error {
			switch n {
			case 1:
				vals = val
			case 2:
				crow = val
			case 3:
				col = val
			}
			return nil
		}); err != nil {
			return t, err
		}
		if t.Data, err = decodeNumbers(vals, dtype); err != nil {
			return t, err
		}
		if t.SparseCrowIndices, err = decodeIndices(crow); err != nil {
			return t, err
		}
		if t.SparseColIndices, err = decodeIndices(col); err != nil {
			return t, err
		}
		return t, nil // expanded by DensifyAll, within the request's budget
	}
	if !haveDense && len(t.Shape) == 0 {
		return t, nil
	}
	t.Data, err = decodeNumbers(dense, dtype)
	return t, err
}

// decodeIndices reads int64 indices exactly (through float64, values past 2^53 would round) and
// always returns a non-nil slice, so an empty index list still marks a tensor as sparse.
func decodeIndices(b []byte) ([]int, error) {
	if len(b)%8 != 0 {
		return nil, protoErr("sparse indices of %d bytes are not a whole number of int64s", len(b))
	}
	out := make([]int, len(b)/8)
	for i := range out {
		x := int64(binary.LittleEndian.Uint64(b[8*i:]))
		if int64(int(x)) != x {
			return nil, badTensor("sparse index %d does not fit an int", x)
		}
		out[i] = int(x)
	}
	return out, nil
}

func toInts(v []float64) []int {
	out := make([]int, len(v))
	for i, x := range v {
		out[i] = int(x)
	}
	return out
}

func decodeNumbers(b []byte, dtype uint64) ([]float64, error) {
	size := map[uint64]int{DTypeFloat32: 4, DTypeInt64: 8, DTypeInt32: 4, DTypeBFloat16: 2}[dtype]
	if size == 0 || len(b)%size != 0 {
		return nil, protoErr("tensor data of %d bytes is not a whole number of dtype-%d elements", len(b), dtype)
	}
	out := make([]float64, len(b)/size)
	for i := range out {
		switch dtype {
		case DTypeFloat32:
			out[i] = float64(math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])))
		case DTypeInt64:
			out[i] = float64(int64(binary.LittleEndian.Uint64(b[8*i:])))
		case DTypeInt32:
			out[i] = float64(int32(binary.LittleEndian.Uint32(b[4*i:])))
		case DTypeBFloat16:
			out[i] = float64(math.Float32frombits(uint32(binary.LittleEndian.Uint16(b[2*i:])) << 16))
		}
	}
	return out, nil
}

// Field writers: tag plus value.
func appendBytesField(b []byte, num protowire.Number, v []byte) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendBytes(b, v)
}

func appendStringField(b []byte, num protowire.Number, v string) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendString(b, v)
}

func appendVarintField(b []byte, num protowire.Number, v uint64) []byte {
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, v)
}

// appendMapEntry writes one entry of a map<string, message> field.
func appendMapEntry(b []byte, num protowire.Number, key string, value []byte) []byte {
	return appendBytesField(b, num, appendBytesField(appendStringField(nil, 1, key), 2, value))
}

// appendDoubleMapEntry writes one entry of a map<string, double> field.
func appendDoubleMapEntry(b []byte, num protowire.Number, key string, value float64) []byte {
	e := appendStringField(nil, 1, key)
	e = protowire.AppendTag(e, 2, protowire.Fixed64Type)
	e = protowire.AppendFixed64(e, math.Float64bits(value))
	return appendBytesField(b, num, e)
}

// EncodeForwardBackwardRequest writes the protobuf form (used by the Go client and tests).
func EncodeForwardBackwardRequest(r *ForwardBackwardRequest) []byte {
	b := appendStringField(nil, 1, r.ModelID)
	if r.SeqID != nil {
		b = appendVarintField(b, 2, uint64(int64(*r.SeqID)))
	}
	for _, d := range r.Input.Data {
		var db []byte
		for _, c := range d.ModelInput.Chunks {
			if c.Type == "image" {
				db = appendBytesField(db, 1, appendImageChunk(c))
				continue
			}
			var tok []byte
			for _, t := range c.Tokens {
				tok = binary.LittleEndian.AppendUint32(tok, uint32(int32(t)))
			}
			encodedText := appendBytesField(nil, 1, tok)
			db = appendBytesField(db, 1, appendBytesField(nil, 1, encodedText))
		}
		for _, k := range sortedKeys(d.LossFnInputs) {
			t := d.LossFnInputs[k]
			var data []byte
			dt := uint64(DTypeFloat32)
			if t.DType == "int64" {
				dt = DTypeInt64
				for _, v := range t.Data {
					data = binary.LittleEndian.AppendUint64(data, uint64(int64(v)))
				}
			} else {
				for _, v := range t.Data {
					data = binary.LittleEndian.AppendUint32(data, math.Float32bits(float32(v)))
				}
			}
			shape := t.Shape
			if shape == nil {
				shape = []int{len(t.Data)}
			}
			var packed []byte
			for _, s := range shape {
				packed = protowire.AppendVarint(packed, uint64(int64(s)))
			}
			tb := appendBytesField(nil, 1, data)
			tb = appendVarintField(tb, 3, dt)
			tb = appendBytesField(tb, 4, packed)
			db = appendMapEntry(db, 2, k, tb)
		}
		b = appendBytesField(b, 3, db)
	}
	b = appendStringField(b, 4, r.Input.LossFn)
	for _, k := range sortedKeys(r.Input.LossFnConfig) {
		b = appendDoubleMapEntry(b, 5, k, r.Input.LossFnConfig[k])
	}
	if r.ForwardOnly {
		b = appendVarintField(b, 6, 1)
	}
	return b
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// EncodeForwardBackwardOutput writes one ArrayRecord holding every datum's outputs.
func EncodeForwardBackwardOutput(o *ForwardBackwardOutput) []byte {
	b := appendStringField(nil, 1, o.LossFnOutputType)
	if len(o.LossFnOutputs) > 0 {
		rec := appendStringField(nil, 1, o.LossFnOutputType)
		for _, name := range sortedKeys(o.LossFnOutputs[0]) {
			var data, offsets []byte
			offsets = binary.LittleEndian.AppendUint64(offsets, 0)
			for _, d := range o.LossFnOutputs {
				for _, v := range d[name].Data {
					data = binary.LittleEndian.AppendUint32(data, math.Float32bits(float32(v)))
				}
				offsets = binary.LittleEndian.AppendUint64(offsets, uint64(len(data)))
			}
			bt := appendBytesField(nil, 1, data)
			bt = appendBytesField(bt, 2, offsets)
			bt = appendVarintField(bt, 3, DTypeFloat32)
			rec = appendMapEntry(rec, 2, name, bt)
		}
		rec = appendVarintField(rec, 3, uint64(len(o.LossFnOutputs)))
		b = appendBytesField(b, 2, rec)
	}
	for _, k := range sortedKeys(o.Metrics) {
		b = appendDoubleMapEntry(b, 3, k, o.Metrics[k])
	}
	return b
}

// DecodeForwardBackwardOutput parses the protobuf result (Go client side).
func DecodeForwardBackwardOutput(b []byte) (*ForwardBackwardOutput, error) {
	o := &ForwardBackwardOutput{Metrics: map[string]float64{}}
	err := eachField(b, func(num protowire.Number, typ protowire.Type, val []byte, _ uint64) error {
		switch num {
		case 1:
			o.LossFnOutputType = string(val)
		case 2:
			var n int
			fields := map[string][][]float64{}
			if err := eachField(val, func(rn protowire.Number, _ protowire.Type, rv []byte, x uint64) error {
				switch rn {
				case 2:
					var key string
					var data, offs []byte
					if err := eachField(rv, func(en protowire.Number, _ protowire.Type, ev []byte, _ uint64) error {
						switch en {
						case 1:
							key = string(ev)
						case 2:
							return eachField(ev, func(bn protowire.Number, _ protowire.Type, bv []byte, _ uint64) error {
								switch bn {
								case 1:
									data = bv
								case 2:
									offs = bv
								}
								return nil
							})
						}
						return nil
					}); err != nil {
						return err
					}
					vals, err := decodeNumbers(data, DTypeFloat32)
					if err != nil {
						return err
					}
					o, err := decodeNumbers(offs, DTypeInt64)
					if err != nil {
						return err
					}
					for i := 0; i+1 < len(o); i++ {
						lo, hi := int(o[i])/4, int(o[i+1])/4
						if lo < 0 || hi < lo || hi > len(vals) {
							return protoErr("bad offsets")
						}
						fields[key] = append(fields[key], vals[lo:hi])
					}
				case 3:
					n = int(x)
				}
				return nil
			}); err != nil {
				return err
			}
			// The record count sizes the answer: it must be what the fields carry.
			maxRecords := 1 << 16 // records with no fields at all
			if len(fields) > 0 {
				maxRecords = 0
				for _, per := range fields {
					maxRecords = max(maxRecords, len(per))
				}
			}
			if n < 0 || n > maxRecords {
				return protoErr("%d records, but the fields carry %d", n, maxRecords)
			}
			for i := range n {
				rec := LossOutput{}
				for k, per := range fields {
					if i < len(per) {
						rec[k] = TensorData{Data: per[i], DType: "float32", Shape: []int{len(per[i])}}
					}
				}
				o.LossFnOutputs = append(o.LossFnOutputs, rec)
			}
		case 3:
			var key string
			var v float64
			if err := eachField(val, func(n protowire.Number, _ protowire.Type, kv []byte, x uint64) error {
				switch n {
				case 1:
					key = string(kv)
				case 2:
					v = math.Float64frombits(x)
				}
				return nil
			}); err != nil {
				return err
			}
			o.Metrics[key] = v
		}
		return nil
	})
	return o, err
}

// EncodeSampleResponse writes tinker_public.SampleResponse.
func EncodeSampleResponse(r *SampleResponse) []byte {
	var b []byte
	for _, s := range r.Sequences {
		reason := uint64(StopReasonStop)
		if s.StopReason == "length" {
			reason = StopReasonLength
		}
		var tok, lp []byte
		for _, t := range s.Tokens {
			tok = binary.LittleEndian.AppendUint32(tok, uint32(int32(t)))
		}
		for _, v := range s.Logprobs {
			lp = binary.LittleEndian.AppendUint32(lp, math.Float32bits(float32(v)))
		}
		sb := appendVarintField(nil, 1, reason)
		sb = appendBytesField(sb, 2, tok)
		sb = appendBytesField(sb, 3, lp)
		b = appendBytesField(b, 1, sb)
	}
	if r.PromptLogprobs != nil {
		var pb []byte
		for _, v := range r.PromptLogprobs {
			f := float32(math.NaN()) // the wire's "no value"
			if v != nil {
				f = float32(*v)
			}
			pb = binary.LittleEndian.AppendUint32(pb, math.Float32bits(f))
		}
		b = appendBytesField(b, 2, pb)
	}
	if len(r.TopKPromptLogprobs) > 0 {
		k := 0
		for _, row := range r.TopKPromptLogprobs {
			k = max(k, len(row))
		}
		var ids, lps []byte
		for _, row := range r.TopKPromptLogprobs {
			for j := range k {
				tok, lp := int32(0), float32(-99999.0) // empty cells, as the SDK expects
				if j < len(row) {
					tok, lp = int32(row[j][0]), float32(row[j][1])
				}
				ids = binary.LittleEndian.AppendUint32(ids, uint32(tok))
				lps = binary.LittleEndian.AppendUint32(lps, math.Float32bits(lp))
			}
		}
		tb := appendBytesField(nil, 1, ids)
		tb = appendBytesField(tb, 2, lps)
		tb = appendVarintField(tb, 3, uint64(k))
		tb = appendVarintField(tb, 4, uint64(len(r.TopKPromptLogprobs)))
		b = appendBytesField(b, 3, tb)
	}
	return appendVarintField(b, 4, uint64(r.PromptCacheHitTokens))
}

// DecodeSampleResponse parses a protobuf SampleResponse (Go client side).
func DecodeSampleResponse(b []byte) (*SampleResponse, error) {
	r := &SampleResponse{Type: "sample"}
	err := eachField(b, func(num protowire.Number, _ protowire.Type, val []byte, v uint64) error {
		switch num {
		case 1:
			var s SampledSequence
			s.StopReason = "stop"
			if err := eachField(val, func(n protowire.Number, _ protowire.Type, sv []byte, x uint64) error {
				switch n {
				case 1:
					if x == StopReasonLength {
						s.StopReason = "length"
					}
				case 2:
					t, err := decodeNumbers(sv, DTypeInt32)
					if err != nil {
						return err
					}
					s.Tokens = toInts(t)
				case 3:
					lp, err := decodeNumbers(sv, DTypeFloat32)
					if err != nil {
						return err
					}
					s.Logprobs = lp
				}
				return nil
			}); err != nil {
				return err
			}
			r.Sequences = append(r.Sequences, s)
		case 2:
			lp, err := decodeNumbers(val, DTypeFloat32)
			if err != nil {
				return err
			}
			for _, x := range lp {
				if math.IsNaN(x) {
					r.PromptLogprobs = append(r.PromptLogprobs, nil)
				} else {
					x := x
					r.PromptLogprobs = append(r.PromptLogprobs, &x)
				}
			}
		case 4:
			r.PromptCacheHitTokens = int(v)
		}
		return nil
	})
	return r, err
}
