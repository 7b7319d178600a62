package api

import (
	"encoding/binary"
	"errors"
	"math"
	"reflect"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
)

func sampleRequest() *ForwardBackwardRequest {
	seq := 3
	return &ForwardBackwardRequest{ModelID: "s:train:0", SeqID: &seq, ForwardOnly: true,
		Input: ForwardBackwardInput{LossFn: "ppo", LossFnConfig: map[string]float64{"clip_low_threshold": 0.7},
			Data: []Datum{{ModelInput: ModelInput{Chunks: []Chunk{{Type: "encoded_text", Tokens: []int{1, 2, 3}}}},
				LossFnInputs: map[string]TensorData{
					"target_tokens": {Data: []float64{2, 3, 4}, DType: "int64", Shape: []int{3}},
					"advantages":    {Data: []float64{0.5, -1, 2}, DType: "float32", Shape: []int{3}},
				}}}}}
}

func TestForwardBackwardRequestRoundTrip(t *testing.T) {
	r := sampleRequest()
	got, err := DecodeForwardBackwardRequest(EncodeForwardBackwardRequest(r))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, r) {
		t.Fatalf("round trip:\n got  %+v\n want %+v", got, r)
	}
}

func TestForwardBackwardOutputRoundTrip(t *testing.T) {
	o := &ForwardBackwardOutput{LossFnOutputType: "ArrayRecord", Metrics: map[string]float64{"loss:sum": 1.5},
		LossFnOutputs: []LossOutput{
			{"logprobs": {Data: []float64{-1, -2}, DType: "float32", Shape: []int{2}}},
			{"logprobs": {Data: []float64{-0.5}, DType: "float32", Shape: []int{1}}},
		}}
	got, err := DecodeForwardBackwardOutput(EncodeForwardBackwardOutput(o))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, o) {
		t.Fatalf("round trip:\n got  %+v\n want %+v", got, o)
	}
}

// Arbitrary bytes never panic the decoder; whatever decodes re-encodes to the same request.
func FuzzDecodeForwardBackwardRequest(f *testing.F) {
	f.Add(EncodeForwardBackwardRequest(sampleRequest()))
	f.Add(EncodeForwardBackwardRequest(imageRequest()))
	f.Add([]byte{})
	f.Add([]byte{0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Add([]byte{0x1a, 0x04, 0x12, 0x02, 0x0a, 0x00})
	for _, c := range overflowingSparse {
		f.Add(sparseRequest(c.shape, c.crow, c.col, c.vals))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := DecodeForwardBackwardRequest(b)
		if err != nil {
			return
		}
		again, err := DecodeForwardBackwardRequest(EncodeForwardBackwardRequest(r))
		if err != nil {
			t.Fatalf("re-encoded request does not decode: %v", err)
		}
		if again.ModelID != r.ModelID || len(again.Input.Data) != len(r.Input.Data) || again.Input.LossFn != r.Input.LossFn {
			t.Fatalf("re-encoding changed the request: %+v vs %+v", again, r)
		}
	})
}

// sparseRequest is a ForwardBackwardRequest whose datum carries one sparse CSR tensor, as the
// SDK would send it, with any shape and indices.
func sparseRequest(shape []int64, crow, col []int64, vals []float32) []byte {
	le64 := func(v []int64) []byte {
		var b []byte
		for _, x := range v {
			b = binary.LittleEndian.AppendUint64(b, uint64(x))
		}
		return b
	}
	var vb []byte
	for _, v := range vals {
		vb = binary.LittleEndian.AppendUint32(vb, math.Float32bits(v))
	}
	sp := appendBytesField(nil, 1, vb)
	sp = appendBytesField(sp, 2, le64(crow))
	sp = appendBytesField(sp, 3, le64(col))
	var packed []byte
	for _, s := range shape {
		packed = protowire.AppendVarint(packed, uint64(s))
	}
	tensor := appendBytesField(nil, 2, sp)
	tensor = appendVarintField(tensor, 3, DTypeFloat32)
	tensor = appendBytesField(tensor, 4, packed)
	tokens := binary.LittleEndian.AppendUint32(nil, 1)
	datum := appendBytesField(nil, 1, appendBytesField(nil, 1, appendBytesField(nil, 1, tokens)))
	datum = appendMapEntry(datum, 2, "weights", tensor)
	b := appendStringField(nil, 1, "m")
	b = appendBytesField(b, 3, datum)
	return appendStringField(b, 4, "cross_entropy")
}

// overflowingSparse are sparse tensors whose shape, indices or offsets do not fit: products
// that wrap around int64, negative and huge dimensions, and indices past int64's float range.
var overflowingSparse = []struct {
	name      string
	shape     []int64
	crow, col []int64
	vals      []float32
}{
	{"rows×cols wraps negative", []int64{3, 1 << 62}, []int64{0, 1, 1, 1}, []int64{5}, []float32{1}},
	{"rows×cols wraps to zero", []int64{4, 1 << 62}, []int64{0, 0, 0, 0, 1}, []int64{0}, []float32{1}},
	{"too many elements", []int64{2, 1 << 30}, []int64{0, 0, 1}, []int64{1 << 29}, []float32{1}},
	{"negative rows", []int64{-1, 4}, []int64{0}, nil, nil},
	{"rows+1 wraps", []int64{math.MaxInt64, 1}, []int64{0}, nil, nil},
	{"huge column", []int64{1, 4}, []int64{0, 1}, []int64{math.MaxInt64}, []float32{1}},
	{"huge offset", []int64{1, 4}, []int64{0, math.MaxInt64}, []int64{0}, []float32{1}},
	{"negative offset", []int64{1, 4}, []int64{math.MinInt64, 1}, []int64{0}, []float32{1}},
}

// Every overflowing sparse tensor is a typed decoding error, never a panic or an allocation.
func TestSparseOverflowIsAnError(t *testing.T) {
	for _, c := range overflowingSparse {
		var err error
		func() {
			defer func() {
				if v := recover(); v != nil {
					t.Fatalf("%s: panic %v", c.name, v)
				}
			}()
			_, err = DecodeForwardBackwardRequest(sparseRequest(c.shape, c.crow, c.col, c.vals))
		}()
		if !errors.Is(err, ErrBadTensor) {
			t.Fatalf("%s: want ErrBadTensor, got %v", c.name, err)
		}
		// The JSON path: the same tensor as TensorData.
		td := TensorData{Data: make([]float64, len(c.vals)), DType: "float32", SparseCrowIndices: toInt(c.crow), SparseColIndices: toInt(c.col)}
		for _, s := range c.shape {
			td.Shape = append(td.Shape, int(s))
		}
		if td.SparseColIndices == nil {
			td.SparseColIndices = []int{}
		}
		func() {
			defer func() {
				if v := recover(); v != nil {
					t.Fatalf("%s (JSON): panic %v", c.name, v)
				}
			}()
			_, err = td.Dense()
		}()
		if !errors.Is(err, ErrBadTensor) {
			t.Fatalf("%s (JSON): want ErrBadTensor, got %v", c.name, err)
		}
	}
	// A good sparse tensor still expands.
	r, err := DecodeForwardBackwardRequest(sparseRequest([]int64{1, 4}, []int64{0, 2}, []int64{1, 3}, []float32{0.5, 2}))
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Input.Data[0].LossFnInputs["weights"].Data; !reflect.DeepEqual(got, []float64{0, 0.5, 0, 2}) {
		t.Fatalf("dense %v", got)
	}
}

// Many small sparse tensors cannot expand past the request's budget together.
func TestSparseExpansionHasARequestBudget(t *testing.T) {
	per := MaxTensorElements
	n := MaxRequestElements/per + 1
	batch := func(n int) []Datum {
		data := make([]Datum, n)
		for i := range data {
			data[i].LossFnInputs = map[string]TensorData{"weights": {DType: "float32", Shape: []int{1, per},
				Data: []float64{1}, SparseCrowIndices: []int{0, 1}, SparseColIndices: []int{0}}}
		}
		return data
	}
	if err := DensifyAll(batch(n - 1)); err != nil {
		t.Fatalf("within the budget: %v", err)
	}
	if err := DensifyAll(batch(n)); !errors.Is(err, ErrBadTensor) {
		t.Fatalf("past the budget: want ErrBadTensor, got %v", err)
	}
}

func toInt(v []int64) []int {
	if v == nil {
		return nil
	}
	out := make([]int, len(v))
	for i, x := range v {
		out[i] = int(x)
	}
	return out
}

// A result claiming more records than it carries is an error, not a loop that allocates them.
func TestForwardBackwardOutputRecordCountIsChecked(t *testing.T) {
	rec := appendStringField(nil, 1, "ArrayRecord")
	rec = appendVarintField(rec, 3, 1<<20)
	b := appendStringField(nil, 1, "ArrayRecord")
	b = appendBytesField(b, 2, rec)
	if _, err := DecodeForwardBackwardOutput(b); !errors.Is(err, ErrProto) {
		t.Fatalf("want ErrProto, got %v", err)
	}
	o := &ForwardBackwardOutput{LossFnOutputType: "ArrayRecord", Metrics: map[string]float64{},
		LossFnOutputs: []LossOutput{{"logprobs": {Data: []float64{-1}, DType: "float32", Shape: []int{1}}}}}
	enc := EncodeForwardBackwardOutput(o)
	if _, err := DecodeForwardBackwardOutput(enc); err != nil {
		t.Fatal(err)
	}
}
