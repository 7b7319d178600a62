package gateway_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/client"
	"github.com/skein-ai/skein/gateway"
)

// Numbers that would overflow, divide by zero or size an allocation are a 400 with a message
// at the API, and the model goes on training as if they had never been sent.
func TestNumbersThatBreakThingsAre400s(t *testing.T) {
	ts := newServer(t, gateway.Options{})
	ctx := context.Background()
	c, tc := newRun(t, ts.URL, "tml-numbers", 4)
	post := func(path, body string) (int, string) {
		req, _ := http.NewRequest("POST", ts.URL+"/api/v1/"+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-API-Key", "tml-numbers")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	model := `"model_id":"` + tc.ModelID + `"`
	sparse := func(shape string) string {
		return `{` + model + `,"forward_backward_input":{"loss_fn":"cross_entropy","data":[{"model_input":{"chunks":[{"type":"encoded_text","tokens":[1,2,3]}]},` +
			`"loss_fn_inputs":{"target_tokens":{"data":[2,3,4],"dtype":"int64"},` +
			`"weights":{"data":[1],"dtype":"float32","shape":` + shape + `,"sparse_crow_indices":[0,1,1,1],"sparse_col_indices":[5]}}}]}}`
	}
	prompt := `"base_model":"tiny-qwen3","prompt":{"chunks":[{"type":"encoded_text","tokens":[1,2]}]}`
	cases := []struct{ name, path, body string }{
		{"sparse shape wraps", "forward_backward", sparse(fmt.Sprint("[3,", int64(1)<<62, "]"))},
		{"sparse shape huge", "forward_backward", sparse("[3,1099511627776]")},
		{"eps 0", "optim_step", `{` + model + `,"adam_params":{"learning_rate":1e-3,"eps":0}}`},
		{"decay past 1", "optim_step", `{` + model + `,"adam_params":{"learning_rate":0.5,"weight_decay":3}}`},
		{"negative clip", "forward_backward", `{` + model + `,"forward_backward_input":{"loss_fn":"ppo","loss_fn_config":{"clip_low_threshold":-1},"data":[{"model_input":{"chunks":[{"type":"encoded_text","tokens":[1,2,3]}]},` +
			`"loss_fn_inputs":{"target_tokens":[2,3,4],"logprobs":[-1,-1,-1],"advantages":[1,1,1]}}]}}`},
		{"ttl overflows", "save_weights", `{` + model + `,"path":"big","ttl_seconds":` + fmt.Sprint(int64(math.MaxInt64)) + `}`},
		{"ttl past the limit", "save_weights_for_sampler", `{` + model + `,"path":"big","ttl_seconds":` + fmt.Sprint(gateway.MaxTTLSeconds+1) + `}`},
		{"top-k prompt logprobs", "asample", `{` + prompt + `,"topk_prompt_logprobs":100000,"sampling_params":{}}`},
		{"many stops", "asample", `{` + prompt + `,"sampling_params":{"stop":[` + strings.Repeat(`"a",`, 300) + `"a"]}}`},
	}
	for _, c := range cases {
		status, body := post(c.path, c.body)
		if status != 400 || !strings.Contains(body, "detail") {
			t.Errorf("%s: got %d %.200s, want 400 with a message", c.name, status, body)
		}
	}
	ttlURL := "training_runs/" + tc.ModelID + "/checkpoints/weights/kept/ttl"
	f, err := tc.SaveState(ctx, "kept")
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Result(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if err := c.Do(ctx, "PUT", ttlURL, map[string]any{"ttl_seconds": int64(math.MaxInt64)}, nil); !isStatus(err, 400) {
		t.Fatalf("huge ttl on PUT: %v", err)
	}
	// The longest TTL allowed keeps the checkpoint into the future.
	if err := c.Do(ctx, "PUT", ttlURL, map[string]any{"ttl_seconds": gateway.MaxTTLSeconds}, nil); err != nil {
		t.Fatal(err)
	}
	var list struct {
		Checkpoints []api.Checkpoint `json:"checkpoints"`
	}
	if err := c.Do(ctx, "GET", "checkpoints", nil, &list); err != nil || len(list.Checkpoints) != 1 || list.Checkpoints[0].ExpiresAt == nil {
		t.Fatalf("checkpoints %v %+v", err, list)
	}
	exp, err := time.Parse(time.RFC3339Nano, *list.Checkpoints[0].ExpiresAt)
	if err != nil || !exp.After(time.Now()) {
		t.Fatalf("expires at %v (%v): not in the future", exp, err)
	}

	// Rejected requests changed nothing: the model trains and steps on.
	ids := ts.eng.Tokenizer.Encode("Numbers are fine again.")
	fb, err := tc.ForwardBackward(ctx, []api.Datum{datum(ids, true)}, "cross_entropy", nil, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := fb.Result(ctx, &api.ForwardBackwardOutput{}); err != nil {
		t.Fatal(err)
	}
	opt, err := tc.OptimStep(ctx, 1e-3)
	if err != nil {
		t.Fatal(err)
	}
	if err := opt.Result(ctx, nil); err != nil {
		t.Fatal(err)
	}
}

// A forward_backward whose loss overflows is a failed future of the user's category, and the
// next step trains normally.
func TestNonFiniteLossIsAUserError(t *testing.T) {
	ts := newServer(t, gateway.Options{})
	ctx := context.Background()
	_, tc := newRun(t, ts.URL, "tml-overflow", 4)
	ids := ts.eng.Tokenizer.Encode("Ratios overflow.")
	d := datum(ids, false)
	n := len(d.LossFnInputs["target_tokens"].Data)
	lp, adv := make([]float64, n), make([]float64, n)
	for i := range lp {
		lp[i], adv[i] = -1e30, 1
	}
	d.LossFnInputs["logprobs"] = api.TensorData{Data: lp, DType: "float32"}
	d.LossFnInputs["advantages"] = api.TensorData{Data: adv, DType: "float32"}
	fb, err := tc.ForwardBackward(ctx, []api.Datum{d}, "importance_sampling", nil, false)
	if err != nil {
		t.Fatal(err)
	}
	var rf *client.RequestFailed
	if err := fb.Result(ctx, &api.ForwardBackwardOutput{}); !errors.As(err, &rf) || rf.Category != "user" {
		t.Fatalf("overflowing loss: %v", err)
	}
	fb, err = tc.ForwardBackward(ctx, []api.Datum{datum(ids, true)}, "cross_entropy", nil, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := fb.Result(ctx, &api.ForwardBackwardOutput{}); err != nil {
		t.Fatal(err)
	}
}
