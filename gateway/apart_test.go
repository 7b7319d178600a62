package gateway_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/client"
	"github.com/skein-ai/skein/engine"
	"github.com/skein-ai/skein/gateway"
	"github.com/skein-ai/skein/storage"
	"github.com/skein-ai/skein/worker"
)

// startApartGateways starts n gateways on one PostgreSQL and one object store, each with a data
// directory of its own, as pods with an emptyDir each: nothing one writes to its disk is seen by
// another.
func startApartGateways(t *testing.T, n int) []*pgGateway {
	bucket, err := storage.NewDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	shared := &remoteDir{Dir: bucket}
	return startPGGatewaysWith(t, n, func(o *gateway.Options) {
		o.DataDir = t.TempDir()
		o.Storage = shared
	})
}

// A checkpoint saved through one gateway is usable through another that has its own disk: a
// sampler over it, its weights_info, its GGUF download link (signed by one gateway, downloaded
// through either: the signing key is the cluster's), publishing it for another tenant and
// deleting it, each sent to the gateway that did not save it.
func TestACheckpointWorksThroughEveryGateway(t *testing.T) {
	gws := startApartGateways(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const tenant = "tml-apart"
	ca, cb := client.New(gws[0].ts.URL, tenant), client.New(gws[1].ts.URL, tenant)
	sess, err := ca.CreateSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	no := false // a LoRA on the tied head has no GGUF form
	tc, err := ca.CreateLoraTrainingClientConfig(ctx, sess, 0, base, api.LoraConfig{Rank: 4, TrainUnembed: &no})
	if err != nil {
		t.Fatal(err)
	}
	f, err := tc.SaveWeightsForSampler(ctx, "s1")
	if err != nil {
		t.Fatal(err)
	}
	var saved api.SaveWeightsForSamplerResponse
	if err := f.Result(ctx, &saved); err != nil {
		t.Fatal(err)
	}
	path := saved.Path

	// A sampler over it, made and sampled through B.
	smp, err := cb.CreateSamplingSession(ctx, sess, "", path)
	if err != nil {
		t.Fatalf("sampler over %s through the other gateway: %v", path, err)
	}
	n, maxTokens := 1, 4
	sf, err := cb.Sample(ctx, api.SampleRequest{SamplingSessionID: smp, NumSamples: &n,
		Prompt: api.ModelInput{Chunks: []api.Chunk{{Tokens: []int{1, 2, 3}}}}, SamplingParams: api.SamplingParams{MaxTokens: &maxTokens}})
	if err != nil {
		t.Fatal(err)
	}
	var so api.SampleResponse
	if err := sf.Result(ctx, &so); err != nil || len(so.Sequences) != 1 {
		t.Fatalf("sampling %s through the other gateway: %+v %v", path, so, err)
	}
	var info api.WeightsInfoResponse
	if err := cb.Do(ctx, "POST", "weights_info", api.WeightsInfoRequest{TinkerPath: path}, &info); err != nil || info.BaseModel != base || info.LoraRank != 4 {
		t.Fatalf("weights_info through the other gateway: %+v %v", info, err)
	}

	// A GGUF link asked of B, downloaded through A and through B.
	ckpt := "training_runs/" + tc.ModelID + "/checkpoints/sampler_weights/s1"
	var link api.ArchiveURLResponse
	if err := cb.Do(ctx, "GET", ckpt+"/archive?format=gguf", nil, &link); err != nil {
		t.Fatalf("archive link through the other gateway: %v", err)
	}
	i := strings.Index(link.URL, "/api/v1/archives/")
	if i < 0 {
		t.Fatalf("link %q is not a gateway's signed link", link.URL)
	}
	for gi, g := range gws {
		resp, err := http.Get(g.ts.URL + link.URL[i:])
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !bytes.HasPrefix(body, []byte("GGUF")) {
			t.Fatalf("downloading the link through gateway %d: %d %.200s", gi, resp.StatusCode, body)
		}
	}

	// Published through B, another tenant samples it through A; deleted through B, it is gone on both.
	if err := cb.Do(ctx, "POST", ckpt+"/publish", nil, nil); err != nil {
		t.Fatalf("publishing through the other gateway: %v", err)
	}
	other := client.New(gws[0].ts.URL, "tml-apart-other")
	osess, err := other.CreateSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.CreateSamplingSession(ctx, osess, "", path); err != nil {
		t.Fatalf("another tenant's sampler over the checkpoint published through the other gateway: %v", err)
	}
	if err := cb.Do(ctx, "DELETE", ckpt, nil, nil); err != nil {
		t.Fatalf("deleting through the other gateway: %v", err)
	}
	for gi, g := range gws {
		c := client.New(g.ts.URL, tenant)
		if _, err := c.CreateSamplingSession(ctx, sess, "", path); !isStatus(err, http.StatusNotFound) {
			t.Fatalf("gateway %d: a sampler over the deleted checkpoint: %v, want 404", gi, err)
		}
		var ck api.CheckpointsResponse
		if err := c.Do(ctx, "GET", "checkpoints", nil, &ck); err != nil || len(ck.Checkpoints) != 0 {
			t.Fatalf("gateway %d lists %+v (%v) after the delete", gi, ck.Checkpoints, err)
		}
	}
}

// workerOnlyGateway is a gateway with no replica and no model directory, on object storage,
// and a worker serving e as name over the same storage; it returns the gateway's URL and the
// storage (where a worker publishes its model's files).
func workerOnlyGateway(t *testing.T, e *engine.Engine, name string) (string, storage.Storage) {
	t.Helper()
	bucket, err := storage.NewDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	shared := &remoteDir{Dir: bucket}
	gw, err := gateway.New(gateway.Options{DataDir: t.TempDir(), Storage: shared, AcceptWorkers: true, WorkerToken: clusterToken, WorkerTimeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(gw)
	t.Cleanup(func() { ts.Close(); gw.Close() })
	dir := t.TempDir()
	ws := worker.NewServer(e.Fork(), clusterToken, dir)
	if err := ws.UseStorage(shared, filepath.Join(dir, "scratch")); err != nil {
		t.Fatal(err)
	}
	w := httptest.NewServer(ws)
	t.Cleanup(w.Close)
	reg := worker.Registration{ID: "w", URL: w.URL, BaseModel: name, MaxLoras: 4, Info: e.Info()}
	if code, reply := postWorker(t, ts.URL, "register", clusterToken, reg); code != http.StatusOK {
		t.Fatalf("registration: %d %v", code, reply)
	}
	return ts.URL, shared
}

// A gateway in front of workers, with no model of its own, serves the OpenAI endpoints once a
// worker published the model's tokenizer and chat template: the same greedy answer as the
// engine gives the template's tokens. Before that, a 400 that says what is missing.
func TestOpenAIThroughAGatewayWithoutTheModel(t *testing.T) {
	e, err := engine.Load(modelDir(), engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	url, shared := workerOnlyGateway(t, e, base)
	body := `{"model":"` + base + `","messages":[{"role":"user","content":"hello there"}],"temperature":0,"max_tokens":6}`
	if status, b := oai(t, "POST", url, "tml-a", "/v1/chat/completions", body); status != http.StatusBadRequest || !strings.Contains(string(b), "tokenizer.json") {
		t.Fatalf("chat before a worker published the tokenizer: %d %s, want a 400 naming tokenizer.json", status, b)
	}
	if err := worker.PublishModelFiles(context.Background(), shared, base, modelDir()); err != nil {
		t.Fatal(err)
	}
	c := oaiOK[api.ChatCompletion](t, url, "tml-a", "/v1/chat/completions", body)
	prompt := e.Tokenizer.Encode(chatPrompt("hello there"))
	ref, err := e.Sample("", engine.SampleRequest{Prompt: prompt, Params: engine.SampleParams{MaxTokens: 6}})
	if err != nil {
		t.Fatal(err)
	}
	q := ref.Sequences[0]
	answer := q.Tokens
	if q.StopReason == "stop" {
		answer = answer[:len(answer)-1]
	}
	if len(c.Choices) != 1 || c.Choices[0].Message == nil || c.Choices[0].Message.Content == nil {
		t.Fatalf("answer %+v", c)
	}
	// Bytes that are not whole UTF-8 characters are held back from the content, as in process.
	if want, got := e.Tokenizer.Decode(answer), *c.Choices[0].Message.Content; got != want && utf8.ValidString(want) || !utf8.ValidString(got) {
		t.Fatalf("content %q, want the engine's greedy %q", got, want)
	}
	if c.Usage == nil || c.Usage.PromptTokens != len(prompt) || c.Usage.CompletionTokens != len(q.Tokens) {
		t.Fatalf("usage %+v, want prompt %d completion %d (the template rendered as the model's)", c.Usage, len(prompt), len(q.Tokens))
	}
}

// Image chunks to a VL model served only by a worker: the gateway preprocesses them with the
// config the worker published, and the forward pass's loss equals the in-process server's for
// the same datum.
func TestVLImageChunksThroughAGatewayWithoutTheModel(t *testing.T) {
	e, err := engine.Load(vlModelDir(), engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	url, shared := workerOnlyGateway(t, e, vlBase)
	if err := worker.PublishModelFiles(context.Background(), shared, vlBase, vlModelDir()); err != nil {
		t.Fatal(err)
	}
	img := pngOf(t, 64, 64, 77)
	n := imageTokens(t, img)
	words := e.Tokenizer.Encode("via a worker")
	datum := vlDatum(words[:1], imageChunk(img), n, words[1:])
	_, tc := vlTraining(t, url, "tml-hal")
	got, err := fbResult(t, tc, []api.Datum{datum}, true)
	if err != nil {
		t.Fatalf("an image chunk through a gateway without the model: %v", err)
	}
	local, _ := newVLServer(t, gateway.Options{})
	_, ltc := vlTraining(t, local.URL, "tml-hal")
	want, err := fbResult(t, ltc, []api.Datum{datum}, true)
	if err != nil {
		t.Fatal(err)
	}
	if g, w := got.Metrics["loss:sum"], want.Metrics["loss:sum"]; g != w || g == 0 {
		t.Fatalf("loss through the worker %v, in process %v", g, w)
	}
}

// Sampling sessions made through one gateway sample through another (each gateway its own
// disk): a sampler over the base model, one over a named sampler checkpoint and the ephemeral
// one save_weights_for_sampler makes; get_sampler answers for each; another tenant's is a 404.
func TestSamplersWorkThroughEveryGateway(t *testing.T) {
	gws := startApartGateways(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const tenant = "tml-samplers"
	ca, cb := client.New(gws[0].ts.URL, tenant), client.New(gws[1].ts.URL, tenant)
	sess, err := ca.CreateSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tc, err := ca.CreateLoraTrainingClient(ctx, sess, 0, base, 4)
	if err != nil {
		t.Fatal(err)
	}
	onBase, err := ca.CreateSamplingSession(ctx, sess, base, "")
	if err != nil {
		t.Fatal(err)
	}
	f, err := tc.SaveWeightsForSampler(ctx, "named")
	if err != nil {
		t.Fatal(err)
	}
	var named api.SaveWeightsForSamplerResponse
	if err := f.Result(ctx, &named); err != nil {
		t.Fatal(err)
	}
	onCkpt, err := ca.CreateSamplingSession(ctx, sess, "", named.Path)
	if err != nil {
		t.Fatal(err)
	}
	if f, err = tc.SaveWeightsForSampler(ctx, ""); err != nil {
		t.Fatal(err)
	}
	var eph api.SaveWeightsForSamplerResponse
	if err := f.Result(ctx, &eph); err != nil || eph.SamplingSessionID == "" {
		t.Fatalf("ephemeral sampler: %+v %v", eph, err)
	}
	n, maxTokens := 2, 4
	for _, id := range []string{onBase, onCkpt, eph.SamplingSessionID} {
		sf, err := cb.Sample(ctx, api.SampleRequest{SamplingSessionID: id, NumSamples: &n,
			Prompt: api.ModelInput{Chunks: []api.Chunk{{Tokens: []int{1, 2, 3}}}}, SamplingParams: api.SamplingParams{MaxTokens: &maxTokens}})
		if err != nil {
			t.Fatalf("sampler %s through the other gateway: %v", id, err)
		}
		var so api.SampleResponse
		if err := sf.Result(ctx, &so); err != nil || len(so.Sequences) != n {
			t.Fatalf("sampler %s through the other gateway: %+v %v", id, so, err)
		}
		var info api.SamplerInfo
		if err := cb.Do(ctx, "GET", "samplers/"+id, nil, &info); err != nil || info.SamplerID != id || info.BaseModel != base {
			t.Fatalf("get_sampler %s through the other gateway: %+v %v", id, info, err)
		}
		other := client.New(gws[1].ts.URL, "tml-samplers-other")
		if _, err := other.Sample(ctx, api.SampleRequest{SamplingSessionID: id, NumSamples: &n,
			Prompt: api.ModelInput{Chunks: []api.Chunk{{Tokens: []int{1, 2, 3}}}}, SamplingParams: api.SamplingParams{MaxTokens: &maxTokens}}); !isStatus(err, http.StatusNotFound) {
			t.Fatalf("another tenant sampling %s: %v, want 404", id, err)
		}
	}
}

// A run trained through one gateway reads the same through another: get_training_run (its
// step and last checkpoint, from the gateway that holds it) and its metrics; another tenant's
// read is a 404 on both.
func TestARunReadsTheSameThroughEveryGateway(t *testing.T) {
	gws := startApartGateways(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const tenant = "tml-reads"
	ca, cb := client.New(gws[0].ts.URL, tenant), client.New(gws[1].ts.URL, tenant)
	_, tc := newRun(t, gws[0].ts.URL, tenant, 4)
	for range 2 {
		if _, err := lossStep(t, tc); err != nil {
			t.Fatal(err)
		}
	}
	f, err := tc.SaveState(ctx, "after-two")
	if err != nil {
		t.Fatal(err)
	}
	var saved api.SaveWeightsResponse
	if err := f.Result(ctx, &saved); err != nil {
		t.Fatal(err)
	}
	var want api.TrainingRun
	if err := ca.Do(ctx, "GET", "training_runs/"+tc.ModelID, nil, &want); err != nil {
		t.Fatal(err)
	}
	if want.LastCheckpoint == nil || want.LastCheckpoint.TinkerPath != saved.Path {
		t.Fatalf("the holder's view %+v, want last checkpoint %s", want, saved.Path)
	}
	var got api.TrainingRun
	if err := cb.Do(ctx, "GET", "training_runs/"+tc.ModelID, nil, &got); err != nil {
		t.Fatalf("get_training_run through the other gateway: %v", err)
	}
	if got.TrainingRunID != want.TrainingRunID || got.LastCheckpoint == nil || got.LastCheckpoint.TinkerPath != saved.Path ||
		got.LastRequestTime != want.LastRequestTime {
		t.Fatalf("through the other gateway %+v, through its holder %+v", got, want)
	}
	var metrics struct {
		Steps []map[string]any `json:"steps"`
	}
	if err := cb.Do(ctx, "GET", "training_runs/"+tc.ModelID+"/metrics", nil, &metrics); err != nil || len(metrics.Steps) != 2 {
		t.Fatalf("metrics through the other gateway: %d steps (%v), want 2", len(metrics.Steps), err)
	}
	for i, g := range gws {
		other := client.New(g.ts.URL, "tml-reads-other")
		if err := other.Do(ctx, "GET", "training_runs/"+tc.ModelID, nil, &got); !isStatus(err, http.StatusNotFound) {
			t.Fatalf("gateway %d: another tenant read the run: %v", i, err)
		}
	}
}
