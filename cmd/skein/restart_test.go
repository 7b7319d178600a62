package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/client"
)

// TestMain lets this test binary act as `skein` itself, so the restart test runs a real server
// process without building one.
func TestMain(m *testing.M) {
	if os.Getenv("SKEIN_TEST_RUN_AS_SKEIN") == "1" {
		if hold := os.Getenv("SKEIN_TEST_HOLD_LOAD"); hold != "" {
			// The load waits for the test to create this file (TestServeAnswersLoadingWhileTheModelLoads).
			beforeLoad = func() {
				for _, err := os.Stat(hold); err != nil; _, err = os.Stat(hold) {
					time.Sleep(20 * time.Millisecond)
				}
			}
		}
		if err := run(os.Args[1:]); err != nil {
			reportError(err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// startSkein runs this test binary as `skein ARGS…`, logging into logDir; it is killed at cleanup.
func startSkein(t *testing.T, logDir string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "SKEIN_TEST_RUN_AS_SKEIN=1")
	logf, _ := os.Create(filepath.Join(logDir, fmt.Sprintf("%s-%d.log", args[0], time.Now().UnixNano())))
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _, _ = cmd.Process.Wait() })
	return cmd
}

// waitHealthy waits for a gateway to answer.
func waitHealthy(t *testing.T, addr string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if resp, err := http.Get("http://" + addr + "/api/v1/healthz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK { // 503 while the model loads
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal("server did not come up")
}

func startServe(t *testing.T, data, addr string) *exec.Cmd {
	t.Helper()
	cmd := startSkein(t, data, "serve", "--data", data, "--addr", addr)
	waitHealthy(t, addr)
	return cmd
}

func freeAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// trainStep runs forward_backward and optim_step (submitted together, as the cookbook does) and
// returns the optimizer's step count.
func trainStep(t *testing.T, ctx context.Context, tc *client.TrainingClient, batch []api.Datum) float64 {
	t.Helper()
	fb, err := tc.ForwardBackward(ctx, batch, "cross_entropy", nil, false)
	if err != nil {
		t.Fatal(err)
	}
	op, err := tc.OptimStep(ctx, 1e-2)
	if err != nil {
		t.Fatal(err)
	}
	if err := fb.Result(ctx, &api.ForwardBackwardOutput{}); err != nil {
		t.Fatal(err)
	}
	var out struct {
		Metrics map[string]float64 `json:"metrics"`
	}
	if err := op.Result(ctx, &out); err != nil {
		t.Fatal(err)
	}
	return out.Metrics["step:max"]
}

func datum(ids []int) api.Datum {
	n := len(ids) - 1
	tg, w := make([]float64, n), make([]float64, n)
	for i := range n {
		tg[i], w[i] = float64(ids[i+1]), 1
	}
	return api.Datum{ModelInput: api.ModelInput{Chunks: []api.Chunk{{Type: "encoded_text", Tokens: ids[:n]}}},
		LossFnInputs: map[string]api.TensorData{"target_tokens": {Data: tg, DType: "int64"}, "weights": {Data: w, DType: "float32"}}}
}

// Kill `skein serve` with SIGKILL mid-run and start it again on the same data directory:
// sessions, runs, checkpoints and completed futures are all there, the request that was running
// ends as a server error saying so, and training goes on from the last acknowledged step.
func TestRestartAfterSIGKILL(t *testing.T) {
	data := t.TempDir()
	addr := freeAddr(t)
	srv := startServe(t, data, addr)
	ctx := context.Background()
	c := client.New("http://"+addr, "tml-restart")
	sess, err := c.CreateSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tc, err := c.CreateLoraTrainingClient(ctx, sess, 0, "tiny-qwen3", 4)
	if err != nil {
		t.Fatal(err)
	}
	batch := []api.Datum{datum([]int{10, 20, 30, 40, 50, 60, 70, 80, 90})}
	for range 3 {
		trainStep(t, ctx, tc, batch)
	}
	sf, _ := tc.SaveState(ctx, "before-crash")
	if err := sf.Result(ctx, nil); err != nil {
		t.Fatal(err)
	}
	fwd, _ := tc.ForwardBackward(ctx, batch, "cross_entropy", nil, true)
	var before api.ForwardBackwardOutput
	if err := fwd.Result(ctx, &before); err != nil {
		t.Fatal(err)
	}
	// A request that is still waiting (its seq_id has a gap) when the process dies.
	gap := tc.NextSeq() + 1
	stuck, err := tc.ForwardBackwardSeq(ctx, gap, batch, "cross_entropy", nil, true)
	if err != nil {
		t.Fatal(err)
	}

	if err := srv.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_, _ = srv.Process.Wait()
	startServe(t, data, addr)

	// The completed future is still there, with the same result.
	var again api.ForwardBackwardOutput
	if err := c.Future(fwd.RequestID).Result(ctx, &again); err != nil {
		t.Fatalf("completed future after restart: %v", err)
	}
	if fmt.Sprint(again.LossFnOutputs) != fmt.Sprint(before.LossFnOutputs) {
		t.Fatal("stored result changed across the restart")
	}
	// The interrupted one ends as a server error that says why; it does not hang.
	err = stuck.Result(ctx, &api.ForwardBackwardOutput{})
	var rf *client.RequestFailed
	if !errors.As(err, &rf) || rf.Category != "server" {
		t.Fatalf("interrupted request: %v", err)
	}
	// Runs, checkpoints and sessions survived.
	var runs struct {
		TrainingRuns []api.TrainingRun `json:"training_runs"`
	}
	if err := c.Do(ctx, "GET", "training_runs", nil, &runs); err != nil || len(runs.TrainingRuns) != 1 ||
		runs.TrainingRuns[0].LastCheckpoint == nil || runs.TrainingRuns[0].LastCheckpoint.CheckpointID != "weights/before-crash" {
		t.Fatalf("runs after restart: %v %+v", err, runs)
	}
	if err := c.Do(ctx, "POST", "session_heartbeat", map[string]string{"session_id": sess}, nil); err != nil {
		t.Fatalf("session after restart: %v", err)
	}
	// Training goes on: the adapter reloads from its last acknowledged step.
	tc.NextSeq() // the client's counter moved past the lost request
	f2, err := tc.ForwardBackward(ctx, batch, "cross_entropy", nil, true)
	if err != nil {
		t.Fatal(err)
	}
	var after api.ForwardBackwardOutput
	if err := f2.Result(ctx, &after); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(after.LossFnOutputs[0]["logprobs"].Data) != fmt.Sprint(before.LossFnOutputs[0]["logprobs"].Data) {
		t.Fatal("the adapter after the restart differs from the one before it")
	}
	if s := trainStep(t, ctx, tc, batch); s != 4 {
		t.Fatalf("step after restart: %v, want 4", s)
	}
}

// A forward_backward acknowledged before a SIGKILL has lost its gradients: the next optim_step
// fails saying so instead of stepping with grad_norm 0; once the client runs it again, training
// goes on from the last step.
func TestLostGradientsAfterSIGKILL(t *testing.T) {
	data := t.TempDir()
	addr := freeAddr(t)
	srv := startServe(t, data, addr)
	ctx := context.Background()
	c := client.New("http://"+addr, "tml-restart-grads")
	sess, err := c.CreateSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tc, err := c.CreateLoraTrainingClient(ctx, sess, 0, "tiny-qwen3", 4)
	if err != nil {
		t.Fatal(err)
	}
	batch := []api.Datum{datum([]int{10, 20, 30, 40, 50, 60, 70, 80, 90})}
	trainStep(t, ctx, tc, batch)
	fb, _ := tc.ForwardBackward(ctx, batch, "cross_entropy", nil, false)
	if err := fb.Result(ctx, &api.ForwardBackwardOutput{}); err != nil {
		t.Fatal(err)
	}
	if err := srv.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_, _ = srv.Process.Wait()
	startServe(t, data, addr)

	op, err := tc.OptimStep(ctx, 1e-2)
	if err != nil {
		t.Fatal(err)
	}
	var rf *client.RequestFailed
	if err := op.Result(ctx, nil); !errors.As(err, &rf) || !strings.Contains(rf.Message, "lost") {
		t.Fatalf("optim_step over lost gradients: %v", err)
	}
	if s := trainStep(t, ctx, tc, batch); s != 2 {
		t.Fatalf("step after running forward_backward again: %v, want 2", s)
	}
}
