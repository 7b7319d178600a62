package gateway_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/client"
	"github.com/skein-ai/skein/gateway"
	"github.com/skein-ai/skein/store"
)

func await(t *testing.T, f *client.Future, err error, out any) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Result(context.Background(), out); err != nil {
		t.Fatal(err)
	}
}

type runsPage struct {
	Runs   []api.TrainingRun `json:"training_runs"`
	Cursor api.Cursor        `json:"cursor"`
}

func runIDs(p runsPage) []string {
	var out []string
	for _, r := range p.Runs {
		out = append(out, r.TrainingRunID)
	}
	return out
}

// A session moves into a project with its runs; list_training_runs(project_id=…) lists only
// them; runs created later in the session join it; another tenant cannot move the session.
func TestSessionProjectsFilterRuns(t *testing.T) {
	ts := newServer(t, gateway.Options{})
	ctx := context.Background()
	c, inProject := newRun(t, ts.URL, "tml-proj", 2)
	_, elsewhere := newRun(t, ts.URL, "tml-proj", 2)
	sess := strings.Split(inProject.ModelID, ":")[0]
	if err := c.Do(ctx, "PUT", "sessions/"+sess+"/project", api.AssignProjectRequest{ProjectID: "p1"}, nil); err != nil {
		t.Fatal(err)
	}
	later, err := c.CreateLoraTrainingClient(ctx, sess, 1, base, 2)
	if err != nil {
		t.Fatal(err)
	}
	var p runsPage
	if err := c.Do(ctx, "GET", "training_runs?project_id=p1", nil, &p); err != nil {
		t.Fatal(err)
	}
	if got := runIDs(p); len(got) != 2 || got[0] != inProject.ModelID || got[1] != later.ModelID || p.Cursor.TotalCount != 2 || p.Runs[0].ProjectID != "p1" {
		t.Fatalf("runs of p1: %v %+v", got, p.Cursor)
	}
	if err := c.Do(ctx, "GET", "training_runs", nil, &p); err != nil || len(p.Runs) != 3 {
		t.Fatalf("all runs: %v %v", err, runIDs(p))
	}
	if err := c.Do(ctx, "GET", "training_runs?project_id=other", nil, &p); err != nil || len(p.Runs) != 0 {
		t.Fatalf("runs of another project: %v %v", err, runIDs(p))
	}
	_ = elsewhere
	if err := c.Do(ctx, "PUT", "sessions/"+sess+"/project", api.AssignProjectRequest{}, nil); !isStatus(err, 400) {
		t.Fatalf("empty project_id: %v", err)
	}
	if err := c.Do(ctx, "PUT", "sessions/"+sess+"/project", api.AssignProjectRequest{ProjectID: "a b"}, nil); !isStatus(err, 400) {
		t.Fatalf("bad project_id: %v", err)
	}
	mallory := client.New(ts.URL, "tml-mallory")
	if err := mallory.Do(ctx, "PUT", "sessions/"+sess+"/project", api.AssignProjectRequest{ProjectID: "x"}, nil); !isStatus(err, 404) {
		t.Fatalf("another tenant's session: %v", err)
	}
	if err := mallory.Do(ctx, "GET", "training_runs?project_id=p1", nil, &p); err != nil || len(p.Runs) != 0 {
		t.Fatalf("another tenant sees %v (%v)", runIDs(p), err)
	}
}

// access_scope=accessible adds other tenants' runs with a published checkpoint, and only those.
func TestAccessibleScopeListsPublishedRuns(t *testing.T) {
	ts := newServer(t, gateway.Options{})
	ctx := context.Background()
	alice, own := newRun(t, ts.URL, "tml-alice", 2)
	bob, published := newRun(t, ts.URL, "tml-bob", 2)
	_, private := newRun(t, ts.URL, "tml-bob", 2)
	for _, tc := range []*client.TrainingClient{published, private} {
		f, err := tc.SaveState(ctx, "w")
		await(t, f, err, nil)
	}
	if err := bob.Do(ctx, "POST", "training_runs/"+published.ModelID+"/checkpoints/weights/w/publish", nil, nil); err != nil {
		t.Fatal(err)
	}
	var p runsPage
	if err := alice.Do(ctx, "GET", "training_runs?access_scope=accessible", nil, &p); err != nil {
		t.Fatal(err)
	}
	if got := runIDs(p); len(got) != 2 || !contains(got, own.ModelID) || !contains(got, published.ModelID) {
		t.Fatalf("accessible: %v", got)
	}
	if err := alice.Do(ctx, "GET", "training_runs?access_scope=owned", nil, &p); err != nil || len(p.Runs) != 1 {
		t.Fatalf("owned: %v %v", err, runIDs(p))
	}
	var run api.TrainingRun
	if err := alice.Do(ctx, "GET", "training_runs/"+published.ModelID+"?access_scope=accessible", nil, &run); err != nil || run.TrainingRunID != published.ModelID {
		t.Fatalf("get accessible: %v %+v", err, run)
	}
	if err := alice.Do(ctx, "GET", "training_runs/"+private.ModelID+"?access_scope=accessible", nil, &run); !isStatus(err, 404) {
		t.Fatalf("get unpublished: %v", err)
	}
	if err := alice.Do(ctx, "GET", "training_runs?access_scope=everything", nil, &p); !isStatus(err, 400) {
		t.Fatalf("bad scope: %v", err)
	}
}

func contains(xs []string, x string) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}

// last_checkpoint names the newest checkpoint still there: deleting the newest falls back to
// the one before, and user_metadata given at create time comes back.
func TestLastCheckpointFallsBackAndMetadata(t *testing.T) {
	ts := newServer(t, gateway.Options{})
	ctx := context.Background()
	c := client.New(ts.URL, "tml-last")
	sess, _ := c.CreateSession(ctx)
	var created struct {
		RequestID string `json:"request_id"`
		ModelID   string `json:"model_id"`
	}
	if err := c.Do(ctx, "POST", "create_model", api.CreateModelRequest{SessionID: sess, BaseModel: base,
		UserMetadata: map[string]any{"experiment": "e7"}, LoraConfig: &api.LoraConfig{Rank: 2}}, &created); err != nil {
		t.Fatal(err)
	}
	await(t, c.Future(created.RequestID), nil, nil)
	model := created.ModelID
	for _, name := range []string{"first", "second"} {
		var saved struct {
			RequestID string `json:"request_id"`
		}
		err := c.Do(ctx, "POST", "save_weights", api.SaveWeightsRequest{ModelID: model, Path: name}, &saved)
		await(t, c.Future(saved.RequestID), err, nil)
		time.Sleep(2 * time.Millisecond) // distinct creation times
	}
	var run api.TrainingRun
	get := func() {
		t.Helper()
		if err := c.Do(ctx, "GET", "training_runs/"+model, nil, &run); err != nil {
			t.Fatal(err)
		}
	}
	get()
	if run.LastCheckpoint == nil || run.LastCheckpoint.CheckpointID != "weights/second" || run.UserMetadata["experiment"] != "e7" {
		t.Fatalf("run %+v", run)
	}
	if err := c.Do(ctx, "DELETE", "training_runs/"+model+"/checkpoints/weights/second", nil, nil); err != nil {
		t.Fatal(err)
	}
	get()
	if run.LastCheckpoint == nil || run.LastCheckpoint.CheckpointID != "weights/first" {
		t.Fatalf("after deleting the newest: %+v", run.LastCheckpoint)
	}
}

// Loading a checkpoint that does not exist is a 404, as the REST calls answer for it.
func TestLoadMissingCheckpointIs404(t *testing.T) {
	ts := newServer(t, gateway.Options{})
	ctx := context.Background()
	c, tc := newRun(t, ts.URL, "tml-load", 2)
	missing := "tinker://" + tc.ModelID + "/weights/nope"
	if _, err := tc.LoadState(ctx, missing, false); !isStatus(err, 404) {
		t.Fatalf("load_state of a missing checkpoint: %v", err)
	}
	if err := c.Do(ctx, "POST", "weights_info", map[string]string{"tinker_path": missing}, nil); !isStatus(err, 404) {
		t.Fatalf("weights_info of a missing checkpoint: %v", err)
	}
}

// top_p=0 is greedy, as top_k=1 and temperature 0: every seed gives the same tokens.
func TestTopPZeroIsGreedy(t *testing.T) {
	ts := newServer(t, gateway.Options{})
	ctx := context.Background()
	c := client.New(ts.URL, "tml-topp")
	sample := func(temp, topP float64, seed int64) []int {
		t.Helper()
		n := 6
		f, err := c.Sample(ctx, api.SampleRequest{BaseModel: base, Prompt: api.ModelInput{Chunks: []api.Chunk{{Type: "encoded_text", Tokens: []int{5, 6, 7}}}},
			SamplingParams: api.SamplingParams{MaxTokens: &n, Temperature: &temp, TopP: &topP, Seed: &seed}})
		var res api.SampleResponse
		await(t, f, err, &res)
		return res.Sequences[0].Tokens
	}
	greedy := sample(0, 1, 1)
	differs := false
	for seed := range int64(4) {
		if got := sample(1, 0, seed); !slices.Equal(got, greedy) {
			t.Fatalf("top_p=0 seed %d: %v, greedy %v", seed, got, greedy)
		}
		if !slices.Equal(sample(1.5, 1, seed), greedy) {
			differs = true
		}
	}
	if !differs {
		t.Fatal("plain sampling was greedy for every seed: the test cannot tell top_p=0 apart")
	}
}

// forward with loss_fn_config.disable_lora gives the base model's logprobs on a trained run;
// forward_backward refuses it.
func TestForwardDisableLora(t *testing.T) {
	ts := newServer(t, gateway.Options{})
	ctx := context.Background()
	_, tc := newRun(t, ts.URL, "tml-ref", 4)
	_, fresh := newRun(t, ts.URL, "tml-ref2", 4) // a new LoRA is the base model (B = 0)
	ids := ts.eng.Tokenizer.Encode("The quick brown fox jumps over the lazy dog.")
	data := []api.Datum{datum(ids, true)}
	for range 3 {
		f, err := tc.ForwardBackward(ctx, data, "cross_entropy", nil, false)
		await(t, f, err, nil)
		o, err := tc.OptimStep(ctx, 2e-2)
		await(t, o, err, nil)
	}
	forward := func(tc *client.TrainingClient, cfg map[string]float64) []float64 {
		t.Helper()
		f, err := tc.ForwardBackward(ctx, data, "cross_entropy", cfg, true)
		var out api.ForwardBackwardOutput
		await(t, f, err, &out)
		return out.LossFnOutputs[0]["logprobs"].Data
	}
	baseLP := forward(fresh, nil)
	ref := forward(tc, map[string]float64{"disable_lora": 1})
	tuned := forward(tc, nil)
	for i := range baseLP {
		if d := ref[i] - baseLP[i]; d > 1e-6 || d < -1e-6 {
			t.Fatalf("position %d: disable_lora logprob %v, base model %v", i, ref[i], baseLP[i])
		}
	}
	if slices.Equal(ref, tuned) {
		t.Fatal("the trained adapter gives the base model's logprobs: the test cannot tell them apart")
	}
	if !slices.Equal(forward(tc, map[string]float64{"disable_lora": 0}), tuned) {
		t.Fatal("disable_lora=0 is not the adapter's forward")
	}
	if _, err := tc.ForwardBackward(ctx, data, "cross_entropy", map[string]float64{"disable_lora": 1}, false); !isStatus(err, 400) {
		t.Fatalf("forward_backward with disable_lora: %v", err)
	}
	if _, err := tc.ForwardBackward(ctx, data, "cross_entropy", map[string]float64{"disable_lora": 0.5}, true); !isStatus(err, 400) {
		t.Fatalf("disable_lora=0.5: %v", err)
	}
}

// The audit log says who did what to which run and checkpoint, to that tenant only.
func TestAuditLog(t *testing.T) {
	ts := newServer(t, gateway.Options{})
	ctx := context.Background()
	c, tc := newRun(t, ts.URL, "tml-audit", 2)
	f, err := tc.SaveState(ctx, "a1")
	await(t, f, err, nil)
	ckpt := "training_runs/" + tc.ModelID + "/checkpoints/weights/a1"
	if err := c.Do(ctx, "POST", ckpt+"/publish", nil, nil); err != nil {
		t.Fatal(err)
	}
	if err := c.Do(ctx, "DELETE", ckpt, nil, nil); err != nil {
		t.Fatal(err)
	}
	var log api.AuditLogResponse
	if err := c.Do(ctx, "GET", "audit", nil, &log); err != nil {
		t.Fatal(err)
	}
	var events []string
	for _, e := range log.Entries {
		events = append(events, e.Event)
		if e.Actor == "" || e.ModelID != tc.ModelID {
			t.Fatalf("entry %+v", e)
		}
	}
	want := []string{"training_run.create", "checkpoint.save", "checkpoint.publish", "checkpoint.delete"}
	if strings.Join(events, ",") != strings.Join(want, ",") {
		t.Fatalf("events %v, want %v", events, want)
	}
	if log.Entries[1].TinkerPath != "tinker://"+tc.ModelID+"/weights/a1" {
		t.Fatalf("save entry %+v", log.Entries[1])
	}
	if err := c.Do(ctx, "GET", "audit?event_type=checkpoints", nil, &log); err != nil || len(log.Entries) != 3 {
		t.Fatalf("checkpoint events: %v %+v", err, log)
	}
	if err := c.Do(ctx, "GET", "audit?day=2001-01-01", nil, &log); err != nil || len(log.Entries) != 0 {
		t.Fatalf("another day: %v %+v", err, log)
	}
	other := client.New(ts.URL, "tml-other")
	if err := other.Do(ctx, "GET", "audit", nil, &log); err != nil || len(log.Entries) != 0 {
		t.Fatalf("another tenant reads %+v (%v)", log, err)
	}
	for _, q := range []string{"audit?day=yesterday", "audit?event_type=keys"} {
		if err := c.Do(ctx, "GET", q, nil, nil); !isStatus(err, 400) {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

// Billing usage counts the tokens trained and sampled and the checkpoints saved, per tenant, in
// hourly buckets, and refuses windows the SDK documents as invalid.
func TestBillingUsage(t *testing.T) {
	ts := newServer(t, gateway.Options{})
	ctx := context.Background()
	c, tc := newRun(t, ts.URL, "tml-bill", 2)
	ids := []int{3, 4, 5, 6, 7, 8}
	for range 2 {
		f, err := tc.ForwardBackward(ctx, []api.Datum{datum(ids, true)}, "cross_entropy", nil, false)
		await(t, f, err, nil)
	}
	f, err := tc.SaveState(ctx, "b1")
	await(t, f, err, nil)
	n := 4
	sf, err := c.Sample(ctx, api.SampleRequest{BaseModel: base, Prompt: api.ModelInput{Chunks: []api.Chunk{{Type: "encoded_text", Tokens: []int{1, 2, 3}}}},
		SamplingParams: api.SamplingParams{MaxTokens: &n}})
	var sres api.SampleResponse
	await(t, sf, err, &sres)

	hour := time.Now().UTC().Truncate(time.Hour)
	window := func(from, to time.Time) string {
		return "billing/usage/events?starting_on=" + url.QueryEscape(from.Format(time.RFC3339)) + "&ending_before=" + url.QueryEscape(to.Format(time.RFC3339))
	}
	var usage api.BillingUsageResponse
	if err := c.Do(ctx, "GET", window(hour.Add(-time.Hour), hour.Add(time.Hour)), nil, &usage); err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, e := range usage.Data {
		switch info := e.EventInfo; info.Type {
		case "training", "sampling_prefill", "sampling_sample":
			got[info.Type] += *info.TokenCount
		case "checkpoint":
			got[info.Type] += *info.Count
		case "storage":
			if *info.GigabyteHours <= 0 {
				t.Fatalf("storage %+v", e)
			}
			got[info.Type]++
		}
		if e.UserID == nil {
			t.Fatalf("event without a user: %+v", e)
		}
	}
	want := map[string]int64{"training": 2 * int64(len(ids)-1), "checkpoint": 1, "sampling_prefill": 3,
		"sampling_sample": int64(len(sres.Sequences[0].Tokens)), "storage": 1}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("%s: %d, want %d (all: %v)", k, got[k], v, got)
		}
	}
	other := client.New(ts.URL, "tml-notme")
	if err := other.Do(ctx, "GET", window(hour.Add(-time.Hour), hour.Add(time.Hour)), nil, &usage); err != nil || len(usage.Data) != 0 {
		t.Fatalf("another tenant sees %+v (%v)", usage, err)
	}
	for name, q := range map[string]string{
		"not on the hour": window(hour.Add(time.Minute), hour.Add(time.Hour)),
		"empty":           window(hour, hour),
		"15 days":         window(hour.Add(-15*24*time.Hour), hour),
		"future":          window(hour.Add(2*time.Hour), hour.Add(3*time.Hour)),
		"missing":         "billing/usage/events",
	} {
		if err := c.Do(ctx, "GET", q, nil, nil); !isStatus(err, 400) {
			t.Fatalf("%s: %v", name, err)
		}
	}
}

// A session's trace downloads from a signed URL without the key, with its requests; another
// tenant cannot export it, and a forged token is refused.
func TestSessionTraceExport(t *testing.T) {
	ts := newServer(t, gateway.Options{})
	ctx := context.Background()
	c, tc := newRun(t, ts.URL, "tml-trace", 2)
	f, err := tc.ForwardBackward(ctx, []api.Datum{datum([]int{1, 2, 3, 4}, true)}, "cross_entropy", nil, false)
	await(t, f, err, nil)
	sess := strings.Split(tc.ModelID, ":")[0]
	var exp api.TraceExportResponse
	if err := c.Do(ctx, "GET", "sessions/"+sess+"/trace_export", nil, &exp); err != nil || exp.Status != "ready" || exp.URL == "" {
		t.Fatalf("export %v %+v", err, exp)
	}
	resp, err := http.Get(exp.URL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var trace struct {
		TraceEvents []struct {
			Name string `json:"name"`
			Ph   string `json:"ph"`
			Tid  string `json:"tid"`
			Dur  int64  `json:"dur"`
		} `json:"traceEvents"`
	}
	if resp.StatusCode != 200 || json.Unmarshal(body, &trace) != nil || len(trace.TraceEvents) != 1 {
		t.Fatalf("trace %d %s", resp.StatusCode, body)
	}
	if e := trace.TraceEvents[0]; e.Name != "ForwardBackward" || e.Ph != "X" || e.Tid != tc.ModelID || e.Dur <= 0 {
		t.Fatalf("event %+v", e)
	}
	if err := client.New(ts.URL, "tml-spy").Do(ctx, "GET", "sessions/"+sess+"/trace_export", nil, nil); !isStatus(err, 404) {
		t.Fatalf("another tenant's session: %v", err)
	}
	forged := exp.URL[:len(exp.URL)-4] + "0000"
	if resp, err := http.Get(forged); err != nil || resp.StatusCode != 403 {
		t.Fatalf("forged token: %v %v", err, resp)
	}
}

// Projects and the audit log are in the state store: a restarted gateway (here a second one on
// the same store) still filters by the project and still has the log.
func TestProjectsAndAuditSurviveRestart(t *testing.T) {
	dir := t.TempDir()
	st, err := store.OpenSQLite(filepath.Join(dir, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ts := newServer(t, gateway.Options{DataDir: dir, Store: st})
	ctx := context.Background()
	c, tc := newRun(t, ts.URL, "tml-restart", 2)
	sess := strings.Split(tc.ModelID, ":")[0]
	if err := c.Do(ctx, "PUT", "sessions/"+sess+"/project", api.AssignProjectRequest{ProjectID: "kept"}, nil); err != nil {
		t.Fatal(err)
	}
	ts.gw.Close()
	again := client.New(newServer(t, gateway.Options{DataDir: dir, Store: st}).URL, "tml-restart")
	var p runsPage
	if err := again.Do(ctx, "GET", "training_runs?project_id=kept", nil, &p); err != nil || len(p.Runs) != 1 || p.Runs[0].TrainingRunID != tc.ModelID {
		t.Fatalf("after restart: %v %v", err, runIDs(p))
	}
	var log api.AuditLogResponse
	if err := again.Do(ctx, "GET", "audit", nil, &log); err != nil || len(log.Entries) != 2 || log.Entries[1].Event != "session.assign_project" {
		t.Fatalf("audit after restart: %v %+v", err, log)
	}
}
