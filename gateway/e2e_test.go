package gateway_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/client"
	"github.com/skein-ai/skein/engine"
	"github.com/skein-ai/skein/gateway"
)

const base = "tiny-qwen3"

var modelDir = sync.OnceValue(func() string {
	dir, err := os.MkdirTemp("", "skein-gw-model-")
	if err != nil {
		panic(err)
	}
	if err := engine.InitTiny(dir, engine.ArchQwen3, "tiny", 1); err != nil {
		panic(err)
	}
	return dir
})

type testServer struct {
	*httptest.Server
	gw  *gateway.Server
	eng *engine.Engine
}

// newServer serves the tiny model from one replica.
func newServer(t testing.TB, opts gateway.Options) *testServer {
	t.Helper()
	ts, _ := newClusterWith(t, 1, 0, opts)
	return ts
}

func datum(ids []int, weights bool) api.Datum {
	n := len(ids) - 1
	tg := make([]float64, n)
	w := make([]float64, n)
	for i := range n {
		tg[i] = float64(ids[i+1])
		w[i] = 1
	}
	d := api.Datum{ModelInput: api.ModelInput{Chunks: []api.Chunk{{Type: "encoded_text", Tokens: ids[:n]}}},
		LossFnInputs: map[string]api.TensorData{"target_tokens": {Data: tg, DType: "int64", Shape: []int{n}}}}
	if weights {
		d.LossFnInputs["weights"] = api.TensorData{Data: w, DType: "float32", Shape: []int{n}}
	}
	return d
}

func supervised(t *testing.T, ts *testServer, jsonPath bool) {
	ctx := context.Background()
	c := client.New(ts.URL, "tml-alice")
	c.JSONForwardBackward = jsonPath
	sess, err := c.CreateSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tc, err := c.CreateLoraTrainingClient(ctx, sess, 0, base, 8)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(tc.ModelID, sess+":train:") {
		t.Fatalf("model id %q", tc.ModelID)
	}
	ids := ts.eng.Tokenizer.Encode("The quick brown fox jumps over the lazy dog.")
	data := []api.Datum{datum(ids, true)}
	var losses []float64
	for range 12 {
		// Submit both before awaiting either, as the cookbook does.
		fb, err := tc.ForwardBackward(ctx, data, "cross_entropy", nil, false)
		if err != nil {
			t.Fatal(err)
		}
		os, err := tc.OptimStep(ctx, 1e-2)
		if err != nil {
			t.Fatal(err)
		}
		var out api.ForwardBackwardOutput
		if err := fb.Result(ctx, &out); err != nil {
			t.Fatal(err)
		}
		if len(out.LossFnOutputs) != 1 || len(out.LossFnOutputs[0]["logprobs"].Data) != len(ids)-1 {
			t.Fatalf("outputs %+v", out.LossFnOutputs)
		}
		losses = append(losses, out.Metrics["loss:sum"])
		var step map[string]any
		if err := os.Result(ctx, &step); err != nil {
			t.Fatal(err)
		}
	}
	if !(losses[len(losses)-1] < losses[0]/2) {
		t.Fatalf("loss did not fall: %v", losses)
	}
}

func TestSupervisedLoopProtobuf(t *testing.T) { supervised(t, newServer(t, gateway.Options{}), false) }
func TestSupervisedLoopJSON(t *testing.T)     { supervised(t, newServer(t, gateway.Options{}), true) }

func TestRLLoopWithEphemeralSampler(t *testing.T) {
	ts := newServer(t, gateway.Options{})
	ctx := context.Background()
	c, tc := newRun(t, ts.URL, "tml-bob", 4)
	prompt := ts.eng.Tokenizer.Encode("Questions and answers:")
	for step, loss := range []string{"importance_sampling", "ppo"} {
		f, err := tc.SaveWeightsForSampler(ctx, "")
		if err != nil {
			t.Fatal(err)
		}
		var saved struct {
			SamplingSessionID string `json:"sampling_session_id"`
		}
		if err := f.Result(ctx, &saved); err != nil || saved.SamplingSessionID == "" {
			t.Fatalf("ephemeral save: %v %+v", err, saved)
		}
		n, mt := 4, 6
		seed := int64(step)
		sf, err := c.Sample(ctx, api.SampleRequest{SamplingSessionID: saved.SamplingSessionID, NumSamples: &n,
			Prompt:         api.ModelInput{Chunks: []api.Chunk{{Type: "encoded_text", Tokens: prompt}}},
			SamplingParams: api.SamplingParams{MaxTokens: &mt, Seed: &seed}})
		if err != nil {
			t.Fatal(err)
		}
		var res api.SampleResponse
		if err := sf.Result(ctx, &res); err != nil {
			t.Fatal(err)
		}
		if len(res.Sequences) != n {
			t.Fatalf("%d sequences", len(res.Sequences))
		}
		var data []api.Datum
		for i, s := range res.Sequences {
			if len(s.Logprobs) != len(s.Tokens) || len(s.Tokens) == 0 {
				t.Fatalf("sequence %d: %d tokens, %d logprobs", i, len(s.Tokens), len(s.Logprobs))
			}
			full := append(append([]int{}, prompt...), s.Tokens...)
			d := datum(full, false)
			N := len(full) - 1
			lp := make([]float64, N)
			adv := make([]float64, N)
			for j := range s.Tokens {
				lp[len(prompt)-1+j] = s.Logprobs[j]
				adv[len(prompt)-1+j] = float64(i) - 1.5
			}
			d.LossFnInputs["logprobs"] = api.TensorData{Data: lp, DType: "float32"}
			d.LossFnInputs["advantages"] = api.TensorData{Data: adv, DType: "float32"}
			data = append(data, d)
		}
		fb, err := tc.ForwardBackward(ctx, data, loss, nil, false)
		if err != nil {
			t.Fatal(err)
		}
		var out api.ForwardBackwardOutput
		if err := fb.Result(ctx, &out); err != nil {
			t.Fatal(err)
		}
		// On-policy: the trainer's logprobs of sampled tokens equal the sampler's.
		for i, s := range res.Sequences {
			got := out.LossFnOutputs[i]["logprobs"].Data
			for j, want := range s.Logprobs {
				if d := got[len(prompt)-1+j] - want; d > 2e-3 || d < -2e-3 {
					t.Fatalf("%s: seq %d token %d: trainer logprob %v, sampler %v", loss, i, j, got[len(prompt)-1+j], want)
				}
			}
		}
		of, _ := tc.OptimStep(ctx, 1e-3)
		if err := of.Result(ctx, nil); err != nil {
			t.Fatal(err)
		}
	}
}

func TestCheckpointsStateAndTenancy(t *testing.T) {
	ts := newServer(t, gateway.Options{})
	ctx := context.Background()
	alice := client.New(ts.URL, "tml-alice")
	eve := client.New(ts.URL, "tml-eve")
	sess, _ := alice.CreateSession(ctx)
	tc, err := alice.CreateLoraTrainingClient(ctx, sess, 0, base, 4)
	if err != nil {
		t.Fatal(err)
	}
	ids := ts.eng.Tokenizer.Encode("Every test should be able to fail.")
	for range 2 {
		fb, _ := tc.ForwardBackward(ctx, []api.Datum{datum(ids, true)}, "cross_entropy", nil, false)
		os, _ := tc.OptimStep(ctx, 1e-2)
		if err := fb.Result(ctx, &api.ForwardBackwardOutput{}); err != nil {
			t.Fatal(err)
		}
		if err := os.Result(ctx, nil); err != nil {
			t.Fatal(err)
		}
	}
	var saved struct{ Path string }
	f, _ := tc.SaveState(ctx, "step2")
	if err := f.Result(ctx, &saved); err != nil || saved.Path != "tinker://"+tc.ModelID+"/weights/step2" {
		t.Fatalf("save_state: %v %q", err, saved.Path)
	}
	f, _ = tc.SaveWeightsForSampler(ctx, "s2")
	var ss struct{ Path string }
	if err := f.Result(ctx, &ss); err != nil || !strings.HasSuffix(ss.Path, "/sampler_weights/s2") {
		t.Fatalf("sampler save: %v %q", err, ss.Path)
	}
	probe := []api.Datum{datum(ids, true)}
	fwd := func(tc *client.TrainingClient) []float64 {
		f, err := tc.ForwardBackward(ctx, probe, "cross_entropy", nil, true)
		if err != nil {
			t.Fatal(err)
		}
		var out api.ForwardBackwardOutput
		if err := f.Result(ctx, &out); err != nil {
			t.Fatal(err)
		}
		return out.LossFnOutputs[0]["logprobs"].Data
	}
	want := fwd(tc)

	// load_state with optimizer into a new model gives the same outputs.
	tc2, err := alice.CreateLoraTrainingClient(ctx, sess, 1, base, 4)
	if err != nil {
		t.Fatal(err)
	}
	f, _ = tc2.LoadState(ctx, saved.Path, true)
	if err := f.Result(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if got := fwd(tc2); !slices.Equal(got, want) {
		t.Fatal("loaded model differs from the saved one")
	}
	// Loading optimizer state from a sampler checkpoint is a user error.
	if _, err := tc2.LoadState(ctx, ss.Path, true); !isStatus(err, 400) {
		t.Fatalf("optimizer from sampler weights: %v", err)
	}

	// Sampling from the named sampler checkpoint and from the base model.
	for _, path := range []string{ss.Path, ""} {
		sid, err := alice.CreateSamplingSession(ctx, sess, base, path)
		if err != nil {
			t.Fatal(err)
		}
		mt := 3
		sf, err := alice.Sample(ctx, api.SampleRequest{SamplingSessionID: sid, Prompt: api.ModelInput{Chunks: []api.Chunk{{Tokens: ids[:4]}}},
			SamplingParams: api.SamplingParams{MaxTokens: &mt}, PromptLogprobs: true})
		if err != nil {
			t.Fatal(err)
		}
		var res api.SampleResponse
		if err := sf.Result(ctx, &res); err != nil {
			t.Fatal(err)
		}
		seq := res.Sequences[0]
		// Three tokens, unless the model drew its end-of-text token first.
		if len(res.Sequences) != 1 || !(len(seq.Tokens) == 3 || (seq.StopReason == "stop" && len(seq.Tokens) > 0)) ||
			len(seq.Logprobs) != len(seq.Tokens) || len(res.PromptLogprobs) != 4 || res.PromptLogprobs[0] != nil {
			t.Fatalf("sample from %q: %+v", path, res)
		}
	}

	// Listing and tenancy.
	var list struct {
		Checkpoints []api.Checkpoint `json:"checkpoints"`
	}
	if err := alice.Do(ctx, "GET", "training_runs/"+tc.ModelID+"/checkpoints", nil, &list); err != nil || len(list.Checkpoints) != 2 {
		t.Fatalf("list: %v %+v", err, list)
	}
	if err := eve.Do(ctx, "GET", "training_runs/"+tc.ModelID+"/checkpoints", nil, &list); !isStatus(err, 404) {
		t.Fatalf("eve listed alice's checkpoints: %v", err)
	}
	if err := eve.Do(ctx, "POST", "weights_info", map[string]string{"tinker_path": saved.Path}, nil); !isStatus(err, 404) {
		t.Fatalf("eve read alice's checkpoint: %v", err)
	}
	if err := eve.Do(ctx, "POST", "get_info", map[string]string{"model_id": tc.ModelID}, nil); !isStatus(err, 404) {
		t.Fatalf("eve read alice's model: %v", err)
	}
	if err := eve.Do(ctx, "POST", "retrieve_future", api.RetrieveFutureRequest{RequestID: f.RequestID}, nil); !isStatus(err, 404) {
		t.Fatalf("eve read alice's future: %v", err)
	}
	ckptURL := "training_runs/" + tc.ModelID + "/checkpoints/weights/step2"
	if err := eve.Do(ctx, "DELETE", ckptURL, nil, nil); !isStatus(err, 404) {
		t.Fatalf("eve deleted alice's checkpoint: %v", err)
	}
	// Published: eve may read it, never delete it.
	if err := alice.Do(ctx, "POST", ckptURL+"/publish", nil, nil); err != nil {
		t.Fatal(err)
	}
	if err := eve.Do(ctx, "POST", "weights_info", map[string]string{"tinker_path": saved.Path}, nil); err != nil {
		t.Fatalf("published checkpoint unreadable: %v", err)
	}
	if err := eve.Do(ctx, "DELETE", ckptURL, nil, nil); !isStatus(err, 404) {
		t.Fatalf("eve deleted a published checkpoint: %v", err)
	}
	if err := alice.Do(ctx, "DELETE", ckptURL, nil, nil); err != nil {
		t.Fatal(err)
	}
	if err := alice.Do(ctx, "GET", "training_runs/"+tc.ModelID+"/checkpoints", nil, &list); err != nil || len(list.Checkpoints) != 1 {
		t.Fatalf("after delete: %v %+v", err, list)
	}
}

func isStatus(err error, code int) bool {
	var se *client.StatusError
	return errors.As(err, &se) && se.Status == code && se.Body != ""
}

// Ops of a model run in seq_id order whatever order they arrive in, and a retried
// (model_id, seq_id) is answered with the original request id.
func TestOutOfOrderAndRetry(t *testing.T) {
	ts := newServer(t, gateway.Options{})
	ctx := context.Background()
	_, tc := newRun(t, ts.URL, "tml-carol", 4)
	ids := ts.eng.Tokenizer.Encode("The river flows past the mill.")
	data := []api.Datum{datum(ids, true)}
	// seq 2 (a forward) arrives before seq 1 (forward_backward) and must wait for it... and
	// seq 3 (another forward) shows whether an optim_step-less order was kept: equal outputs.
	f2, err := tc.ForwardBackwardSeq(ctx, 2, data, "cross_entropy", nil, true)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	f1, err := tc.ForwardBackwardSeq(ctx, 1, data, "cross_entropy", nil, false)
	if err != nil {
		t.Fatal(err)
	}
	again, err := tc.ForwardBackwardSeq(ctx, 1, data, "cross_entropy", nil, false)
	if err != nil {
		t.Fatal(err)
	}
	if again.RequestID != f1.RequestID {
		t.Fatalf("retry got request %s, original %s", again.RequestID, f1.RequestID)
	}
	var o1, o2 api.ForwardBackwardOutput
	if err := f1.Result(ctx, &o1); err != nil {
		t.Fatal(err)
	}
	if err := f2.Result(ctx, &o2); err != nil {
		t.Fatal(err)
	}
	// seq 3: optim_step; seq 4: forward must see the stepped weights.
	for tc.NextSeq() < 2 {
	}
	of, _ := tc.OptimStep(ctx, 1e-2)
	if err := of.Result(ctx, nil); err != nil {
		t.Fatal(err)
	}
	f4, _ := tc.ForwardBackward(ctx, data, "cross_entropy", nil, true)
	var o4 api.ForwardBackwardOutput
	if err := f4.Result(ctx, &o4); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(o1.LossFnOutputs[0]["logprobs"].Data, o2.LossFnOutputs[0]["logprobs"].Data) {
		t.Fatal("forward (seq 2) did not see the same weights as forward_backward (seq 1)")
	}
	if slices.Equal(o2.LossFnOutputs[0]["logprobs"].Data, o4.LossFnOutputs[0]["logprobs"].Data) {
		t.Fatal("forward after optim_step saw unchanged weights")
	}
	if !(o4.Metrics["loss:sum"] < o2.Metrics["loss:sum"]) {
		t.Fatalf("loss after a step %v, before %v", o4.Metrics["loss:sum"], o2.Metrics["loss:sum"])
	}
}

// Bad requests get a 4xx with a message, never a 5xx or an empty body, and change nothing.
func TestBadRequestsGetClearErrors(t *testing.T) {
	ts := newServer(t, gateway.Options{MaxBodyBytes: 1 << 16})
	ctx := context.Background()
	c := client.New(ts.URL, "tml-dave")
	sess, _ := c.CreateSession(ctx)
	tc, err := c.CreateLoraTrainingClient(ctx, sess, 0, base, 4)
	if err != nil {
		t.Fatal(err)
	}
	post := func(path, ctype, body string, key string) (int, string) {
		req, _ := http.NewRequest("POST", ts.URL+"/api/v1/"+path, strings.NewReader(body))
		req.Header.Set("Content-Type", ctype)
		if key != "" {
			req.Header.Set("X-API-Key", key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b := make([]byte, 4096)
		n, _ := resp.Body.Read(b)
		return resp.StatusCode, string(b[:n])
	}
	j := "application/json"
	big := strings.Repeat("x", 1<<17)
	cases := []struct {
		path, ctype, body, key string
		status                 int
	}{
		{"create_model", j, `{"session_id":`, "tml-dave", 400},
		{"create_model", j, `{"session_id": 5}`, "tml-dave", 400},
		{"create_model", j, `{"session_id":"` + sess + `","model_seq_id":1,"base_model":"nope","lora_config":{"rank":4}}`, "tml-dave", 400},
		{"create_model", j, `{"session_id":"` + sess + `","model_seq_id":1,"base_model":"tiny-qwen3","lora_config":{"rank":0}}`, "tml-dave", 400},
		{"create_model", j, `{"session_id":"` + sess + `","model_seq_id":1,"base_model":"tiny-qwen3"}`, "tml-eve", 404},
		{"create_model", j, `{}`, "", 401},
		{"forward_backward", "application/x-protobuf", "\xff\xff\xff", "tml-dave", 400},
		{"forward_backward", j, `{"model_id":"` + tc.ModelID + `","forward_backward_input":{"data":[{"model_input":{"chunks":[{"type":"encoded_text","tokens":[1,2]}]},"loss_fn_inputs":{"target_tokens":{"data":[1],"dtype":"int64"}}}],"loss_fn":"cross_entropy"}}`, "tml-dave", 400},
		{"forward_backward", j, `{"model_id":"` + tc.ModelID + `","forward_backward_input":{"data":[],"loss_fn":"nope"}}`, "tml-dave", 400},
		{"forward_backward", j, `{"model_id":"nobody:train:0","forward_backward_input":{"data":[],"loss_fn":"cross_entropy"}}`, "tml-dave", 404},
		{"forward_backward", j, big, "tml-dave", 413},
		{"optim_step", j, `{"model_id":"` + tc.ModelID + `","adam_params":{"learning_rate":-1}}`, "tml-dave", 400},
		{"retrieve_future", j, `{"request_id":"nope"}`, "tml-dave", 404},
		{"asample", j, `{"base_model":"tiny-qwen3","prompt":{"chunks":[{"type":"encoded_text","tokens":[99999]}]},"sampling_params":{}}`, "tml-dave", 400},
		{"asample", j, `{"base_model":"tiny-qwen3","prompt":{"chunks":[{"type":"image","data":"AA=="}]},"sampling_params":{}}`, "tml-dave", 400},
		{"asample", j, `{"sampling_session_id":"nope","prompt":{"chunks":[]},"sampling_params":{}}`, "tml-dave", 404},
		{"load_weights", j, `{"model_id":"` + tc.ModelID + `","path":"http://x","optimizer":true}`, "tml-dave", 400},
		{"load_weights", j, `{"model_id":"` + tc.ModelID + `","path":"tinker://a:train:0/weights/zz","optimizer":true}`, "tml-dave", 404}, // as the REST calls answer
		{"weights_info", j, `{"tinker_path":"tinker://../../etc/passwd"}`, "tml-dave", 400},
		{"save_weights", j, `{"model_id":"` + tc.ModelID + `","path":"../escape"}`, "tml-dave", 400},
		{"nonexistent", j, `{}`, "tml-dave", 404},
	}
	for _, c := range cases {
		status, body := post(c.path, c.ctype, c.body, c.key)
		if status != c.status || len(body) == 0 || !strings.Contains(body, "detail") {
			t.Errorf("%s %.60q: got %d %q, want %d with a message", c.path, c.body, status, body, c.status)
		}
	}
	// The model still trains from seq 1 on: rejected requests changed nothing.
	ids := ts.eng.Tokenizer.Encode("Still fine.")
	fb, err := tc.ForwardBackward(ctx, []api.Datum{datum(ids, true)}, "cross_entropy", nil, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := fb.Result(ctx, &api.ForwardBackwardOutput{}); err != nil {
		t.Fatal(err)
	}
	if entries, _ := filepath.Glob(filepath.Join(os.TempDir(), "escape*")); len(entries) > 0 {
		t.Fatal("a path escaped the data directory")
	}
}
