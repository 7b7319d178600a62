package gateway_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"runtime"
	"strings"
	"testing"

	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/client"
)

// post sends a POST with the given headers, spelled exactly as given on the wire.
func post(t *testing.T, url, key, path string, headers map[string]string, body string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest("POST", url+"/api/v1/"+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-API-Key", key)
	for k, v := range headers {
		req.Header[k] = []string{v} // not canonicalised: the spelling under test goes out as is
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: %d %s", path, resp.StatusCode, b)
	}
	return resp, b
}

// submitSample sends one asample; its replica is chosen before it answers.
func submitSample(t *testing.T, url, key string, headers map[string]string, body string) string {
	t.Helper()
	_, b := post(t, url, key, "asample", headers, body)
	var fut struct {
		RequestID string `json:"request_id"`
	}
	if err := json.Unmarshal(b, &fut); err != nil || fut.RequestID == "" {
		t.Fatalf("asample answered %s", b)
	}
	return fut.RequestID
}

// awaitSample waits for a sample and returns the replica that ran it (X-Skein-Replica).
func awaitSample(t *testing.T, url, key, requestID string) string {
	t.Helper()
	resp, b := post(t, url, key, "retrieve_future", nil, `{"request_id":"`+requestID+`"}`)
	if !strings.Contains(string(b), `"sequences"`) {
		t.Fatalf("sample result %s", b)
	}
	return resp.Header.Get("X-Skein-Replica")
}

func sampleOn(t *testing.T, url, key string, headers map[string]string, body string) string {
	t.Helper()
	return awaitSample(t, url, key, submitSample(t, url, key, headers, body))
}

const tinySample = `{"base_model":"` + base + `","prompt":{"chunks":[{"type":"encoded_text","tokens":[1,2]}]},"sampling_params":{"max_tokens":1}}`

// The sticky routing header, in every spelling (hyphens or underscores, any case) of Ray Serve's
// Serve-Multiplexed-Model-Id and of X-Session-Id, routes one key to one replica through the
// router; different keys spread over the replicas.
func TestStickyRoutingHeaderSpellings(t *testing.T) {
	ts, _ := newCluster(t, 3, 2)
	spellings := []string{
		"Serve-Multiplexed-Model-Id", "serve-multiplexed-model-id", "SERVE-MULTIPLEXED-MODEL-ID",
		"serve_multiplexed_model_id", "Serve_Multiplexed_Model_Id", "SERVE_MULTIPLEXED-MODEL_ID",
		"X-Session-Id", "x-session-id", "X_SESSION_ID", "x_Session-iD",
	}
	used := map[string]bool{}
	for _, key := range []string{"alpha", "beta", "gamma", "delta", "epsilon", "zeta"} {
		want := sampleOn(t, ts.URL, "tml-sticky", map[string]string{"Serve-Multiplexed-Model-Id": key}, tinySample)
		used[want] = true
		for _, h := range spellings {
			if got := sampleOn(t, ts.URL, "tml-sticky", map[string]string{h: key}, tinySample); got != want {
				t.Errorf("key %q in header %q ran on %s; the same key ran on %s", key, h, got, want)
			}
		}
		// An empty header is no key: the request still runs.
		if got := sampleOn(t, ts.URL, "tml-sticky", map[string]string{"X-Session-Id": ""}, tinySample); got == "" {
			t.Error("no replica named for an unkeyed request")
		}
	}
	if len(used) < 2 {
		t.Fatalf("six keys all ran on %v: the header does not spread sessions", used)
	}
}

// A sampling session sending the header stays on its replica even while that replica is the
// busiest: the queue-depth scorer never moves it.
func TestSamplingSessionStaysOnOneReplica(t *testing.T) {
	ts, reps := newCluster(t, 2, 2)
	c := client.New(ts.URL, "tml-stay")
	sess, err := c.CreateSession(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	hdr := map[string]string{"X-Session-Id": "rl-run-7"}
	first := sampleOn(t, ts.URL, "tml-stay", hdr, tinySample)
	code, out := call(t, "POST", ts.URL+"/api/v1/create_sampling_session", map[string]string{"X-API-Key": "tml-stay", "X-Session-Id": "rl-run-7"},
		`{"session_id":"`+sess+`","sampling_session_seq_id":0,"base_model":"`+base+`"}`)
	if code != http.StatusOK {
		t.Fatalf("create_sampling_session: %d %v", code, out)
	}
	sampler, _ := out["sampling_session_id"].(string)
	withSession := `{"sampling_session_id":"` + sampler + `","prompt":{"chunks":[{"type":"encoded_text","tokens":[1,2]}]},"sampling_params":{"max_tokens":1}}`
	for i := range 6 {
		// Load the session's replica with blocked work, so the other has the shorter queue.
		block := make(chan struct{})
		for _, r := range reps {
			if r.ID() == first {
				for range i + 1 {
					_ = r.Run(func() { <-block })
				}
			}
		}
		ids := []string{submitSample(t, ts.URL, "tml-stay", hdr, withSession), submitSample(t, ts.URL, "tml-stay", hdr, tinySample)}
		close(block)
		for _, id := range ids {
			if got := awaitSample(t, ts.URL, "tml-stay", id); got != first {
				t.Fatalf("round %d: the session ran on %s, then on %s", i, first, got)
			}
		}
	}
}

// The fault: queue_depth said 1 while nine ops were queued. The replicas view counts what waits
// here for a replica (the op routed to it, the ops ordered behind it in the run's queue) besides
// what the replica runs, and names the adapters each replica holds.
func TestReplicasViewCountsQueuedOpsAndNamesAdapters(t *testing.T) {
	ts, reps := newCluster(t, 1, 2)
	ctx := context.Background()
	c, tc := newRun(t, ts.URL, "tml-depth", 2)
	block := make(chan struct{})
	_ = reps[0].Run(func() { <-block }) // the replica is busy: the run's ops queue up
	defer close(block)
	const ops = 9
	batch := []api.Datum{datum([]int{3, 14, 15, 92}, true)}
	for range ops {
		if _, err := tc.ForwardBackward(ctx, batch, "cross_entropy", nil, false); err != nil {
			t.Fatal(err)
		}
	}
	for reps[0].QueueDepth() < 2 { // the first op reached the replica, behind the blocker
		runtime.Gosched()
	}
	var view struct {
		Replicas []struct {
			ID         string         `json:"id"`
			QueueDepth int            `json:"queue_depth"`
			Queue      map[string]int `json:"queue"`
			Adapters   []string       `json:"adapters"`
		} `json:"replicas"`
	}
	if err := c.Do(ctx, "GET", "skein/replicas", nil, &view); err != nil || len(view.Replicas) != 1 {
		t.Fatalf("replicas: %v %+v", err, view)
	}
	r := view.Replicas[0]
	if want := ops + 1; r.QueueDepth != want { // the blocker and every op
		t.Fatalf("queue_depth %d (%v), want %d: the blocker and %d queued ops", r.QueueDepth, r.Queue, want, ops)
	}
	if len(r.Adapters) != 1 || r.Adapters[0] != tc.ModelID {
		t.Fatalf("adapters %v, want [%s]", r.Adapters, tc.ModelID)
	}
}

// The fault at gateway level, with real tiny replicas (two, one slot each): an idle adapter must
// not keep a replica while two active ones take turns on the other. After the idle one's
// eviction, each active adapter keeps a replica: no more evictions however many steps run.
func TestIdleAdapterGivesWayToActiveOnes(t *testing.T) {
	ts, reps := newCluster(t, 2, 1)
	ctx := context.Background()
	_, idle := newRun(t, ts.URL, "tml-idle", 2)
	_, a := newRun(t, ts.URL, "tml-a", 2)
	_, b := newRun(t, ts.URL, "tml-b", 2)
	batch := []api.Datum{datum([]int{3, 14, 15, 92}, true)}
	for range 4 {
		for _, tc := range []*client.TrainingClient{a, b} {
			f, err := tc.ForwardBackward(ctx, batch, "cross_entropy", nil, false)
			if err != nil {
				t.Fatal(err)
			}
			if err := f.Result(ctx, &api.ForwardBackwardOutput{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	resident := map[string]bool{}
	for _, r := range reps {
		for _, id := range r.AdapterIDs(context.Background()) {
			resident[id] = true
		}
	}
	if resident[idle.ModelID] || !resident[a.ModelID] || !resident[b.ModelID] {
		t.Fatalf("resident %v: want %s and %s, not the idle %s", resident, a.ModelID, b.ModelID, idle.ModelID)
	}
	resp, err := http.Get(ts.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	m, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(m), "skein_evictions_total 1\n") {
		t.Fatalf("want exactly one eviction (the idle adapter):\n%s", m)
	}
}

// Sampling counts every replica holding a sampler's weights in memory, not only the one the
// sampler was created on: when that one is down, the samples stay on the replica that loaded a
// copy instead of following the shortest queue and loading the weights again elsewhere.
func TestSamplingStaysWithAReplicaHoldingACopy(t *testing.T) {
	ts, reps := newCluster(t, 3, 2)
	ctx := context.Background()
	_, tc := newRun(t, ts.URL, "tml-copy", 2)
	f, err := tc.SaveWeightsForSampler(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	var out struct {
		ID string `json:"sampling_session_id"`
	}
	if err := f.Result(ctx, &out); err != nil {
		t.Fatal(err)
	}
	body := `{"sampling_session_id":"` + out.ID + `","prompt":{"chunks":[{"type":"encoded_text","tokens":[1,2]}]},"sampling_params":{"max_tokens":1}}`
	byID := map[string]int{}
	for i, r := range reps {
		byID[r.ID()] = i
	}
	created := sampleOn(t, ts.URL, "tml-copy", nil, body)
	reps[byID[created]].SetHealthy(false)
	copyOn := sampleOn(t, ts.URL, "tml-copy", nil, body) // loads a copy of the weights there
	if copyOn == created {
		t.Fatalf("sampled on %s, which is down", created)
	}
	for round := range 3 {
		block := make(chan struct{})
		for range 3 { // the copy's replica has the longest queue now
			_ = reps[byID[copyOn]].Run(func() { <-block })
		}
		id := submitSample(t, ts.URL, "tml-copy", nil, body)
		close(block)
		if got := awaitSample(t, ts.URL, "tml-copy", id); got != copyOn {
			t.Fatalf("round %d: sampled on %s, not on %s which holds a copy of the weights", round, got, copyOn)
		}
	}
}
