package gateway_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/client"
	"github.com/skein-ai/skein/engine"
	"github.com/skein-ai/skein/gateway"
	"github.com/skein-ai/skein/safetensors"
	"github.com/skein-ai/skein/store"
)

// crash stops a server without saving anything its replicas hold in memory, as a killed process
// would, and starts a new one on the same data directory; c is pointed at the new one.
func crash(t *testing.T, ts *testServer, data string, c *client.Client) *testServer {
	t.Helper()
	ts.Close()
	ts.gw.Close()
	next := newServer(t, gateway.Options{DataDir: data})
	c.BaseURL = next.URL
	return next
}

var durableBatch = []api.Datum{datum([]int{3, 14, 15, 92, 65, 35}, true)}

func optimStep(t *testing.T, tc *client.TrainingClient) (map[string]float64, error) {
	t.Helper()
	op, err := tc.OptimStep(context.Background(), 1e-2)
	if err != nil {
		t.Fatal(err)
	}
	var out struct {
		Metrics map[string]float64 `json:"metrics"`
	}
	err = op.Result(context.Background(), &out)
	return out.Metrics, err
}

func forwardBackward(t *testing.T, tc *client.TrainingClient, forwardOnly bool) (string, error) {
	t.Helper()
	f, err := tc.ForwardBackward(context.Background(), durableBatch, "cross_entropy", nil, forwardOnly)
	if err != nil {
		t.Fatal(err)
	}
	var out api.ForwardBackwardOutput
	if err := f.Result(context.Background(), &out); err != nil {
		return "", err
	}
	return fmt.Sprint(out.LossFnOutputs[0]["logprobs"].Data), nil
}

func mustForwardBackward(t *testing.T, tc *client.TrainingClient, forwardOnly bool) string {
	t.Helper()
	s, err := forwardBackward(t, tc, forwardOnly)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func trainOne(t *testing.T, tc *client.TrainingClient) float64 {
	t.Helper()
	mustForwardBackward(t, tc, false)
	m, err := optimStep(t, tc)
	if err != nil {
		t.Fatal(err)
	}
	return m["step:max"]
}

// A forward_backward whose result was acknowledged and whose gradients were then lost in a
// crash makes the next optim_step fail with a server error saying so (it used to succeed with
// grad_norm 0); after the client runs it again, the step goes on.
func TestLostGradientsFailTheNextStep(t *testing.T) {
	data := t.TempDir()
	ts := newServer(t, gateway.Options{DataDir: data})
	c, tc := trainedModel(t, ts, "tml-lost")
	trainOne(t, tc)
	mustForwardBackward(t, tc, false) // acknowledged: its result is stored
	crash(t, ts, data, c)
	_, err := optimStep(t, tc)
	var rf *client.RequestFailed
	if !errors.As(err, &rf) || rf.Category != "server" || !strings.Contains(rf.Message, "lost") {
		t.Fatalf("optim_step after losing acknowledged gradients: %v", err)
	}
	mustForwardBackward(t, tc, false)
	m, err := optimStep(t, tc)
	if err != nil {
		t.Fatalf("optim_step after running forward_backward again: %v", err)
	}
	if m["step:max"] != 2 || m["grad_norm:mean"] == 0 {
		t.Fatalf("step after the loss: %v", m)
	}
}

// Gradients saved with the adapter (it was evicted or unloaded) are not lost by a crash.
func TestSavedGradientsSurviveACrash(t *testing.T) {
	data := t.TempDir()
	ts, _ := newClusterWith(t, 1, 1, gateway.Options{DataDir: data})
	c, a := trainedModel(t, ts, "tml-saved")
	trainOne(t, a)
	mustForwardBackward(t, a, false)
	// B takes the only slot: A is saved with its pending gradients and evicted.
	sess, _ := c.CreateSession(context.Background())
	b, err := c.CreateLoraTrainingClient(context.Background(), sess, 0, base, 4)
	if err != nil {
		t.Fatal(err)
	}
	mustForwardBackward(t, b, true)
	crash(t, ts, data, c)
	m, err := optimStep(t, a)
	if err != nil || m["step:max"] != 2 || m["grad_norm:mean"] == 0 {
		t.Fatalf("optim_step over gradients saved before the crash: %v %v", m, err)
	}
}

// currentState is the directory holding a run's saved state, in either layout.
func currentState(t *testing.T, data, runID string) string {
	t.Helper()
	name := strings.ReplaceAll(runID, ":", "_")
	if b, err := os.ReadFile(filepath.Join(data, "state", name+".current")); err == nil {
		first, _, _ := strings.Cut(string(b), "\n") // the version; then the write's nonce
		return filepath.Join(data, "state", strings.TrimSpace(first))
	}
	return filepath.Join(data, "state", name)
}

// A crash inside the older save (between its two renames) left the state in an .old-* directory
// and training restarted from the seed; it is recovered at start now, and what interrupted saves
// left behind is removed.
func TestInterruptedSaveIsRecoveredAtStart(t *testing.T) {
	data := t.TempDir()
	ts := newServer(t, gateway.Options{DataDir: data})
	c, tc := trainedModel(t, ts, "tml-window")
	trainOne(t, tc)
	trainOne(t, tc)
	before := mustForwardBackward(t, tc, true)
	ts.Close()
	ts.gw.Close()
	name := strings.ReplaceAll(tc.ModelID, ":", "_")
	root := filepath.Join(data, "state")
	if err := os.Rename(currentState(t, data, tc.ModelID), filepath.Join(root, name+".old-1a2b")); err != nil {
		t.Fatal(err)
	}
	os.Remove(filepath.Join(root, name+".current"))
	for _, junk := range []string{name + ".partial-9f9f", name + "@00000000000000ff-dead"} {
		if err := os.MkdirAll(filepath.Join(root, junk), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, name+".current.tmp-0101"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	next := newServer(t, gateway.Options{DataDir: data})
	c.BaseURL = next.URL
	if got := mustForwardBackward(t, tc, true); got != before {
		t.Fatal("the adapter after recovery differs from the one before the crash")
	}
	if s := trainOne(t, tc); s != 3 {
		t.Fatalf("step after recovery %v, want 3", s)
	}
	entries, _ := os.ReadDir(root)
	var left []string
	for _, e := range entries {
		left = append(left, e.Name())
	}
	if len(left) != 2 || !strings.HasSuffix(left[0], ".current") && !strings.HasSuffix(left[1], ".current") {
		t.Fatalf("state directory holds %v, want one pointer and one version", left)
	}
}

// A run that has stepped but whose saved state is gone is an error, never a silent restart
// from the seed.
func TestMissingStateIsNotASilentRestart(t *testing.T) {
	data := t.TempDir()
	ts := newServer(t, gateway.Options{DataDir: data})
	c, tc := trainedModel(t, ts, "tml-gone")
	trainOne(t, tc)
	ts.Close()
	ts.gw.Close()
	if err := os.RemoveAll(currentState(t, data, tc.ModelID)); err != nil {
		t.Fatal(err)
	}
	next := newServer(t, gateway.Options{DataDir: data})
	c.BaseURL = next.URL
	_, err := forwardBackward(t, tc, true)
	var rf *client.RequestFailed
	if !errors.As(err, &rf) || !strings.Contains(rf.Message, "saved training state") {
		t.Fatalf("forward over a lost state: %v", err)
	}
}

// A saved state with valid framing but wrong shapes fails that run's requests with an error;
// the server and other runs go on (it used to panic at the next step, on every reload).
func TestCorruptSavedStateFailsOnlyItsRun(t *testing.T) {
	data := t.TempDir()
	ts := newServer(t, gateway.Options{DataDir: data})
	c, bad := trainedModel(t, ts, "tml-corrupt")
	trainOne(t, bad)
	ts.Close()
	ts.gw.Close()
	path := filepath.Join(currentState(t, data, bad.ModelID), engine.OptimizerFile)
	f, err := safetensors.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for name := range f.Tensors {
		f.Tensors[name] = safetensors.FromFloat64([]float64{1}, 1)
	}
	if err := safetensors.WriteFile(path, f.Tensors, nil); err != nil {
		t.Fatal(err)
	}
	next := newServer(t, gateway.Options{DataDir: data})
	c.BaseURL = next.URL
	for range 2 {
		if _, err := forwardBackward(t, bad, false); err == nil {
			t.Fatal("a corrupt saved state loaded")
		}
	}
	_, good := trainedModel(t, next, "tml-corrupt-other")
	if s := trainOne(t, good); s != 1 {
		t.Fatalf("another run's step: %v", s)
	}
}

// A data directory holding saved states and checkpoints whose state.db is missing or empty is
// refused with a message saying what to do (it used to start fresh, forgetting them all).
func TestMissingStateDBIsRefused(t *testing.T) {
	data := t.TempDir()
	ts := newServer(t, gateway.Options{DataDir: data})
	_, tc := trainedModel(t, ts, "tml-nodb")
	trainOne(t, tc)
	sf, _ := tc.SaveState(context.Background(), "kept")
	if err := sf.Result(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	ts.Close()
	ts.gw.Close()
	for _, f := range []string{"state.db", "state.db-wal", "state.db-shm"} {
		os.Remove(filepath.Join(data, f))
	}
	for _, empty := range []bool{false, true} {
		if empty {
			if err := os.WriteFile(filepath.Join(data, "state.db"), nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		gw, err := gateway.New(gateway.Options{DataDir: data})
		if err == nil {
			gw.Close()
			t.Fatalf("started over saved runs with no state.db (empty file: %v)", empty)
		}
		if !strings.Contains(err.Error(), "state.db") || !strings.Contains(err.Error(), "move") {
			t.Fatalf("refusal does not say what to do: %v", err)
		}
	}
}

// A gateway that dies after an optim_step's state was saved, but before it recorded the step
// in the run's row, leaves a row one step behind with the consumed forward_backwards still
// listed: on reload, the saved state's step (in gradients.json) says they were consumed, so
// the next step goes on from the saved one instead of failing with a false "lost" (which would
// make the client run them, and apply them, twice) (issue 40 item 4).
func TestAStepSavedButNotRecordedIsNotReportedLost(t *testing.T) {
	ctx := context.Background()
	data := t.TempDir()
	ts := newServer(t, gateway.Options{DataDir: data})
	c, tc := trainedModel(t, ts, "tml-window")
	trainOne(t, tc)
	fb, err := tc.ForwardBackward(ctx, durableBatch, "cross_entropy", nil, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := fb.Result(ctx, &api.ForwardBackwardOutput{}); err != nil {
		t.Fatal(err)
	}
	if m, err := optimStep(t, tc); err != nil || m["step:max"] != 2 {
		t.Fatalf("second step: %v %v", m, err)
	}
	ts.Close()
	ts.gw.Close()
	// The row as the gateway had written it before the step's save: step 1, fb pending.
	st, err := store.OpenSQLite(filepath.Join(data, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	runs, err := st.Runs(ctx)
	if err != nil || len(runs) != 1 {
		t.Fatalf("runs %v %v", runs, err)
	}
	var d map[string]any
	if err := json.Unmarshal(runs[0].Data, &d); err != nil {
		t.Fatal(err)
	}
	d["step"], d["pending_forward_backwards"] = 1, []string{fb.RequestID}
	runs[0].Data, _ = json.Marshal(d)
	if err := st.PutRun(ctx, runs[0]); err != nil {
		t.Fatal(err)
	}
	st.Close()
	next := newServer(t, gateway.Options{DataDir: data})
	c.BaseURL = next.URL
	mustForwardBackward(t, tc, false)
	m, err := optimStep(t, tc)
	if err != nil || m["step:max"] != 3 || m["grad_norm:mean"] == 0 {
		t.Fatalf("step after a restart that found the saved state a step ahead of the row: %v %v", m, err)
	}
}
