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
		ci, err := decodeNumbers(crow, DTypeInt64)
		if err != nil {
			return t, err
		}
		co, err := decodeNumbers(col, DTypeInt64)
		if err != nil {
			return t, err
		}
		t.SparseCrowIndices, t.SparseColIndices = toInts(ci), toInts(co)
		return t.Dense()
	}
	if !haveDense && len(t.Shape) == 0 {
		return t, nil
	}
	t.Data, err = decodeNumbers(dense, dtype)
	return t, err
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

// EncodeForwardBackwardRequest writes the protobuf form (used by the Go client and tests).
func EncodeForwardBackwardRequest(r *ForwardBackwardRequest) []byte {
	var b []byte
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	b = protowire.AppendString(b, r.ModelID)
	if r.SeqID != nil {
		b = protowire.AppendTag(b, 2, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(int64(*r.SeqID)))
	}
	for _, d := range r.Input.Data {
		var db []byte
		for _, c := range d.ModelInput.Chunks {
			var tok []byte
			for _, t := range c.Tokens {
				tok = binary.LittleEndian.AppendUint32(tok, uint32(int32(t)))
			}
			var et []byte
			et = protowire.AppendTag(et, 1, protowire.BytesType)
			et = protowire.AppendBytes(et, tok)
			var cb []byte
			cb = protowire.AppendTag(cb, 1, protowire.BytesType)
			cb = protowire.AppendBytes(cb, et)
			db = protowire.AppendTag(db, 1, protowire.BytesType)
			db = protowire.AppendBytes(db, cb)
		}
		for _, k := range sortedKeys(d.LossFnInputs) {
			t := d.LossFnInputs[k]
			var tb []byte
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
			tb = protowire.AppendTag(tb, 1, protowire.BytesType)
			tb = protowire.AppendBytes(tb, data)
			tb = protowire.AppendTag(tb, 3, protowire.VarintType)
			tb = protowire.AppendVarint(tb, dt)
			shape := t.Shape
			if shape == nil {
				shape = []int{len(t.Data)}
			}
			var sb []byte
			for _, s := range shape {
				sb = protowire.AppendVarint(sb, uint64(int64(s)))
			}
			tb = protowire.AppendTag(tb, 4, protowire.BytesType)
			tb = protowire.AppendBytes(tb, sb)
			var eb []byte
			eb = protowire.AppendTag(eb, 1, protowire.BytesType)
			eb = protowire.AppendString(eb, k)
			eb = protowire.AppendTag(eb, 2, protowire.BytesType)
			eb = protowire.AppendBytes(eb, tb)
			db = protowire.AppendTag(db, 2, protowire.BytesType)
			db = protowire.AppendBytes(db, eb)
		}
		b = protowire.AppendTag(b, 3, protowire.BytesType)
		b = protowire.AppendBytes(b, db)
	}
	b = protowire.AppendTag(b, 4, protowire.BytesType)
	b = protowire.AppendString(b, r.Input.LossFn)
	for _, k := range sortedKeys(r.Input.LossFnConfig) {
		var eb []byte
		eb = protowire.AppendTag(eb, 1, protowire.BytesType)
		eb = protowire.AppendString(eb, k)
		eb = protowire.AppendTag(eb, 2, protowire.Fixed64Type)
		eb = protowire.AppendFixed64(eb, math.Float64bits(r.Input.LossFnConfig[k]))
		b = protowire.AppendTag(b, 5, protowire.BytesType)
		b = protowire.AppendBytes(b, eb)
	}
	if r.ForwardOnly {
		b = protowire.AppendTag(b, 6, protowire.VarintType)
		b = protowire.AppendVarint(b, 1)
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
	var b []byte
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	b = protowire.AppendString(b, o.LossFnOutputType)
	if len(o.LossFnOutputs) > 0 {
		var rec []byte
		rec = protowire.AppendTag(rec, 1, protowire.BytesType)
		rec = protowire.AppendString(rec, o.LossFnOutputType)
		for _, name := range sortedKeys(o.LossFnOutputs[0]) {
			var data, offsets []byte
			offsets = binary.LittleEndian.AppendUint64(offsets, 0)
			for _, d := range o.LossFnOutputs {
				for _, v := range d[name].Data {
					data = binary.LittleEndian.AppendUint32(data, math.Float32bits(float32(v)))
				}
				offsets = binary.LittleEndian.AppendUint64(offsets, uint64(len(data)))
			}
			var bt []byte
			bt = protowire.AppendTag(bt, 1, protowire.BytesType)
			bt = protowire.AppendBytes(bt, data)
			bt = protowire.AppendTag(bt, 2, protowire.BytesType)
			bt = protowire.AppendBytes(bt, offsets)
			bt = protowire.AppendTag(bt, 3, protowire.VarintType)
			bt = protowire.AppendVarint(bt, DTypeFloat32)
			var eb []byte
			eb = protowire.AppendTag(eb, 1, protowire.BytesType)
			eb = protowire.AppendString(eb, name)
			eb = protowire.AppendTag(eb, 2, protowire.BytesType)
			eb = protowire.AppendBytes(eb, bt)
			rec = protowire.AppendTag(rec, 2, protowire.BytesType)
			rec = protowire.AppendBytes(rec, eb)
		}
		rec = protowire.AppendTag(rec, 3, protowire.VarintType)
		rec = protowire.AppendVarint(rec, uint64(len(o.LossFnOutputs)))
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendBytes(b, rec)
	}
	for _, k := range sortedKeys(o.Metrics) {
		var eb []byte
		eb = protowire.AppendTag(eb, 1, protowire.BytesType)
		eb = protowire.AppendString(eb, k)
		eb = protowire.AppendTag(eb, 2, protowire.Fixed64Type)
		eb = protowire.AppendFixed64(eb, math.Float64bits(o.Metrics[k]))
		b = protowire.AppendTag(b, 3, protowire.BytesType)
		b = protowire.AppendBytes(b, eb)
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
			if err := eachField(val, func(n protowire.Number, _ protowire.Type, _ []byte, x uint64) error {
				if n == 2 {
					v = math.Float64frombits(x)
				}
				return nil
			}); err != nil {
				return err
			}
			_ = eachField(val, func(n protowire.Number, _ protowire.Type, kv []byte, _ uint64) error {
				if n == 1 {
					key = string(kv)
				}
				return nil
			})
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
		var sb []byte
		reason := uint64(StopReasonStop)
		if s.StopReason == "length" {
			reason = StopReasonLength
		}
		sb = protowire.AppendTag(sb, 1, protowire.VarintType)
		sb = protowire.AppendVarint(sb, reason)
		var tok, lp []byte
		for _, t := range s.Tokens {
			tok = binary.LittleEndian.AppendUint32(tok, uint32(int32(t)))
		}
		for _, v := range s.Logprobs {
			lp = binary.LittleEndian.AppendUint32(lp, math.Float32bits(float32(v)))
		}
		sb = protowire.AppendTag(sb, 2, protowire.BytesType)
		sb = protowire.AppendBytes(sb, tok)
		sb = protowire.AppendTag(sb, 3, protowire.BytesType)
		sb = protowire.AppendBytes(sb, lp)
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendBytes(b, sb)
	}
	if r.PromptLogprobs != nil {
		var pb []byte
		for _, v := range r.PromptLogprobs {
			f := float32(math.NaN())
			if v != nil {
				f = float32(*v)
			}
			pb = binary.LittleEndian.AppendUint32(pb, math.Float32bits(f))
		}
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendBytes(b, pb)
	}
	if len(r.TopKPromptLogprobs) > 0 {
		k := 0
		for _, row := range r.TopKPromptLogprobs {
			k = max(k, len(row))
		}
		var ids, lps []byte
		for _, row := range r.TopKPromptLogprobs {
			for j := range k {
				tok, lp := int32(0), float32(-99999.0)
				if j < len(row) {
					tok, lp = int32(row[j][0]), float32(row[j][1])
				}
				ids = binary.LittleEndian.AppendUint32(ids, uint32(tok))
				lps = binary.LittleEndian.AppendUint32(lps, math.Float32bits(lp))
			}
		}
		var tb []byte
		tb = protowire.AppendTag(tb, 1, protowire.BytesType)
		tb = protowire.AppendBytes(tb, ids)
		tb = protowire.AppendTag(tb, 2, protowire.BytesType)
		tb = protowire.AppendBytes(tb, lps)
		tb = protowire.AppendTag(tb, 3, protowire.VarintType)
		tb = protowire.AppendVarint(tb, uint64(k))
		tb = protowire.AppendTag(tb, 4, protowire.VarintType)
		tb = protowire.AppendVarint(tb, uint64(len(r.TopKPromptLogprobs)))
		b = protowire.AppendTag(b, 3, protowire.BytesType)
		b = protowire.AppendBytes(b, tb)
	}
	b = protowire.AppendTag(b, 4, protowire.VarintType)
	b = protowire.AppendVarint(b, uint64(r.PromptCacheHitTokens))
	return b
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
