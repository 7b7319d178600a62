package worker

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	"github.com/skein-ai/skein/engine"
)

// A request that failed alone inside a sampling batch (non-finite logits) comes back from a
// worker as that request's typed error, not as a result without sequences.
func TestSampleFailureCrossesTheWire(t *testing.T) {
	for _, err := range []error{
		fmt.Errorf("sampling token 0: %w", engine.ErrNonFinite),
		&engine.InputError{Datum: -1, Field: "prompt", Msg: "bad"},
	} {
		b, jerr := json.Marshal(toWireSample(&engine.SampleResult{Err: err}))
		if jerr != nil {
			t.Fatal(jerr)
		}
		var w wireSample
		if jerr := json.Unmarshal(b, &w); jerr != nil {
			t.Fatal(jerr)
		}
		got := fromWireSample(&w)
		if got.Err == nil || len(got.Sequences) != 0 {
			t.Fatalf("%v: came back as %+v", err, got)
		}
		for _, kind := range []error{engine.ErrNonFinite, engine.ErrInvalidInput} {
			if errors.Is(err, kind) != errors.Is(got.Err, kind) {
				t.Fatalf("%v came back as %v: errors.Is(%v) changed", err, got.Err, kind)
			}
		}
	}
}
