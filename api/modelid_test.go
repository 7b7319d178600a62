package api

import "testing"

// The model_id read without decoding is the decoded request's, however much data follows it or
// comes before it; a body that is not a request gives "" (the handler then says what is wrong).
func TestForwardBackwardModelIDReadsOnlyTheID(t *testing.T) {
	seq := 7
	req := &ForwardBackwardRequest{ModelID: "sess-1:train:0", SeqID: &seq, Input: ForwardBackwardInput{LossFn: "cross_entropy",
		Data: []Datum{{ModelInput: ModelInput{Chunks: []Chunk{{Type: "encoded_text", Tokens: []int{1, 2, 3}}}},
			LossFnInputs: map[string]TensorData{"target_tokens": {Data: []float64{2, 3, 4}, DType: "int64", Shape: []int{3}},
				"weights": {Data: []float64{1, 1, 1}, DType: "float32", Shape: []int{3}}}}}}}
	b := EncodeForwardBackwardRequest(req)
	dec, err := DecodeForwardBackwardRequest(b)
	if err != nil {
		t.Fatal(err)
	}
	if got := ForwardBackwardModelID(b); got != dec.ModelID || got != req.ModelID {
		t.Fatalf("model_id %q, decoded %q", got, dec.ModelID)
	}
	for _, bad := range [][]byte{nil, {0xff, 0xff, 0xff}, []byte(`{"model_id":"x"}`), b[:3]} {
		if got := ForwardBackwardModelID(bad); got != "" {
			t.Fatalf("%q: model_id %q from a body that is not a request", bad, got)
		}
	}
}
