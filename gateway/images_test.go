package gateway_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"image"
	"image/color"
	"image/png"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/client"
	"github.com/skein-ai/skein/engine"
	"github.com/skein-ai/skein/engine/imageproc"
	"github.com/skein-ai/skein/gateway"
	"github.com/skein-ai/skein/replica"
	"github.com/skein-ai/skein/worker"
)

const vlBase = "tiny-vl"

var vlModelDir = sync.OnceValue(func() string {
	dir, err := os.MkdirTemp("", "skein-gw-vl-")
	if err != nil {
		panic(err)
	}
	if err := engine.InitTiny(dir, engine.ArchQwen3VL, "tiny", 1); err != nil {
		panic(err)
	}
	return dir
})

// newVLServer serves the tiny VL model and, beside it, the tiny text model, in process.
func newVLServer(t *testing.T, opts gateway.Options) (*httptest.Server, *engine.Engine) {
	t.Helper()
	ts := newVLServerWith(t, opts, true)
	return ts.Server, ts.eng
}

func newVLServerWith(t *testing.T, opts gateway.Options, withText bool) *testServer {
	t.Helper()
	e, err := engine.Load(vlModelDir(), engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	reps := []*replica.Replica{replica.New("vl0", vlBase, e, 0)}
	if withText {
		text, err := engine.Load(modelDir(), engine.Options{})
		if err != nil {
			t.Fatal(err)
		}
		reps = append(reps, replica.New("t0", base, text, 0))
	}
	if opts.DataDir == "" {
		opts.DataDir = t.TempDir()
	}
	gw, err := gateway.New(opts, reps...)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(gw)
	t.Cleanup(func() {
		ts.Close()
		gw.Close()
		for _, r := range reps {
			r.Close()
		}
	})
	return &testServer{Server: ts, gw: gw, eng: e}
}

// The real SDK (0.25.0) running scripts/sdk_vl_smoke.py against `skein serve --model <tiny VL>
// --record`: an ImageChunk training flow (protobuf forward_backward), an expected_tokens
// mismatch, and samples with an image in the prompt and without.
func TestReplayRecordedSDKImageTraffic(t *testing.T) {
	replayWith(t, "testdata/sdk-0.25.0-vl.jsonl", newVLServerWith(t, gateway.Options{}, false), "tml-sdk-smoke", idMap{})
}

// pngOf is a w×h PNG whose colour varies over the image (so every patch differs).
func pngOf(t *testing.T, w, h int, tint uint8) []byte {
	t.Helper()
	img := image.NewNRGBA(image.Rect(0, 0, w, h))
	for y := range h {
		for x := range w {
			img.Set(x, y, color.NRGBA{R: uint8(x * 4), G: uint8(y * 4), B: tint, A: 255})
		}
	}
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func imageChunk(b []byte) api.Chunk {
	return api.Chunk{Type: "image", Format: "png", Data: base64.StdEncoding.EncodeToString(b)}
}

// imageTokens is what the model's preprocessor makes of an image: its LM tokens.
func imageTokens(t *testing.T, b []byte) int {
	t.Helper()
	cfg, err := imageproc.LoadConfig(vlModelDir())
	if err != nil {
		t.Fatal(err)
	}
	info, err := imageproc.Inspect(b, "png", cfg, imageproc.DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	return info.Tokens
}

// vlDatum is text, the image, text; targets over the whole sequence (images included), with
// weight on the text after the image only.
func vlDatum(before []int, img api.Chunk, imgTokens int, after []int) api.Datum {
	n := len(before) + imgTokens + len(after)
	tg := make([]float64, n)
	w := make([]float64, n)
	for i := range after {
		pos := len(before) + imgTokens + i
		if i+1 < len(after) {
			tg[pos] = float64(after[i+1])
			w[pos] = 1
		}
	}
	return api.Datum{ModelInput: api.ModelInput{Chunks: []api.Chunk{
		{Type: "encoded_text", Tokens: before}, img, {Type: "encoded_text", Tokens: after}}},
		LossFnInputs: map[string]api.TensorData{
			"target_tokens": {Data: tg, DType: "int64", Shape: []int{n}},
			"weights":       {Data: w, DType: "float32", Shape: []int{n}},
		}}
}

func vlTraining(t *testing.T, url, key string) (*client.Client, *client.TrainingClient) {
	t.Helper()
	ctx := context.Background()
	c := client.New(url, key)
	sess, err := c.CreateSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tc, err := c.CreateLoraTrainingClient(ctx, sess, 0, vlBase, 8)
	if err != nil {
		t.Fatal(err)
	}
	return c, tc
}

func fbResult(t *testing.T, tc *client.TrainingClient, data []api.Datum, forwardOnly bool) (api.ForwardBackwardOutput, error) {
	t.Helper()
	ctx := context.Background()
	f, err := tc.ForwardBackward(ctx, data, "cross_entropy", nil, forwardOnly)
	if err != nil {
		return api.ForwardBackwardOutput{}, err
	}
	var out api.ForwardBackwardOutput
	err = f.Result(ctx, &out)
	return out, err
}

func TestVLTrainWithImageChunk(t *testing.T) {
	ts, e := newVLServer(t, gateway.Options{})
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
		os, err := tc.OptimStep(ctx, 2e-2)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Result(ctx, nil); err != nil {
			t.Fatal(err)
		}
	}
	if !(losses[len(losses)-1] < losses[0]*0.8) {
		t.Fatalf("loss did not fall: %v", losses)
	}
}

// The same image as an ImageChunk and as twinkle's pixel_values + image_grid_thw (with the pad
// tokens in model_input) gives the same logprobs; two images in one datum concatenate in order.
func TestVLImageChunkMatchesPixelValues(t *testing.T) {
	ts, e := newVLServer(t, gateway.Options{})
	_, tc := vlTraining(t, ts.URL, "tml-bob")
	a, b := pngOf(t, 64, 64, 10), pngOf(t, 96, 64, 250)
	na, nb := imageTokens(t, a), imageTokens(t, b)
	words := e.Tokenizer.Encode("two images here")
	chunked := vlDatum(words[:1], imageChunk(a), na, words[1:])
	chunked.ModelInput.Chunks = append(chunked.ModelInput.Chunks, imageChunk(b))
	nt := len(words) + na + nb
	for _, k := range []string{"target_tokens", "weights"} {
		td := chunked.LossFnInputs[k]
		td.Data = append(td.Data, make([]float64, nb)...)
		td.Shape = []int{nt}
		chunked.LossFnInputs[k] = td
	}

	cfg, _ := imageproc.LoadConfig(vlModelDir())
	pad := *e.Config.ImageTokenID
	var toks []int
	toks = append(toks, words[:1]...)
	var px, grid []float64
	for i, im := range [][]byte{a, b} {
		p, err := imageproc.Preprocess(im, "png", cfg, imageproc.DefaultLimits())
		if err != nil {
			t.Fatal(err)
		}
		for range p.Tokens {
			toks = append(toks, pad)
		}
		if i == 0 {
			toks = append(toks, words[1:]...)
		}
		for _, v := range p.PixelValues {
			px = append(px, float64(v))
		}
		grid = append(grid, float64(p.GridTHW[0]), float64(p.GridTHW[1]), float64(p.GridTHW[2]))
	}
	twinkle := api.Datum{ModelInput: api.ModelInput{Chunks: []api.Chunk{{Type: "encoded_text", Tokens: toks}}},
		LossFnInputs: map[string]api.TensorData{
			"target_tokens":  chunked.LossFnInputs["target_tokens"],
			"weights":        chunked.LossFnInputs["weights"],
			"pixel_values":   {Data: px, DType: "float32", Shape: []int{len(px) / cfg.PatchDim(), cfg.PatchDim()}},
			"image_grid_thw": {Data: grid, DType: "int64", Shape: []int{2, 3}},
		}}
	got, err := fbResult(t, tc, []api.Datum{chunked}, true)
	if err != nil {
		t.Fatal(err)
	}
	want, err := fbResult(t, tc, []api.Datum{twinkle}, true)
	if err != nil {
		t.Fatal(err)
	}
	g, w := got.LossFnOutputs[0]["logprobs"].Data, want.LossFnOutputs[0]["logprobs"].Data
	if len(g) != nt || len(w) != nt {
		t.Fatalf("logprobs: %d and %d, want %d", len(g), len(w), nt)
	}
	for i := range g {
		if math.Abs(g[i]-w[i]) > 1e-6 {
			t.Fatalf("position %d: image chunk %v, pixel_values %v", i, g[i], w[i])
		}
	}
	other := pngOf(t, 64, 64, 90) // another first image changes the text's logprobs after it
	chunked.ModelInput.Chunks[1] = imageChunk(other)
	diff, err := fbResult(t, tc, []api.Datum{chunked}, true)
	if err != nil {
		t.Fatal(err)
	}
	if slices.Equal(diff.LossFnOutputs[0]["logprobs"].Data, g) {
		t.Fatal("a different image gave the same logprobs")
	}
}

func TestVLSampleWithImage(t *testing.T) {
	ts, e := newVLServer(t, gateway.Options{})
	ctx := context.Background()
	c := client.New(ts.URL, "tml-carol")
	img := pngOf(t, 64, 64, 40)
	words := e.Tokenizer.Encode("describe")
	seven := 7
	type result struct {
		out api.SampleResponse
		err error
	}
	var wg sync.WaitGroup
	results := make([]result, 2)
	prompts := []api.ModelInput{
		{Chunks: []api.Chunk{{Type: "encoded_text", Tokens: words}, imageChunk(img)}},
		{Chunks: []api.Chunk{{Type: "encoded_text", Tokens: words}}},
	}
	for i, p := range prompts { // at once: the image prompt batches with the text-only one
		wg.Go(func() {
			f, err := c.Sample(ctx, api.SampleRequest{BaseModel: vlBase, Prompt: p, NumSamples: &seven,
				SamplingParams: api.SamplingParams{MaxTokens: &seven}, PromptLogprobs: true})
			if err == nil {
				err = f.Result(ctx, &results[i].out)
			}
			results[i].err = err
		})
	}
	wg.Wait()
	for i, r := range results {
		if r.err != nil {
			t.Fatalf("prompt %d: %v", i, r.err)
		}
		if len(r.out.Sequences) != 7 || len(r.out.Sequences[0].Tokens) == 0 {
			t.Fatalf("prompt %d: %+v", i, r.out.Sequences)
		}
	}
	if n := len(results[0].out.PromptLogprobs); n != len(words)+imageTokens(t, img) {
		t.Fatalf("%d prompt logprobs for %d text + %d image tokens", n, len(words), imageTokens(t, img))
	}
}

func TestVLBadImagesAre400AndChangeNothing(t *testing.T) {
	dir := t.TempDir()
	outside := t.TempDir()
	img := pngOf(t, 64, 64, 120)
	if err := os.WriteFile(filepath.Join(dir, "ok.png"), img, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(outside, "secret.png"), img, 0o644); err != nil {
		t.Fatal(err)
	}
	ts, e := newVLServer(t, gateway.Options{ImageDir: dir})
	ctx := context.Background()
	c, tc := vlTraining(t, ts.URL, "tml-dave")
	n := imageTokens(t, img)
	words := e.Tokenizer.Encode("a small test")
	good := vlDatum(words[:1], imageChunk(img), n, words[1:])
	before, err := fbResult(t, tc, []api.Datum{good}, true)
	if err != nil {
		t.Fatal(err)
	}

	wrong := n + 3
	mismatch := vlDatum(words[:1], imageChunk(img), n, words[1:])
	mismatch.ModelInput.Chunks[1].ExpectedTokens = &wrong
	_, err = fbResult(t, tc, []api.Datum{mismatch}, false)
	if !isStatus(err, 400) || !strings.Contains(err.Error(), "chunk 1") || !strings.Contains(err.Error(), "expected_tokens is "+strconv.Itoa(wrong)) || !strings.Contains(err.Error(), strconv.Itoa(n)+" tokens") {
		t.Fatalf("expected_tokens mismatch: %v, want a 400 naming chunk 1, %d and %d", err, wrong, n)
	}
	// Nothing changed: had the refused forward_backward accumulated a gradient, this step would
	// move the weights.
	if os, err := tc.OptimStep(ctx, 1e-1); err != nil {
		t.Fatal(err)
	} else if err := os.Result(ctx, nil); err != nil {
		t.Fatal(err)
	}
	after, err := fbResult(t, tc, []api.Datum{good}, true)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(before.LossFnOutputs[0]["logprobs"].Data, after.LossFnOutputs[0]["logprobs"].Data) {
		t.Fatal("a refused forward_backward changed the adapter")
	}

	// The SDK's protobuf has no image_asset_pointer chunk: the client sends these as JSON.
	pointer := func(loc string) api.Datum {
		return vlDatum(words[:1], api.Chunk{Type: "image_asset_pointer", Format: "png", Location: loc}, n, words[1:])
	}
	if _, err := fbResult(t, tc, []api.Datum{pointer("ok.png")}, true); err != nil {
		t.Fatalf("a file under --image-dir: %v", err)
	}
	uri := "data:image/png;base64," + base64.StdEncoding.EncodeToString(img)
	viaURI, err := fbResult(t, tc, []api.Datum{pointer(uri)}, true)
	if err != nil {
		t.Fatalf("a data: URI: %v", err)
	}
	if !slices.Equal(viaURI.LossFnOutputs[0]["logprobs"].Data, after.LossFnOutputs[0]["logprobs"].Data) {
		t.Fatal("the data: URI gave other logprobs than the same image's bytes")
	}
	for _, loc := range []string{filepath.Join(outside, "secret.png"), "../" + filepath.Base(outside) + "/secret.png", "https://example.com/a.png"} {
		if _, err := fbResult(t, tc, []api.Datum{pointer(loc)}, true); !isStatus(err, 400) {
			t.Errorf("image_asset_pointer %q: %v, want 400", loc, err)
		}
	}
	// Image chunks beside twinkle's pixel_values are ambiguous.
	both := vlDatum(words[:1], imageChunk(img), n, words[1:])
	both.LossFnInputs["image_grid_thw"] = api.TensorData{Data: []float64{1, 4, 4}, DType: "int64", Shape: []int{1, 3}}
	if _, err := fbResult(t, tc, []api.Datum{both}, true); !isStatus(err, 400) {
		t.Errorf("image chunk and image_grid_thw together: %v, want 400", err)
	}
	// An image in a sampling prompt with a mismatching expected_tokens is refused too.
	prompt := api.ModelInput{Chunks: []api.Chunk{{Type: "encoded_text", Tokens: words}, mismatch.ModelInput.Chunks[1]}}
	if _, err := c.Sample(ctx, api.SampleRequest{BaseModel: vlBase, Prompt: prompt}); !isStatus(err, 400) || !strings.Contains(err.Error(), "expected_tokens") {
		t.Errorf("sampling prompt with expected_tokens mismatch: %v, want 400", err)
	}
}

func TestImagesToTextModelAre400(t *testing.T) {
	ts, e := newVLServer(t, gateway.Options{})
	ctx := context.Background()
	c := client.New(ts.URL, "tml-erin")
	sess, _ := c.CreateSession(ctx)
	tc, err := c.CreateLoraTrainingClient(ctx, sess, 0, base, 4)
	if err != nil {
		t.Fatal(err)
	}
	img := pngOf(t, 64, 64, 1)
	words := e.Tokenizer.Encode("text model")
	d := vlDatum(words[:1], imageChunk(img), 4, words[1:])
	if _, err := fbResult(t, tc, []api.Datum{d}, true); !isStatus(err, 400) || !strings.Contains(err.Error(), "text models") {
		t.Errorf("image chunk to a text model's forward: %v", err)
	}
	prompt := api.ModelInput{Chunks: []api.Chunk{imageChunk(img)}}
	if _, err := c.Sample(ctx, api.SampleRequest{BaseModel: base, Prompt: prompt}); !isStatus(err, 400) || !strings.Contains(err.Error(), "text models") {
		t.Errorf("image chunk to a text model's sampler: %v", err)
	}
}

func TestCapabilitiesSayWhichModelsTakeImages(t *testing.T) {
	ts, _ := newVLServer(t, gateway.Options{})
	var caps api.ServerCapabilities
	if err := client.New(ts.URL, "tml-fay").Do(context.Background(), "GET", "get_server_capabilities", nil, &caps); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, m := range caps.SupportedModels {
		seen[m.ModelName] = m.TakesImages
	}
	if takes, ok := seen[vlBase]; !ok || !takes {
		t.Errorf("%s: takes_images %v (listed %v)", vlBase, takes, ok)
	}
	if takes, ok := seen[base]; !ok || takes {
		t.Errorf("%s: takes_images %v (listed %v)", base, takes, ok)
	}
}

// An image's pad tokens count in max_request_tokens, though the request carries only its bytes.
func TestVLImageTokensCountInRequestLimit(t *testing.T) {
	img := pngOf(t, 64, 96, 30)
	n := imageTokens(t, img)
	ts, e := newVLServer(t, gateway.Options{MaxRequestTokens: 8 + n - 1})
	_, tc := vlTraining(t, ts.URL, "tml-gus")
	words := e.Tokenizer.Encode("one two three four five six seven eight nine")[:8]
	if _, err := fbResult(t, tc, []api.Datum{datum(words, true)}, true); err != nil {
		t.Fatalf("text alone is within the limit: %v", err)
	}
	d := vlDatum(words[:2], imageChunk(img), n, words[2:])
	if _, err := fbResult(t, tc, []api.Datum{d}, true); !isStatus(err, 400) || !strings.Contains(err.Error(), "limit") {
		t.Fatalf("%d text + %d image tokens under a %d-token limit: %v, want 400", len(words), n, 8+n-1, err)
	}
}

// A VL model served only by remote workers: the gateway has no preprocessor config for it, so
// image chunks get a 400 that says so; twinkle's precomputed pixel_values still train there.
func TestVLImageChunksToWorkerServedModelAre400(t *testing.T) {
	e, err := engine.Load(vlModelDir(), engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	gw, err := gateway.New(gateway.Options{DataDir: t.TempDir(), AcceptWorkers: true, WorkerToken: clusterToken, WorkerTimeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(gw)
	t.Cleanup(func() { ts.Close(); gw.Close() })
	w := newTestWorker(t, e, t.TempDir())
	reg := worker.Registration{ID: "w", URL: w.URL, BaseModel: vlBase, MaxLoras: 4, Info: e.Info()}
	if code, reply := postWorker(t, ts.URL, "register", clusterToken, reg); code != http.StatusOK {
		t.Fatalf("registration: %d %v", code, reply)
	}
	_, tc := vlTraining(t, ts.URL, "tml-hal")
	img := pngOf(t, 64, 64, 77)
	n := imageTokens(t, img)
	words := e.Tokenizer.Encode("via a worker")
	if _, err := fbResult(t, tc, []api.Datum{vlDatum(words[:1], imageChunk(img), n, words[1:])}, true); !isStatus(err, 400) || !strings.Contains(err.Error(), "remote workers") {
		t.Fatalf("image chunk to a worker-served model: %v, want a 400 saying why", err)
	}
	cfg, _ := imageproc.LoadConfig(vlModelDir())
	p, err := imageproc.Preprocess(img, "png", cfg, imageproc.DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	toks := append([]int{}, words[:1]...)
	for range p.Tokens {
		toks = append(toks, *e.Config.ImageTokenID)
	}
	toks = append(toks, words[1:]...)
	px := make([]float64, len(p.PixelValues))
	for i, v := range p.PixelValues {
		px[i] = float64(v)
	}
	tw := vlDatum(nil, api.Chunk{Type: "encoded_text", Tokens: toks}, 0, nil)
	tw.LossFnInputs = map[string]api.TensorData{
		"target_tokens":  {Data: make([]float64, len(toks)), DType: "int64", Shape: []int{len(toks)}},
		"pixel_values":   {Data: px, DType: "float32", Shape: []int{p.Patches(), cfg.PatchDim()}},
		"image_grid_thw": {Data: []float64{float64(p.GridTHW[0]), float64(p.GridTHW[1]), float64(p.GridTHW[2])}, DType: "int64", Shape: []int{1, 3}},
	}
	if _, err := fbResult(t, tc, []api.Datum{tw}, true); err != nil {
		t.Fatalf("twinkle's pixel_values through a worker: %v", err)
	}
}

// A request's images, as image chunks or as twinkle's pixel_values, stay within
// max_request_pixel_values together.
func TestVLPixelValuesWithinRequestBudget(t *testing.T) {
	cfg, _ := imageproc.LoadConfig(vlModelDir())
	img := pngOf(t, 64, 64, 5)
	p, err := imageproc.Preprocess(img, "png", cfg, imageproc.DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	one := len(p.PixelValues)
	ts, e := newVLServer(t, gateway.Options{MaxRequestPixelValues: one + one/2}) // one image, not two
	_, tc := vlTraining(t, ts.URL, "tml-ida")
	words := e.Tokenizer.Encode("budget")
	d := vlDatum(words[:1], imageChunk(img), p.Tokens, words[1:])
	if _, err := fbResult(t, tc, []api.Datum{d}, true); err != nil {
		t.Fatalf("one image within the budget: %v", err)
	}
	if _, err := fbResult(t, tc, []api.Datum{d, d}, true); !isStatus(err, 400) || !strings.Contains(err.Error(), "pixel_values") {
		t.Fatalf("two image chunks over the budget: %v, want 400", err)
	}
	toks := append([]int{}, words...)
	for range p.Tokens {
		toks = append(toks, *e.Config.ImageTokenID)
	}
	px := make([]float64, one)
	for i, v := range p.PixelValues {
		px[i] = float64(v)
	}
	tw := api.Datum{ModelInput: api.ModelInput{Chunks: []api.Chunk{{Type: "encoded_text", Tokens: toks}}},
		LossFnInputs: map[string]api.TensorData{
			"target_tokens":  {Data: make([]float64, len(toks)), DType: "int64", Shape: []int{len(toks)}},
			"pixel_values":   {Data: px, DType: "float32", Shape: []int{p.Patches(), cfg.PatchDim()}},
			"image_grid_thw": {Data: []float64{1, float64(p.GridTHW[1]), float64(p.GridTHW[2])}, DType: "int64", Shape: []int{1, 3}},
		}}
	if _, err := fbResult(t, tc, []api.Datum{tw}, true); err != nil {
		t.Fatalf("twinkle's one image within the budget: %v", err)
	}
	for _, batch := range [][]api.Datum{{tw, tw}, {tw, d}} {
		if _, err := fbResult(t, tc, batch, true); !isStatus(err, 400) || !strings.Contains(err.Error(), "pixel_values") {
			t.Fatalf("%d datums' images over the budget: %v, want 400", len(batch), err)
		}
	}
}

// TestVLRepeatedImagePointersAreReadOnce (issue 19): one file named many times by a request is
// read and decoded once and counts once in the request's image bytes; distinct images past
// --max-request-image-bytes or --max-request-image-pixels are a 400 from their sizes and
// headers, and the run is unchanged.
func TestVLRepeatedImagePointersAreReadOnce(t *testing.T) {
	dir := t.TempDir()
	red, blue := pngOf(t, 64, 64, 10), pngOf(t, 64, 64, 200)
	for name, b := range map[string][]byte{"red.png": red, "blue.png": blue} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ts, e := newVLServer(t, gateway.Options{ImageDir: dir, MaxRequestImageBytes: len(red) * 3 / 2, MaxRequestImagePixels: 64 * 64 * 3 / 2})
	_, tc := vlTraining(t, ts.URL, "tml-rita")
	n := imageTokens(t, red)
	words := e.Tokenizer.Encode("repeat")
	pointer := func(loc string) api.Chunk {
		return api.Chunk{Type: "image_asset_pointer", Format: "png", Location: loc}
	}
	var data []api.Datum
	for range 20 {
		data = append(data, vlDatum(words[:1], pointer("red.png"), n, words[1:]))
	}
	if _, err := fbResult(t, tc, data, true); err != nil {
		t.Fatalf("one file 20 times within one image's budget: %v", err)
	}
	two := []api.Datum{vlDatum(words[:1], pointer("red.png"), n, words[1:]), vlDatum(words[:1], pointer("blue.png"), n, words[1:])}
	if _, err := fbResult(t, tc, two, true); !isStatus(err, 400) || !strings.Contains(err.Error(), "datum 1") || !strings.Contains(err.Error(), "max_request_image_bytes") {
		t.Fatalf("two files over the bytes budget: %v, want a 400 naming datum 1 and the limit", err)
	}
	ts2, _ := newVLServer(t, gateway.Options{ImageDir: dir, MaxRequestImagePixels: 64 * 64 * 3 / 2})
	_, tc2 := vlTraining(t, ts2.URL, "tml-rita")
	if _, err := fbResult(t, tc2, two, true); !isStatus(err, 400) || !strings.Contains(err.Error(), "max_request_image_pixels") {
		t.Fatalf("two images over the pixel budget: %v, want a 400 naming the limit", err)
	}
}

// TestVLInvalidRequestIsRefusedBeforeDecoding (issue 19): a request with an image and a
// target_tokens of the wrong length is refused for its length, not after decoding: the image
// here has a sound header and a truncated body, so a decode would have failed first.
func TestVLInvalidRequestIsRefusedBeforeDecoding(t *testing.T) {
	img := pngOf(t, 64, 64, 77)
	broken := img[:len(img)/2] // the header reads; the pixels do not
	ts, e := newVLServer(t, gateway.Options{})
	_, tc := vlTraining(t, ts.URL, "tml-vera")
	n := imageTokens(t, img)
	words := e.Tokenizer.Encode("too short")
	d := vlDatum(words[:1], imageChunk(broken), n, words[1:])
	tg := d.LossFnInputs["target_tokens"]
	tg.Data, tg.Shape = tg.Data[:len(tg.Data)-1], []int{len(tg.Data) - 1}
	d.LossFnInputs["target_tokens"] = tg
	_, err := fbResult(t, tc, []api.Datum{d}, true)
	if !isStatus(err, 400) || !strings.Contains(err.Error(), "target_tokens") {
		t.Fatalf("wrong target length with an undecodable image: %v, want a 400 about target_tokens", err)
	}
	// A sampling prompt likewise: its parameters are checked before its image is decoded.
	c := client.New(ts.URL, "tml-vera")
	topP := 7.0
	prompt := api.ModelInput{Chunks: []api.Chunk{{Type: "encoded_text", Tokens: words}, imageChunk(broken)}}
	if _, err := c.Sample(context.Background(), api.SampleRequest{BaseModel: vlBase, Prompt: prompt, SamplingParams: api.SamplingParams{TopP: &topP}}); !isStatus(err, 400) || !strings.Contains(err.Error(), "top_p") {
		t.Fatalf("top_p 7 with an undecodable image: %v, want a 400 about top_p", err)
	}
	// With the length right, the broken image is what is refused: still a 400.
	ok := vlDatum(words[:1], imageChunk(broken), n, words[1:])
	if _, err := fbResult(t, tc, []api.Datum{ok}, true); !isStatus(err, 400) || !strings.Contains(err.Error(), "not enough pixel data") {
		t.Fatalf("an image truncated after its header: %v, want a 400", err)
	}
}
