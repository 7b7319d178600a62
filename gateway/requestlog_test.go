package gateway_test

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/skein-ai/skein/gateway"
)

// lockedBuffer collects log output written from several goroutines.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// lines are the JSON log records written so far.
func (b *lockedBuffer) lines(t *testing.T) []map[string]any {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(b.buf.String()), "\n") {
		if l == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		out = append(out, m)
	}
	return out
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// logServer is a gateway without replicas that logs JSON into the returned buffer.
func logServer(t *testing.T, opts gateway.Options) (*httptest.Server, *lockedBuffer) {
	t.Helper()
	logs := &lockedBuffer{}
	opts.DataDir = t.TempDir()
	opts.Logger = slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	gw, err := gateway.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(gw)
	t.Cleanup(func() { ts.Close(); gw.Close() })
	return ts, logs
}

func postWithID(t *testing.T, url, key, requestID, body string) *http.Response {
	t.Helper()
	req, err := http.NewRequest("POST", url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-API-Key", key)
	if requestID != "" {
		req.Header.Set(gateway.RequestIDHeader, requestID)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp
}

// requestLine finds the request log line of one request id.
func requestLine(t *testing.T, logs *lockedBuffer, id string) map[string]any {
	t.Helper()
	for _, l := range logs.lines(t) {
		if l["msg"] == "request" && l["request_id"] == id {
			return l
		}
	}
	t.Fatalf("no request line with request_id %q in\n%s", id, logs)
	return nil
}

// Every request gets one log line with its method, path, status, duration, tenant hash and
// request id (the client's if well-formed, echoed back); errors carry their message and the
// future's id; the API key and the body are never logged.
func TestRequestLog(t *testing.T) {
	ts, logs := logServer(t, gateway.Options{})
	const key, secretBody = "tml-very-secret-key-42", "secret-body-marker"

	resp := postWithID(t, ts.URL+"/api/v1/create_session", key, "client-req.1", `{"tags":["`+secretBody+`"]}`)
	if resp.StatusCode != http.StatusOK || resp.Header.Get(gateway.RequestIDHeader) != "client-req.1" {
		t.Fatalf("create_session: %d, X-Request-Id %q", resp.StatusCode, resp.Header.Get(gateway.RequestIDHeader))
	}
	l := requestLine(t, logs, "client-req.1")
	if l["method"] != "POST" || l["path"] != "/api/v1/create_session" || l["status"] != float64(200) || l["level"] != "INFO" {
		t.Fatalf("request line %v", l)
	}
	if _, ok := l["duration"]; !ok {
		t.Fatalf("no duration in %v", l)
	}
	tenant, _ := l["tenant"].(string)
	if !strings.HasPrefix(tenant, "t-") {
		t.Fatalf("tenant %q in %v", tenant, l)
	}

	// A malformed or long id is replaced by one of ours.
	for _, bad := range []string{"two words", "line\"break", strings.Repeat("a", 65)} {
		resp = postWithID(t, ts.URL+"/api/v1/retrieve_future", key, bad, `{"request_id":"no-such-future"}`)
		got := resp.Header.Get(gateway.RequestIDHeader)
		if got == "" || got == bad || resp.StatusCode != http.StatusNotFound {
			t.Fatalf("bad id %q: answered %d with X-Request-Id %q", bad, resp.StatusCode, got)
		}
		l = requestLine(t, logs, got)
		if l["future"] != "no-such-future" || !strings.Contains(l["err"].(string), "not found") || l["status"] != float64(404) {
			t.Fatalf("error line %v", l)
		}
	}

	// A request without a key is logged with its error and no tenant.
	resp = postWithID(t, ts.URL+"/api/v1/create_session", "", "no-key", `{}`)
	l = requestLine(t, logs, "no-key")
	if resp.StatusCode != http.StatusUnauthorized || l["err"] == nil || l["tenant"] != nil {
		t.Fatalf("unauthenticated: %d, %v", resp.StatusCode, l)
	}

	// Signed download links are credentials: their path is not logged.
	req, _ := http.NewRequest("GET", ts.URL+"/api/v1/archives/signed-token-marker", nil)
	req.Header.Set(gateway.RequestIDHeader, "archive")
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
	}
	requestLine(t, logs, "archive")

	for _, secret := range []string{key, secretBody, "signed-token-marker"} {
		if strings.Contains(logs.String(), secret) {
			t.Fatalf("%q was logged:\n%s", secret, logs)
		}
	}
}

// A session that stops heartbeating is logged when it expires.
func TestSessionExpiryIsLogged(t *testing.T) {
	ts, logs := logServer(t, gateway.Options{SessionTimeout: 50 * time.Millisecond})
	if resp := postWithID(t, ts.URL+"/api/v1/create_session", "tml-a", "", `{}`); resp.StatusCode != http.StatusOK {
		t.Fatalf("create_session: %d", resp.StatusCode)
	}
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		for _, l := range logs.lines(t) {
			if l["msg"] == "session expired" && strings.HasPrefix(l["tenant"].(string), "t-") && l["session"] != "" {
				return
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("no session expiry logged:\n%s", logs)
}
