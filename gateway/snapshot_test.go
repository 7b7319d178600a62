package gateway_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/skein-ai/skein/engine"
	"github.com/skein-ai/skein/gateway"
)

// A sampler's weights are held as a read-only snapshot, not a training adapter: the replica's
// engine knows it takes no LoRA slot, both when save_weights_for_sampler makes the snapshot and
// when a sample loads the copy again after it was unloaded.
func TestSamplerCopiesAreSnapshots(t *testing.T) {
	e, err := engine.Load(modelDir(), engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ts := serverOver(t, e, gateway.Options{})
	ctx := context.Background()
	_, tc := newRun(t, ts.URL, "tml-snap", 2)
	f, err := tc.SaveWeightsForSampler(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	var out struct {
		ID string `json:"sampling_session_id"`
	}
	if err := f.Result(ctx, &out); err != nil {
		t.Fatal(err)
	}
	check := func(when string) {
		t.Helper()
		all, training := e.AdapterIDs(ctx), e.TrainingAdapterIDs(ctx)
		if len(all) != 2 || len(training) != 1 || strings.HasPrefix(training[0], "sampler:") {
			t.Fatalf("%s: adapters %v, training adapters %v; want the run alone training beside one snapshot", when, all, training)
		}
	}
	check("after save_weights_for_sampler")
	for _, id := range e.AdapterIDs(ctx) {
		if !slices.Contains(e.TrainingAdapterIDs(ctx), id) {
			e.DeleteAdapter(ctx, id) // as the copy LRU unloads it
		}
	}
	body := `{"sampling_session_id":"` + out.ID + `","prompt":{"chunks":[{"type":"encoded_text","tokens":[1,2]}]},"sampling_params":{"max_tokens":1}}`
	sampleOn(t, ts.URL, "tml-snap", nil, body)
	check("after a sample loaded the copy again")
}
