package gateway_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/skein-ai/skein/gateway"
)

func archiveURL(t *testing.T, ts *testServer, key, runID, host string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", ts.URL+"/api/v1/training_runs/"+runID+"/checkpoints/weights/a1/archive", nil)
	req.Host = host
	req.Header.Set("X-API-Key", key)
	req.Header.Set("Accept", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var u struct{ URL string }
	_ = json.NewDecoder(resp.Body).Decode(&u)
	return resp.StatusCode, u.URL
}

// Archive URLs come from the configured public URL (default: the loopback address the server
// listens on), never from the request's Host header.
func TestArchiveURLIgnoresHostHeader(t *testing.T) {
	for _, public := range []string{"", "https://skein.example.com/"} {
		ts := newServer(t, gateway.Options{PublicURL: public})
		_, tc := trainedModel(t, ts, "tml-host")
		f, _ := tc.SaveState(context.Background(), "a1")
		if err := f.Result(context.Background(), nil); err != nil {
			t.Fatal(err)
		}
		want := ts.URL + "/api/v1/archives/"
		if public != "" {
			want = "https://skein.example.com/api/v1/archives/"
		}
		// A Host open mode accepts (loopback names only, against DNS rebinding) but still forged.
		code, url := archiveURL(t, ts, "tml-host", tc.ModelID, "evil.localhost")
		if code != http.StatusOK || !strings.HasPrefix(url, want) {
			t.Fatalf("public URL %q: %d %q, want it under %s", public, code, url, want)
		}
	}
}

// Off loopback with no public URL configured, the archive endpoint says what to configure.
func TestArchiveURLNeedsPublicURLOffLoopback(t *testing.T) {
	ts := newServer(t, gateway.Options{})
	_, tc := trainedModel(t, ts, "tml-nopublic")
	f, _ := tc.SaveState(context.Background(), "a1")
	if err := f.Result(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	req := httptest.NewRequest("GET", "/api/v1/training_runs/"+tc.ModelID+"/checkpoints/weights/a1/archive", nil)
	req.Host = "evil.localhost"
	req.Header.Set("X-API-Key", "tml-nopublic")
	req.Header.Set("Accept", "application/json")
	rec := httptest.NewRecorder()
	ts.gw.ServeHTTP(rec, req) // no connection: not loopback
	if rec.Code == http.StatusOK || strings.Contains(rec.Body.String(), "evil.localhost") || !strings.Contains(rec.Body.String(), "--public-url") {
		t.Fatalf("archive URL without a public URL off loopback: %d %s", rec.Code, rec.Body)
	}
	if _, err := gateway.New(gateway.Options{DataDir: t.TempDir(), PublicURL: "ftp://x"}); err == nil {
		t.Fatal("accepted a public URL that is not http(s)")
	}
}
