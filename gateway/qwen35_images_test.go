package gateway_test

import (
	"context"
	"net/http/httptest"
	"os"
	"sync"
	"testing"

	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/client"
	"github.com/skein-ai/skein/engine"
	"github.com/skein-ai/skein/gateway"
	"github.com/skein-ai/skein/replica"
)

var qwen35VLDir = sync.OnceValue(func() string {
	dir, err := os.MkdirTemp("", "skein-gw-q35vl-")
	if err != nil {
		panic(err)
	}
	if err := engine.InitTiny(dir, engine.ArchQwen3_5, "tiny-vl", 1); err != nil {
		panic(err)
	}
	return dir
})

// Qwen3.5's VL class with images through the API, as Qwen3-VL: an ImageChunk datum trains (its
// loss falls, one logprob a text and an image token), and a prompt with an image samples, its
// prompt logprobs covering the image's tokens.
func TestQwen35ImageChunksTrainAndSample(t *testing.T) {
	e, err := engine.Load(qwen35VLDir(), engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rep := replica.New("q35", vlBase, e, 0)
	gw, err := gateway.New(gateway.Options{DataDir: t.TempDir()}, rep)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(gw)
	t.Cleanup(func() { ts.Close(); gw.Close(); rep.Close() })
	ctx := context.Background()
	_, tc := vlTraining(t, ts.URL, "tml-alice")
	img := pngOf(t, 64, 96, 200)
	n := imageTokens(t, img)
	words := e.Tokenizer.Encode("a picture of a red fox")
	data := []api.Datum{vlDatum(words[:2], imageChunk(img), n, words[2:])}
	var losses []float64
	for range 6 {
		out, err := fbResult(t, tc, data, false)
		if err != nil {
			t.Fatal(err)
		}
		if got := len(out.LossFnOutputs[0]["logprobs"].Data); got != len(words)+n {
			t.Fatalf("%d logprobs for %d text + %d image tokens", got, len(words), n)
		}
		losses = append(losses, out.Metrics["loss:sum"])
		f, err := tc.OptimStep(ctx, 2e-2)
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Result(ctx, nil); err != nil {
			t.Fatal(err)
		}
	}
	if !(losses[len(losses)-1] < losses[0]*0.8) {
		t.Fatalf("loss did not fall: %v", losses)
	}
	c := client.New(ts.URL, "tml-bob")
	three := 3
	f, err := c.Sample(ctx, api.SampleRequest{BaseModel: vlBase, NumSamples: &three, PromptLogprobs: true,
		Prompt:         api.ModelInput{Chunks: []api.Chunk{{Type: "encoded_text", Tokens: words[:3]}, imageChunk(pngOf(t, 64, 64, 40))}},
		SamplingParams: api.SamplingParams{MaxTokens: &three}})
	if err != nil {
		t.Fatal(err)
	}
	var out api.SampleResponse
	if err := f.Result(ctx, &out); err != nil {
		t.Fatal(err)
	}
	if len(out.Sequences) != 3 || len(out.PromptLogprobs) != 3+imageTokens(t, pngOf(t, 64, 64, 40)) {
		t.Fatalf("%d sequences, %d prompt logprobs", len(out.Sequences), len(out.PromptLogprobs))
	}
}
