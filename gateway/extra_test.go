package gateway_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/client"
	"github.com/skein-ai/skein/gateway"
)

func trainedModel(t *testing.T, ts *testServer, key string) (*client.Client, *client.TrainingClient) {
	return newRun(t, ts.URL, key, 4)
}

// newRun opens a session for key at url and creates a LoRA training run of the given rank on it.
func newRun(t *testing.T, url, key string, rank int) (*client.Client, *client.TrainingClient) {
	t.Helper()
	ctx := context.Background()
	c := client.New(url, key)
	sess, err := c.CreateSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tc, err := c.CreateLoraTrainingClient(ctx, sess, 0, base, rank)
	if err != nil {
		t.Fatal(err)
	}
	return c, tc
}

// The archive endpoint hands out a signed URL that downloads the PEFT files without the key.
func TestCheckpointArchiveDownload(t *testing.T) {
	ts := newServer(t, gateway.Options{})
	ctx := context.Background()
	c, tc := trainedModel(t, ts, "tml-arch")
	f, _ := tc.SaveState(ctx, "a1")
	if err := f.Result(ctx, nil); err != nil {
		t.Fatal(err)
	}
	var u struct{ URL, Expires string }
	if err := c.Do(ctx, "GET", "training_runs/"+tc.ModelID+"/checkpoints/weights/a1/archive", nil, &u); err != nil || u.URL == "" {
		t.Fatalf("archive url: %v %+v", err, u)
	}
	resp, err := http.Get(u.URL) // no API key
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("download: %d", resp.StatusCode)
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
	want := []string{"adapter_config.json", "adapter_model.safetensors", "optimizer.safetensors", "trainer_state.json"}
	if strings.Join(names, ",") != strings.Join(want, ",") {
		t.Fatalf("archive holds %v, want %v", names, want)
	}
	bad := u.URL[:len(u.URL)-1] + "0"
	if strings.HasSuffix(u.URL, "0") {
		bad = u.URL[:len(u.URL)-1] + "1"
	}
	resp2, err := http.Get(bad)
	if err != nil {
		t.Fatal(err)
	}
	resp2.Body.Close()
	if resp2.StatusCode != http.StatusForbidden {
		t.Fatalf("tampered token: %d", resp2.StatusCode)
	}
}

// forward_backward bodies may come zstd-compressed (proto_compress_fwdbwd).
func TestZstdForwardBackward(t *testing.T) {
	ts := newServer(t, gateway.Options{})
	ctx := context.Background()
	c, tc := trainedModel(t, ts, "tml-zstd")
	ids := ts.eng.Tokenizer.Encode("Compressed bodies work too.")
	seq := 1
	raw := api.EncodeForwardBackwardRequest(&api.ForwardBackwardRequest{ModelID: tc.ModelID, SeqID: &seq,
		Input: api.ForwardBackwardInput{Data: []api.Datum{datum(ids, true)}, LossFn: "cross_entropy"}})
	enc, _ := zstd.NewWriter(nil)
	body := enc.EncodeAll(raw, nil)
	req, _ := http.NewRequest("POST", ts.URL+"/api/v1/forward_backward", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/x-protobuf")
	req.Header.Set("Content-Encoding", "zstd")
	req.Header.Set("X-API-Key", "tml-zstd")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var fut struct {
		RequestID string `json:"request_id"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&fut)
	resp.Body.Close()
	if resp.StatusCode != 200 || fut.RequestID == "" {
		t.Fatalf("zstd forward_backward: %d", resp.StatusCode)
	}
	var out api.ForwardBackwardOutput
	if err := c.Future(fut.RequestID).Result(ctx, &out); err != nil {
		t.Fatal(err)
	}
	if len(out.LossFnOutputs) != 1 || len(out.LossFnOutputs[0]["logprobs"].Data) != len(ids)-1 || out.Metrics["loss:sum"] <= 0 {
		t.Fatalf("zstd forward_backward result: %+v", out)
	}
}

// A future that cannot run yet (its seq_id waits for an earlier one) answers 408 try_again
// with a queue_state once the long-poll runs out, then the result once it can run.
func TestLongPollTimesOutWithTryAgain(t *testing.T) {
	ts := newServer(t, gateway.Options{LongPoll: 150 * time.Millisecond})
	ctx := context.Background()
	_, tc := trainedModel(t, ts, "tml-wait")
	ids := ts.eng.Tokenizer.Encode("Wait for it.")
	f2, err := tc.ForwardBackwardSeq(ctx, 2, []api.Datum{datum(ids, true)}, "cross_entropy", nil, true)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := json.Marshal(api.RetrieveFutureRequest{RequestID: f2.RequestID})
	req, _ := http.NewRequest("POST", ts.URL+"/api/v1/retrieve_future", bytes.NewReader(body))
	req.Header.Set("X-API-Key", "tml-wait")
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var ta api.TryAgain
	_ = json.NewDecoder(resp.Body).Decode(&ta)
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestTimeout || ta.Type != "try_again" || ta.QueueState == "" || time.Since(start) < 100*time.Millisecond {
		t.Fatalf("pending future: %d %+v after %v", resp.StatusCode, ta, time.Since(start))
	}
	f1, _ := tc.ForwardBackwardSeq(ctx, 1, []api.Datum{datum(ids, true)}, "cross_entropy", nil, true)
	var out api.ForwardBackwardOutput
	if err := f1.Result(ctx, &out); err != nil {
		t.Fatal(err)
	}
	if err := f2.Result(ctx, &out); err != nil {
		t.Fatal(err)
	}
}

// Concurrent sampling requests on one sampler (which the gateway batches; see
// TestSamplingBackPressure) each get their own request's answer, the same as when the requests
// come one at a time.
func TestConcurrentSamplesAreBatchedAndAnsweredEach(t *testing.T) {
	ts := newServer(t, gateway.Options{})
	ctx := context.Background()
	c := client.New(ts.URL, "tml-batch")
	sess, _ := c.CreateSession(ctx)
	sid, err := c.CreateSamplingSession(ctx, sess, base, "")
	if err != nil {
		t.Fatal(err)
	}
	sample := func(i int) api.SampleResponse {
		n, mt, seed := 1+i%3, 4+i%5, int64(100+i)
		f, err := c.Sample(ctx, api.SampleRequest{SamplingSessionID: sid, NumSamples: &n,
			Prompt:         api.ModelInput{Chunks: []api.Chunk{{Tokens: []int{1 + i, 2, 3 + i%4}}}},
			SamplingParams: api.SamplingParams{MaxTokens: &mt, Seed: &seed}})
		if err != nil {
			t.Error(err)
			return api.SampleResponse{}
		}
		var out api.SampleResponse
		if err := f.Result(ctx, &out); err != nil {
			t.Error(err)
		}
		return out
	}
	const n = 12
	together := make([]api.SampleResponse, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() { defer wg.Done(); together[i] = sample(i) }()
	}
	wg.Wait()
	for i := range n {
		alone := sample(i)
		if len(alone.Sequences) != 1+i%3 || len(together[i].Sequences) != len(alone.Sequences) {
			t.Fatalf("request %d: %d sequences together, %d alone", i, len(together[i].Sequences), len(alone.Sequences))
		}
		for j := range alone.Sequences {
			if fmt.Sprint(alone.Sequences[j].Tokens) != fmt.Sprint(together[i].Sequences[j].Tokens) {
				t.Fatalf("request %d sample %d: together %v, alone %v", i, j, together[i].Sequences[j].Tokens, alone.Sequences[j].Tokens)
			}
		}
	}
}

// Checkpoint TTLs, paged listings, sessions and unload_model.
func TestListingsTTLAndUnload(t *testing.T) {
	ts := newServer(t, gateway.Options{})
	ctx := context.Background()
	c := client.New(ts.URL, "tml-lists")
	sess, _ := c.CreateSession(ctx)
	var models []*client.TrainingClient
	for i := range 3 {
		tc, err := c.CreateLoraTrainingClient(ctx, sess, i, base, 2)
		if err != nil {
			t.Fatal(err)
		}
		models = append(models, tc)
	}
	var page struct {
		Runs   []api.TrainingRun `json:"training_runs"`
		Cursor api.Cursor        `json:"cursor"`
	}
	if err := c.Do(ctx, "GET", "training_runs?limit=2&offset=1", nil, &page); err != nil {
		t.Fatal(err)
	}
	if len(page.Runs) != 2 || page.Cursor.TotalCount != 3 || page.Runs[0].TrainingRunID != models[1].ModelID {
		t.Fatalf("page %+v", page)
	}
	if err := c.Do(ctx, "GET", "training_runs?limit=0", nil, nil); !isStatus(err, 400) {
		t.Fatalf("limit=0: %v", err)
	}
	var sessions struct {
		Sessions []string `json:"sessions"`
	}
	if err := c.Do(ctx, "GET", "sessions", nil, &sessions); err != nil || len(sessions.Sessions) != 1 || sessions.Sessions[0] != sess {
		t.Fatalf("sessions %v %+v", err, sessions)
	}
	var detail struct {
		Runs []string `json:"training_run_ids"`
	}
	if err := c.Do(ctx, "GET", "sessions/"+sess, nil, &detail); err != nil || len(detail.Runs) != 3 {
		t.Fatalf("session detail %v %+v", err, detail)
	}

	// TTL: set, read back, clear.
	f, _ := models[0].SaveState(ctx, "keep")
	if err := f.Result(ctx, nil); err != nil {
		t.Fatal(err)
	}
	ttlURL := "training_runs/" + models[0].ModelID + "/checkpoints/weights/keep/ttl"
	if err := c.Do(ctx, "PUT", ttlURL, map[string]any{"ttl_seconds": 3600}, nil); err != nil {
		t.Fatal(err)
	}
	var list struct {
		Checkpoints []api.Checkpoint `json:"checkpoints"`
	}
	_ = c.Do(ctx, "GET", "checkpoints", nil, &list)
	if len(list.Checkpoints) != 1 || list.Checkpoints[0].ExpiresAt == nil {
		t.Fatalf("after ttl: %+v", list)
	}
	if err := c.Do(ctx, "PUT", ttlURL, map[string]any{"ttl_seconds": nil}, nil); err != nil {
		t.Fatal(err)
	}
	_ = c.Do(ctx, "GET", "checkpoints", nil, &list)
	if list.Checkpoints[0].ExpiresAt != nil {
		t.Fatalf("ttl not cleared: %+v", list)
	}
	if err := c.Do(ctx, "PUT", ttlURL, map[string]any{"ttl_seconds": -5}, nil); !isStatus(err, 400) {
		t.Fatalf("negative ttl: %v", err)
	}

	// unload_model: the run's ops fail as the user's error afterwards.
	var unloaded struct {
		RequestID string `json:"request_id"`
	}
	if err := c.Do(ctx, "POST", "unload_model", map[string]string{"model_id": models[2].ModelID}, &unloaded); err != nil {
		t.Fatal(err)
	}
	if err := c.Future(unloaded.RequestID).Result(ctx, nil); err != nil {
		t.Fatal(err)
	}
	fb, _ := models[2].ForwardBackward(ctx, []api.Datum{datum([]int{1, 2, 3}, true)}, "cross_entropy", nil, false)
	var rf *client.RequestFailed
	if err := fb.Result(ctx, &api.ForwardBackwardOutput{}); !errors.As(err, &rf) || rf.Category != "user" {
		t.Fatalf("op after unload: %v", err)
	}
}
