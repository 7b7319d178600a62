package gateway_test

import (
	"context"
	"math"
	"testing"

	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/client"
	"github.com/skein-ai/skein/gateway"
)

// stepMetricsOf runs one forward_backward (or forward) of tc and returns its metrics.
func stepMetricsOf(t *testing.T, tc *client.TrainingClient, data []api.Datum, forwardOnly bool) map[string]float64 {
	t.Helper()
	f, err := tc.ForwardBackward(context.Background(), data, "cross_entropy", nil, forwardOnly)
	var out api.ForwardBackwardOutput
	await(t, f, err, &out)
	return out.Metrics
}

// Every optim_step is recorded with the mean loss of the forward_backwards before it (forward-only
// calls left out); the listing pages by after_step and limit; another tenant's run is a 404.
func TestRunMetricsRecordEveryStep(t *testing.T) {
	ts := newServer(t, gateway.Options{})
	ctx := context.Background()
	c, tc := newRun(t, ts.URL, "tml-metrics", 4)
	data := []api.Datum{datum(ts.eng.Tokenizer.Encode("Loss should fall, step by step."), true)}
	fbsPerStep := []int{1, 2, 1}
	var wantLoss []float64
	for _, n := range fbsPerStep {
		var sum, tokens float64
		for range n {
			m := stepMetricsOf(t, tc, data, false)
			sum, tokens = sum+m["loss:sum"], tokens+m["num_tokens:sum"]
		}
		stepMetricsOf(t, tc, data, true) // an evaluation: not part of the step
		f, err := tc.OptimStep(ctx, 1e-2)
		await(t, f, err, &map[string]any{})
		wantLoss = append(wantLoss, sum/tokens)
	}

	var got api.TrainingRunMetricsResponse
	if err := c.Do(ctx, "GET", "training_runs/"+tc.ModelID+"/metrics", nil, &got); err != nil {
		t.Fatal(err)
	}
	if got.TrainingRunID != tc.ModelID || len(got.Steps) != len(fbsPerStep) || got.HasMore || got.Step != len(fbsPerStep) {
		t.Fatalf("metrics %+v", got)
	}
	for i, st := range got.Steps {
		if st.Step != int64(i+1) || st.ForwardBackwards != fbsPerStep[i] || st.Loss == nil || st.Time == "" {
			t.Fatalf("step %d: %+v", i, st)
		}
		if math.Abs(*st.Loss-wantLoss[i]) > 1e-6*math.Abs(wantLoss[i]) {
			t.Fatalf("step %d: loss %v, forward_backwards reported %v", i, *st.Loss, wantLoss[i])
		}
	}
	if !(*got.Steps[2].Loss < *got.Steps[0].Loss) {
		t.Fatalf("loss did not fall: %v then %v", *got.Steps[0].Loss, *got.Steps[2].Loss)
	}

	if err := c.Do(ctx, "GET", "training_runs/"+tc.ModelID+"/metrics?after_step=1&limit=1", nil, &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Steps) != 1 || got.Steps[0].Step != 2 || !got.HasMore || got.Step != len(fbsPerStep) {
		t.Fatalf("after_step=1&limit=1: %+v", got)
	}
	for _, q := range []string{"limit=0", "limit=10001", "limit=x", "after_step=-1", "after_step=1e3"} {
		if err := c.Do(ctx, "GET", "training_runs/"+tc.ModelID+"/metrics?"+q, nil, &got); !isStatus(err, 400) {
			t.Fatalf("%s: %v", q, err)
		}
	}
	mallory := client.New(ts.URL, "tml-mallory")
	if err := mallory.Do(ctx, "GET", "training_runs/"+tc.ModelID+"/metrics", nil, &got); !isStatus(err, 404) {
		t.Fatalf("another tenant's run: %v", err)
	}
}

// The runs listing carries each run's step and state, so the console's table and its chart
// read the same numbers: a trained run is idle at its step; an unloaded one is expired.
func TestRunListingHasStepAndState(t *testing.T) {
	ts := newServer(t, gateway.Options{})
	ctx := context.Background()
	c, tc := newRun(t, ts.URL, "tml-state", 4)
	data := []api.Datum{datum(ts.eng.Tokenizer.Encode("state and step"), true)}
	for range 2 {
		stepMetricsOf(t, tc, data, false)
		f, err := tc.OptimStep(ctx, 1e-2)
		await(t, f, err, &map[string]any{})
	}
	var page struct {
		Runs []struct {
			ID        string `json:"training_run_id"`
			Step      *int   `json:"step"`
			State     string `json:"state"`
			QueuedOps *int   `json:"queued_ops"`
		} `json:"training_runs"`
	}
	// Without include=state the listing is Tinker's, key for key.
	if err := c.Do(ctx, "GET", "training_runs", nil, &page); err != nil || len(page.Runs) != 1 || page.Runs[0].Step != nil || page.Runs[0].State != "" {
		t.Fatalf("a plain listing carries the console's fields: %+v %v", page.Runs, err)
	}
	if err := c.Do(ctx, "GET", "training_runs?include=state", nil, &page); err != nil {
		t.Fatal(err)
	}
	if len(page.Runs) != 1 || page.Runs[0].Step == nil || *page.Runs[0].Step != 2 || page.Runs[0].State != "idle" || page.Runs[0].QueuedOps == nil {
		t.Fatalf("listing %+v", page.Runs)
	}
	var m struct {
		Step  int    `json:"step"`
		State string `json:"state"`
	}
	if err := c.Do(ctx, "GET", "training_runs/"+tc.ModelID+"/metrics?limit=1", nil, &m); err != nil || m.State != "idle" || m.Step != 2 {
		t.Fatalf("metrics state %+v %v", m, err)
	}
	if err := c.Do(ctx, "POST", "unload_model", map[string]any{"model_id": tc.ModelID}, &map[string]any{}); err != nil {
		t.Fatal(err)
	}
	if err := c.Do(ctx, "GET", "training_runs?include=state", nil, &page); err != nil || page.Runs[0].State != "expired" {
		t.Fatalf("after unload: %+v %v", page.Runs, err)
	}
}
