package main

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/skein-ai/skein/engine"
)

func probe(addr, path string) int {
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// A worker without --gateway waits to be discovered; on SIGTERM its readiness fails at once
// while it keeps serving (liveness still answers) for --drain-delay, then it exits cleanly.
func TestWorkerDrainsOnSIGTERM(t *testing.T) {
	root := t.TempDir()
	modelDir := filepath.Join(root, "tiny-qwen3")
	if err := engine.InitTiny(modelDir, engine.ArchQwen3, "tiny", 1); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	cmd := startSkein(t, root, "worker", "--model", modelDir, "--worker-token", "s3cret", "--data", root,
		"--addr", addr, "--drain-delay", "3s")
	deadline := time.Now().Add(60 * time.Second)
	for probe(addr, "/readyz") != http.StatusOK {
		if time.Now().After(deadline) {
			t.Fatal("worker never ready")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	sawDraining := false
	for time.Now().Before(deadline) && !sawDraining {
		sawDraining = probe(addr, "/readyz") == http.StatusServiceUnavailable && probe(addr, "/healthz") == http.StatusOK
		time.Sleep(20 * time.Millisecond)
	}
	if !sawDraining {
		t.Fatal("no draining state (readyz 503, healthz 200) after SIGTERM")
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("worker exited with %v after its drain", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("worker did not exit after its drain delay")
	}
}

// SIGTERM while the worker is still loading its model (Kubernetes stops pods that never got
// ready) ends it cleanly: the signal is caught from the start, the worker never starts serving,
// and it exits 0. Before, the handler was installed only after the server started, so a signal
// before that (or in the moment after the first ready answer) killed the process outright.
func TestWorkerSignalledWhileLoadingExitsCleanly(t *testing.T) {
	root := t.TempDir()
	modelDir := filepath.Join(root, "small")
	// small: a load long enough (~0.5 s) for the signal to land inside it.
	if err := engine.InitTiny(modelDir, engine.ArchQwen3, "small", 1); err != nil {
		t.Fatal(err)
	}
	logs := filepath.Join(root, "logs")
	if err := os.Mkdir(logs, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := startSkein(t, logs, "worker", "--model", modelDir, "--worker-token", "s3cret", "--data", root,
		"--addr", freeAddr(t))
	logText := func() string {
		matches, _ := filepath.Glob(filepath.Join(logs, "worker-*.log"))
		if len(matches) != 1 {
			return ""
		}
		b, _ := os.ReadFile(matches[0])
		return string(b)
	}
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(logText(), `msg="loading model"`) {
		if time.Now().After(deadline) {
			t.Fatalf("the worker never began loading; its log:\n%s", logText())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("a worker signalled while loading ended with %v, not a clean exit; its log:\n%s", err, logText())
		}
	case <-time.After(60 * time.Second):
		t.Fatal("a worker signalled while loading did not exit")
	}
	if log := logText(); strings.Contains(log, "skein worker serving") {
		t.Fatalf("a worker signalled while loading started serving anyway; its log:\n%s", log)
	}
}
