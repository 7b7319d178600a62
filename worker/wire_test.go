package worker

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http/httptest"
	"testing"

	"github.com/skein-ai/skein/engine"
)

// Typed engine errors survive the trip to the gateway, so user faults stay user faults.
func TestErrorsKeepTheirType(t *testing.T) {
	cases := []struct {
		err  error
		want error
	}{
		{&engine.InputError{Datum: 2, Field: "loss_fn_inputs.weights", Msg: "length 3, want 4"}, engine.ErrInvalidInput},
		{fmt.Errorf("%w: %q", engine.ErrUnknownAdapter, "x"), engine.ErrUnknownAdapter},
		{fmt.Errorf("engine: dir: %w", engine.ErrNoOptimizerState), engine.ErrNoOptimizerState},
	}
	for _, c := range cases {
		got := decodeErr(encodeErr(c.err))
		if !errors.Is(got, c.want) {
			t.Errorf("%v came back as %v", c.err, got)
		}
	}
	var ie *engine.InputError
	if got := decodeErr(encodeErr(cases[0].err)); !errors.As(got, &ie) || got.Error() != cases[0].err.Error() {
		t.Errorf("input error came back as %v", got)
	}
	if got := decodeErr(encodeErr(errors.New("disk full"))); errors.Is(got, engine.ErrInvalidInput) {
		t.Error("a server error became a user error")
	}
}

// The client and server speak the same protocol: an engine over HTTP behaves like the engine.
func TestClientServerRoundTrip(t *testing.T) {
	dir := t.TempDir()
	if err := engine.InitTiny(dir, engine.ArchQwen2, "tiny", 1); err != nil {
		t.Fatal(err)
	}
	e, err := engine.Load(dir, engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(NewServer(e, "tok", dir))
	defer ts.Close()
	c := NewClient(ts.URL, "tok", e.Info())
	if err := c.CreateLora(context.Background(), "a", engine.LoraConfig{Rank: 2, TrainAttn: true}); err != nil {
		t.Fatal(err)
	}
	if !c.HasAdapter(context.Background(), "a") || len(c.AdapterIDs(context.Background())) != 1 {
		t.Fatal("adapter not visible through the client")
	}
	d := engine.Datum{Tokens: []int{1, 2, 3}, Inputs: map[string]engine.TensorInput{"target_tokens": {DType: "int64", Data: []float64{2, 3, 4}}}}
	remote, err := c.Forward(context.Background(), "a", []engine.Datum{d}, "cross_entropy", nil)
	if err != nil {
		t.Fatal(err)
	}
	local, _ := e.Forward(context.Background(), "a", []engine.Datum{d}, "cross_entropy", nil)
	if fmt.Sprint(remote.Logprobs) != fmt.Sprint(local.Logprobs) {
		t.Fatalf("remote %v, local %v", remote.Logprobs, local.Logprobs)
	}
	res, err := c.SampleBatch(context.Background(), "", []engine.SampleRequest{{Prompt: []int{1, 2, 3}, PromptLogprobs: true, Params: engine.SampleParams{MaxTokens: 2}}})
	if err != nil || len(res) != 1 || !math.IsNaN(res[0].PromptLogprobs[0]) || len(res[0].Sequences[0].Tokens) == 0 {
		t.Fatalf("sample through the client: %v %+v", err, res)
	}
	if _, err := c.Forward(context.Background(), "a", []engine.Datum{d}, "nope", nil); !errors.Is(err, engine.ErrInvalidInput) {
		t.Fatalf("bad loss through the client: %v", err)
	}
	bad := NewClient(ts.URL, "wrong", e.Info())
	if bad.HasAdapter(context.Background(), "a") {
		t.Fatal("a call with the wrong token was served")
	}
}
