package main

import (
	"net/http"
	"path/filepath"
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
