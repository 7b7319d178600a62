package gateway_test

import (
	"context"
	"testing"
	"time"

	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/gateway"
)

// Reading a run does not make it "just now": get_training_run and get_info leave its
// last_request_time as it was (a console open on the runs list touched every run); a request that
// acts on the run moves it.
func TestReadingARunLeavesItsLastRequestTime(t *testing.T) {
	ts := newServer(t, gateway.Options{})
	ctx := context.Background()
	c, tc := trainedModel(t, ts, "tml-lastreq")
	last := func() time.Time {
		t.Helper()
		var run api.TrainingRun
		if err := c.Do(ctx, "GET", "training_runs/"+tc.ModelID, nil, &run); err != nil {
			t.Fatal(err)
		}
		at, err := time.Parse(time.RFC3339Nano, run.LastRequestTime)
		if err != nil {
			t.Fatalf("last_request_time %q: %v", run.LastRequestTime, err)
		}
		return at
	}
	before := last()
	time.Sleep(20 * time.Millisecond)
	var info api.GetInfoResponse
	if err := c.Do(ctx, "POST", "get_info", api.ModelIDRequest{ModelID: tc.ModelID}, &info); err != nil {
		t.Fatal(err)
	}
	if got := last(); !got.Equal(before) {
		t.Fatalf("reading the run moved its last_request_time from %v to %v", before, got)
	}
	f, err := tc.SaveState(ctx, "s1")
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Result(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if got := last(); !got.After(before) {
		t.Fatalf("saving state left last_request_time at %v (was %v)", got, before)
	}
}
