package gateway_test

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/client"
	"github.com/skein-ai/skein/engine"
	"github.com/skein-ai/skein/gateway"
	"github.com/skein-ai/skein/replica"
	"github.com/skein-ai/skein/storage"
	"github.com/skein-ai/skein/storage/storagetest"
	"github.com/skein-ai/skein/worker"
)

// s3Gateway is a gateway over a fresh prefix of the test bucket (skipped without SKEIN_TEST_S3),
// with one in-process replica of the tiny model of one LoRA slot: its server, the storage, the
// gateway's data directory and the engine.
func s3Gateway(t *testing.T) (*httptest.Server, storage.Storage, string, *engine.Engine) {
	t.Helper()
	st := storagetest.S3(t)
	data := t.TempDir()
	e, err := engine.Load(modelDir(), engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	stored, err := replica.NewStored(e, st, data, filepath.Join(data, "scratch"))
	if err != nil {
		t.Fatal(err)
	}
	rep := replica.New("r0", base, stored, 1)
	gw, err := gateway.New(gateway.Options{DataDir: data, Storage: st}, rep)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(gw)
	t.Cleanup(func() { ts.Close(); gw.Close(); rep.Close() })
	return ts, st, data, e
}

// With --storage s3://…, adapter state, checkpoints and sampler weights live in the bucket and
// nowhere on the gateway's disk: training survives an eviction through S3 with the same numbers,
// a checkpoint loads back into a new model, its archive is a presigned URL of the bucket that
// downloads without credentials, and a deleted checkpoint's objects are gone.
func TestObjectStorageEndToEnd(t *testing.T) {
	ts, st, data, _ := s3Gateway(t)
	ctx := context.Background()
	c := client.New(ts.URL, "tml-s3")
	sess, _ := c.CreateSession(ctx)
	a, err := c.CreateLoraTrainingClient(ctx, sess, 0, base, 4)
	if err != nil {
		t.Fatal(err)
	}
	batch := []api.Datum{datum([]int{3, 14, 15, 92, 65, 35}, true)}
	step := func(tc *client.TrainingClient) {
		t.Helper()
		fb, _ := tc.ForwardBackward(ctx, batch, "cross_entropy", nil, false)
		op, _ := tc.OptimStep(ctx, 1e-2)
		if err := fb.Result(ctx, &api.ForwardBackwardOutput{}); err != nil {
			t.Fatal(err)
		}
		if err := op.Result(ctx, &map[string]any{}); err != nil {
			t.Fatal(err)
		}
	}
	forward := func(tc *client.TrainingClient) string {
		t.Helper()
		f, _ := tc.ForwardBackward(ctx, batch, "cross_entropy", nil, true)
		var out api.ForwardBackwardOutput
		if err := f.Result(ctx, &out); err != nil {
			t.Fatal(err)
		}
		return fmt.Sprint(out.LossFnOutputs[0]["logprobs"].Data)
	}
	step(a)
	step(a)
	before := forward(a)
	// B takes the only slot: A is saved to S3 and evicted, then reloaded from S3.
	b, err := c.CreateLoraTrainingClient(ctx, sess, 1, base, 4)
	if err != nil {
		t.Fatal(err)
	}
	step(b)
	if got := forward(a); got != before {
		t.Fatalf("adapter A changed across its eviction through S3:\n%s\n%s", got, before)
	}
	keys := func(prefix string) []string {
		objs, err := st.List(ctx, prefix, 1000)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, o := range objs {
			out = append(out, o.Key)
		}
		sort.Strings(out)
		return out
	}
	runKey := strings.ReplaceAll(a.ModelID, ":", "_")
	state := keys("state/" + runKey)
	if len(state) == 0 || state[0] != "state/"+runKey+".current" || !containsSuffix(state, "/"+engine.OptimizerFile) {
		t.Fatalf("A's state in the bucket: %v", state)
	}
	// An ephemeral sampler's snapshot goes to the bucket and samples from there.
	sf, err := a.SaveWeightsForSampler(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	var smp struct {
		SamplingSessionID string `json:"sampling_session_id"`
	}
	if err := sf.Result(ctx, &smp); err != nil || smp.SamplingSessionID == "" {
		t.Fatalf("ephemeral save: %v %+v", err, smp)
	}
	if eph := keys("ephemeral/"); !containsSuffix(eph, "/"+engine.AdapterWeightsFile) {
		t.Fatalf("ephemeral weights in the bucket: %v", eph)
	}
	n, mt, seed := 2, 3, int64(1)
	sampleFut, err := c.Sample(ctx, api.SampleRequest{SamplingSessionID: smp.SamplingSessionID, NumSamples: &n,
		Prompt:         api.ModelInput{Chunks: []api.Chunk{{Type: "encoded_text", Tokens: []int{3, 14, 15}}}},
		SamplingParams: api.SamplingParams{MaxTokens: &mt, Seed: &seed}})
	if err != nil {
		t.Fatal(err)
	}
	var sres api.SampleResponse
	if err := sampleFut.Result(ctx, &sres); err != nil || len(sres.Sequences) != n {
		t.Fatalf("sampling the ephemeral weights: %v, %d sequences", err, len(sres.Sequences))
	}
	// A checkpoint, loaded back into a new model, gives A's numbers.
	fut, err := a.SaveState(ctx, "ck1")
	if err != nil {
		t.Fatal(err)
	}
	var saved api.SaveWeightsResponse
	if err := fut.Result(ctx, &saved); err != nil {
		t.Fatal(err)
	}
	ck := keys("checkpoints/")
	if !containsSuffix(ck, "/"+engine.AdapterWeightsFile) {
		t.Fatalf("checkpoint objects: %v", ck)
	}
	d, err := c.CreateLoraTrainingClient(ctx, sess, 2, base, 4)
	if err != nil {
		t.Fatal(err)
	}
	lf, _ := d.LoadState(ctx, saved.Path, true)
	if err := lf.Result(ctx, &map[string]any{}); err != nil {
		t.Fatal(err)
	}
	if got := forward(d); got != before {
		t.Fatal("the checkpoint loaded from S3 does not give A's numbers")
	}
	// The archive link is the bucket's presigned URL: no key, no gateway.
	var arch api.ArchiveURLResponse
	if err := c.Do(ctx, "GET", "training_runs/"+a.ModelID+"/checkpoints/weights/ck1/archive", nil, &arch); err != nil {
		t.Fatal(err)
	}
	endpoint := storagetest.Endpoint(t)
	if !strings.HasPrefix(arch.URL, endpoint+"/") || !strings.Contains(arch.URL, "X-Amz-Signature=") || !strings.Contains(arch.URL, "X-Amz-Expires=900") {
		t.Fatalf("archive URL %q is not a 15-minute presigned URL of %s", arch.URL, endpoint)
	}
	resp, err := http.Get(arch.URL)
	if err != nil {
		t.Fatal(err)
	}
	names := tarNames(t, resp)
	if strings.Join(names, ",") != "adapter_config.json,adapter_model.safetensors,optimizer.safetensors,trainer_state.json" {
		t.Fatalf("archive holds %v", names)
	}
	// Nothing of it is on the gateway's disk.
	for _, dir := range []string{"state", "checkpoints", "ephemeral", "scratch"} {
		if entries, err := os.ReadDir(filepath.Join(data, dir)); err == nil && len(entries) > 0 {
			t.Fatalf("the data directory's %s holds %d entries with object storage", dir, len(entries))
		}
	}
	// Deleting the checkpoint removes its objects, archive included: the link stops working.
	if err := c.Do(ctx, "DELETE", "training_runs/"+a.ModelID+"/checkpoints/weights/ck1", nil, nil); err != nil {
		t.Fatal(err)
	}
	if left := keys("checkpoints/"); len(left) != 0 {
		t.Fatalf("objects left after the delete: %v", left)
	}
	resp, err = http.Get(arch.URL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("the deleted checkpoint's link answered %d", resp.StatusCode)
	}
}

func containsSuffix(keys []string, suffix string) bool {
	for _, k := range keys {
		if strings.HasSuffix(k, suffix) {
			return true
		}
	}
	return false
}

func tarNames(t *testing.T, resp *http.Response) []string {
	t.Helper()
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("archive download: %d %s", resp.StatusCode, b)
	}
	gz, err := gzip.NewReader(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(gz)
	var names []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
	}
	sort.Strings(names)
	return names
}

// lossStep runs forward_backward and optim_step and returns the forward_backward's loss.
func lossStep(t *testing.T, tc *client.TrainingClient) (float64, error) {
	t.Helper()
	ctx := context.Background()
	batch := []api.Datum{datum([]int{10, 20, 30, 40, 50, 60, 70}, true)}
	fb, err := tc.ForwardBackward(ctx, batch, "cross_entropy", nil, false)
	if err != nil {
		t.Fatal(err)
	}
	op, err := tc.OptimStep(ctx, 1e-2)
	if err != nil {
		t.Fatal(err)
	}
	var out api.ForwardBackwardOutput
	fbErr := fb.Result(ctx, &out)
	err = op.Result(ctx, &map[string]any{})
	if fbErr != nil {
		return 0, fbErr
	}
	return out.Metrics["loss:sum"], err
}

// Workers with their own data directories (nothing shared with the gateway or each other but
// the bucket): the worker holding an adapter is lost after two steps, and steps 3 and 4 run on
// the other from the state the first saved in S3, with the losses of an uninterrupted run.
func TestWorkersShareOnlyTheBucket(t *testing.T) {
	url := storagetest.URL(t)
	endpoint := storagetest.Endpoint(t)
	open := func() storage.Storage {
		st, err := storage.NewS3(context.Background(), url, storage.S3Options{Endpoint: endpoint})
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	e, err := engine.Load(modelDir(), engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	gwData := t.TempDir()
	gw, err := gateway.New(gateway.Options{DataDir: gwData, Storage: open(), AcceptWorkers: true, WorkerToken: clusterToken, WorkerTimeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(gw)
	t.Cleanup(func() { ts.Close(); gw.Close() })
	newWorker := func() (*httptest.Server, string) {
		dir := t.TempDir()
		ws := worker.NewServer(e.Fork(), clusterToken, dir)
		if err := ws.UseStorage(open(), filepath.Join(dir, "scratch")); err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(ws)
		t.Cleanup(srv.Close)
		return srv, dir
	}
	a, aData := newWorker()
	b, bData := newWorker()
	if code, _ := postWorker(t, ts.URL, "register", clusterToken, registration("a", a.URL, e)); code != http.StatusOK {
		t.Fatal("register a")
	}
	_, tc := newRun(t, ts.URL, "tml-bucket", 4)
	var losses []float64
	for range 2 {
		l, err := lossStep(t, tc)
		if err != nil {
			t.Fatal(err)
		}
		losses = append(losses, l)
	}
	if code, _ := postWorker(t, ts.URL, "register", clusterToken, registration("b", b.URL, e)); code != http.StatusOK {
		t.Fatal("register b")
	}
	a.Close() // lost without a word
	for range 2 {
		l, err := lossStep(t, tc)
		if err != nil {
			t.Fatalf("step %d after the worker was lost: %v", len(losses)+1, err)
		}
		losses = append(losses, l)
	}
	// The same four steps on one in-process replica.
	ref := newServer(t, gateway.Options{})
	_, rc := newRun(t, ref.URL, "tml-bucket", 4)
	for i := range 4 {
		l, err := lossStep(t, rc)
		if err != nil {
			t.Fatal(err)
		}
		if l != losses[i] {
			t.Fatalf("step %d: loss %v across the lost worker, %v uninterrupted (all: %v)", i+1, losses[i], l, losses)
		}
	}
	if losses[3] >= losses[0] {
		t.Fatalf("losses %v do not fall: the test would not see a lost step", losses)
	}
	// The gateway has no model directory: the tokenizer it serves is the one a worker published.
	var tok struct {
		ModelName     string          `json:"model_name"`
		TokenizerJSON json.RawMessage `json:"tokenizer_json"`
	}
	if err := client.New(ts.URL, "tml-bucket").Do(context.Background(), "GET", "models/"+base+"/tokenizer", nil, &tok); err == nil {
		t.Fatal("a tokenizer was served before any worker published one")
	}
	if err := worker.PublishModelFiles(context.Background(), open(), base, modelDir()); err != nil {
		t.Fatal(err)
	}
	if err := client.New(ts.URL, "tml-bucket").Do(context.Background(), "GET", "models/"+base+"/tokenizer", nil, &tok); err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(filepath.Join(modelDir(), "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	var served, file any
	if json.Unmarshal(tok.TokenizerJSON, &served) != nil || json.Unmarshal(want, &file) != nil || fmt.Sprint(served) != fmt.Sprint(file) || tok.ModelName != base {
		t.Fatalf("served tokenizer of %q differs from the model's tokenizer.json", tok.ModelName)
	}
	// No one's disk holds adapter files: only the bucket does.
	for _, dir := range []string{gwData, aData, bData} {
		for _, sub := range []string{"state", "checkpoints"} {
			if entries, err := os.ReadDir(filepath.Join(dir, sub)); err == nil && len(entries) > 0 {
				t.Fatalf("%s/%s holds %d entries", dir, sub, len(entries))
			}
		}
	}
}

// At start, state versions in the bucket that no pointer names (a save that died before its
// swap, a stale replica's refused one) are removed; the current one stays and training goes on.
func TestObjectStorageTidiesOrphanVersions(t *testing.T) {
	st := storagetest.S3(t)
	data := t.TempDir()
	e, err := engine.Load(modelDir(), engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	start := func() (*httptest.Server, func()) {
		stored, err := replica.NewStored(e.Fork(), st, data, filepath.Join(data, "scratch"))
		if err != nil {
			t.Fatal(err)
		}
		rep := replica.New("r0", base, stored, 2)
		gw, err := gateway.New(gateway.Options{DataDir: data, Storage: st}, rep)
		if err != nil {
			t.Fatal(err)
		}
		ts := httptest.NewServer(gw)
		return ts, func() { ts.Close(); gw.Close(); rep.Close() }
	}
	ts, stop := start()
	c, tc := newRun(t, ts.URL, "tml-tidy", 4)
	if s, err := step(t, tc); err != nil || s != 1 {
		t.Fatalf("step 1: %v %v", s, err)
	}
	stop()
	ctx := context.Background()
	run := strings.ReplaceAll(tc.ModelID, ":", "_")
	current, _, err := storage.ReadPointer(ctx, st, "state/"+run+".current")
	if err != nil {
		t.Fatal(err)
	}
	orphan := "state/" + run + "@00000000000000ff-dead/adapter_config.json"
	if _, err := st.Put(ctx, orphan, strings.NewReader("{}"), storage.Cond{}); err != nil {
		t.Fatal(err)
	}
	// A new state database over the same bucket is refused: it would forget the run in it.
	if _, err := gateway.New(gateway.Options{DataDir: t.TempDir(), Storage: st}); err == nil || !strings.Contains(err.Error(), "state/") {
		t.Fatalf("a gateway with an empty state store over a bucket with state started: %v", err)
	}
	ts, stop = start()
	defer stop()
	if _, err := st.Head(ctx, orphan); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("the orphan version is still there: %v", err)
	}
	if _, err := st.Head(ctx, "state/"+current+"/"+engine.AdapterConfigFile); err != nil {
		t.Fatalf("the current version went: %v", err)
	}
	c.BaseURL = ts.URL
	if s, err := step(t, tc); err != nil || s != 2 {
		t.Fatalf("step 2 after the restart: %v %v", s, err)
	}
}
