package gateway_test

import (
	"context"
	"net/http/httptest"
	"os"
	"testing"

	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/client"
	"github.com/skein-ai/skein/engine"
	"github.com/skein-ai/skein/gateway"
	"github.com/skein-ai/skein/replica"
)

// A Qwen3.5 (hybrid Gated DeltaNet) model served through the Tinker API: a LoRA trains (the loss
// falls), its weights are saved for a sampler, and seeded samples from that sampler carry the
// logprobs that a forward pass of the trained adapter computes for them — the DeltaNet's decode
// state and the training pass agree over HTTP, for several samples of one prompt.
func TestQwen35TrainsAndSamplesOverHTTP(t *testing.T) {
	dir, err := os.MkdirTemp("", "skein-gw-qwen35-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := engine.InitTiny(dir, engine.ArchQwen3_5, "tiny", 1); err != nil {
		t.Fatal(err)
	}
	e, err := engine.Load(dir, engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rep := replica.New("r0", q35Base, e, 0)
	gw, err := gateway.New(gateway.Options{DataDir: t.TempDir()}, rep)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(gw)
	t.Cleanup(func() { ts.Close(); gw.Close(); rep.Close() })

	ctx := context.Background()
	c := client.New(ts.URL, "tml-q35")
	sess, err := c.CreateSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tc, err := c.CreateLoraTrainingClient(ctx, sess, 0, q35Base, 8)
	if err != nil {
		t.Fatal(err)
	}
	ids := e.Tokenizer.Encode("The quick brown fox jumps over the lazy dog.")
	data := []api.Datum{datum(ids, true)}
	var losses []float64
	for range 10 {
		fb, err := tc.ForwardBackward(ctx, data, "cross_entropy", nil, false)
		if err != nil {
			t.Fatal(err)
		}
		of, err := tc.OptimStep(ctx, 1e-2)
		if err != nil {
			t.Fatal(err)
		}
		var out api.ForwardBackwardOutput
		if err := fb.Result(ctx, &out); err != nil {
			t.Fatal(err)
		}
		losses = append(losses, out.Metrics["loss:sum"])
		if err := of.Result(ctx, nil); err != nil {
			t.Fatal(err)
		}
	}
	if !(losses[len(losses)-1] < losses[0]/2) {
		t.Fatalf("loss did not fall: %v", losses)
	}

	f, err := tc.SaveWeightsForSampler(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	var saved struct {
		SamplingSessionID string `json:"sampling_session_id"`
	}
	if err := f.Result(ctx, &saved); err != nil || saved.SamplingSessionID == "" {
		t.Fatalf("save for sampler: %v %+v", err, saved)
	}
	prompt := ids[:4]
	n, mt, seed := 3, 8, int64(5)
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
		t.Fatalf("%d sequences, want %d", len(res.Sequences), n)
	}
	var fwdData []api.Datum
	for _, s := range res.Sequences {
		fwdData = append(fwdData, datum(append(append([]int{}, prompt...), s.Tokens...), false))
	}
	ff, err := tc.ForwardBackward(ctx, fwdData, "cross_entropy", nil, true) // forward only
	if err != nil {
		t.Fatal(err)
	}
	var fwd api.ForwardBackwardOutput
	if err := ff.Result(ctx, &fwd); err != nil {
		t.Fatal(err)
	}
	for i, s := range res.Sequences {
		if len(s.Tokens) == 0 || len(s.Logprobs) != len(s.Tokens) {
			t.Fatalf("sequence %d: %d tokens, %d logprobs", i, len(s.Tokens), len(s.Logprobs))
		}
		got := fwd.LossFnOutputs[i]["logprobs"].Data
		for j, want := range s.Logprobs {
			if d := got[len(prompt)-1+j] - want; d > 2e-3 || d < -2e-3 {
				t.Fatalf("sequence %d token %d: forward logprob %v, sampler %v", i, j, got[len(prompt)-1+j], want)
			}
		}
	}
}

// q35Base is the served base model's name in TestQwen35TrainsAndSamplesOverHTTP.
const q35Base = "tiny-qwen3_5"
