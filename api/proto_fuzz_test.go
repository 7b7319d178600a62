package api

import (
	"reflect"
	"testing"
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
	f.Add([]byte{})
	f.Add([]byte{0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Add([]byte{0x1a, 0x04, 0x12, 0x02, 0x0a, 0x00})
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
