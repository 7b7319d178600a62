package main

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// While its models load, skein serve answers every request at once with 503, a Retry-After and
// a message saying it is loading (it used to hold them unanswered in the listen backlog);
// /api/v1/healthz answers 503 "loading" too, and 200 once the API is served, so probes and
// clients agree (issue 40 item 18).
func TestServeAnswersLoadingWhileTheModelLoads(t *testing.T) {
	data := t.TempDir()
	hold := filepath.Join(data, "loaded")
	t.Setenv("SKEIN_TEST_HOLD_LOAD", hold)
	addr := freeAddr(t)
	startSkein(t, data, "serve", "--data", data, "--addr", addr)
	c := &http.Client{Timeout: 5 * time.Second}
	get := func(method, path string) (int, http.Header, string, error) {
		req, _ := http.NewRequest(method, "http://"+addr+path, strings.NewReader("{}"))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-API-Key", "tml-loading")
		resp, err := c.Do(req)
		if err != nil {
			return 0, nil, "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header, string(b), nil
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, _, _, err := get("GET", "/api/v1/healthz")
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no answer while loading: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, r := range []struct{ method, path string }{{"GET", "/api/v1/healthz"}, {"POST", "/api/v1/create_session"}, {"GET", "/"}, {"POST", "/v1/chat/completions"}} {
		code, h, body, err := get(r.method, r.path)
		var msg map[string]any
		if err == nil {
			err = json.Unmarshal([]byte(body), &msg)
		}
		if err != nil || code != http.StatusServiceUnavailable || h.Get("Retry-After") == "" || !strings.Contains(body, "loading") {
			t.Fatalf("%s %s while loading: %d Retry-After %q %s %v", r.method, r.path, code, h.Get("Retry-After"), body, err)
		}
	}
	if err := os.WriteFile(hold, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for {
		code, _, _, err := get("GET", "/api/v1/healthz")
		if err == nil && code == http.StatusOK {
			break
		}
		if time.Now().After(deadline.Add(30 * time.Second)) {
			t.Fatalf("healthz after loading: %d %v", code, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if code, _, body, err := get("POST", "/api/v1/create_session"); err != nil || code != http.StatusOK {
		t.Fatalf("create_session once loaded: %d %s %v", code, body, err)
	}
}
