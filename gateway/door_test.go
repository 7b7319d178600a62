package gateway_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/gateway"
)

// hostStatus lists training runs with the given Host header and returns the status and the body's start.
func hostStatus(t *testing.T, ts *testServer, key, host string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", ts.URL+"/api/v1/training_runs", nil)
	req.Host = host
	req.Header.Set("X-API-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	buf := make([]byte, 4096)
	n, _ := resp.Body.Read(buf)
	b.Write(buf[:n])
	return resp.StatusCode, b.String()
}

// In open mode (any key is a tenant) a web page the user visits could drive the loopback server
// through DNS rebinding: its requests carry the page's Host. Only loopback names and the public
// URL's host are answered; keys mode, where a request needs a real key, is unchanged.
func TestOpenModeRefusesForeignHostHeaders(t *testing.T) {
	ts := newServer(t, gateway.Options{PublicURL: "https://skein.example.com:8443/prefix"})
	for _, host := range []string{"evil.example", "evil.example:8000", "localhost.evil.example", "10.0.0.1", "[::2]:80", "127.0.0.1.evil.example"} {
		code, body := hostStatus(t, ts, "tml-rebind", host)
		if code != http.StatusMisdirectedRequest || !strings.Contains(body, "Host") {
			t.Errorf("open mode, Host %q: %d %s; want 421 naming the Host", host, code, body)
		}
	}
	for _, host := range []string{"localhost", "localhost:8000", "LocalHost:1", "app.localhost:9", "127.0.0.1", "127.1.2.3:8000", "[::1]", "[::1]:8000",
		strings.TrimPrefix(ts.URL, "http://"), "skein.example.com", "skein.example.com:8443"} {
		if code, body := hostStatus(t, ts, "tml-rebind", host); code != http.StatusOK {
			t.Errorf("open mode, Host %q: %d %s; want 200", host, code, body)
		}
	}

	keys, st := newKeysServer(t)
	key, _ := issue(t, st, "k", false)
	if code, body := hostStatus(t, keys, key, "evil.example"); code != http.StatusOK {
		t.Errorf("keys mode, Host evil.example: %d %s; want 200 (unchanged)", code, body)
	}
}

// get fetches url without a key and returns the status and the body.
func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// A download link (checkpoint archive, session trace) needs no key, but in keys mode it works
// only while the key that asked for it is valid: revoking a key also ends its links.
func TestDownloadLinksEndWithTheirKey(t *testing.T) {
	ts, st := newKeysServer(t)
	key, row := issue(t, st, "links", false)
	ctx := context.Background()
	c, tc := trainedModel(t, ts, key)
	f, err := tc.ForwardBackward(ctx, []api.Datum{datum([]int{1, 2, 3, 4}, true)}, "cross_entropy", nil, false)
	await(t, f, err, nil)
	save, _ := tc.SaveState(ctx, "a1")
	if err := save.Result(ctx, nil); err != nil {
		t.Fatal(err)
	}
	var archive api.ArchiveURLResponse
	if err := c.Do(ctx, "GET", "training_runs/"+tc.ModelID+"/checkpoints/weights/a1/archive", nil, &archive); err != nil {
		t.Fatal(err)
	}
	var trace api.TraceExportResponse
	if err := c.Do(ctx, "GET", "sessions/"+strings.Split(tc.ModelID, ":")[0]+"/trace_export", nil, &trace); err != nil {
		t.Fatal(err)
	}
	for _, u := range []string{archive.URL, trace.URL} {
		if code, body := get(t, u); code != http.StatusOK {
			t.Fatalf("%s before the revocation: %d %.200s", u, code, body)
		}
	}
	if err := st.RevokeKey(ctx, row.ID, time.Now()); err != nil {
		t.Fatal(err)
	}
	for _, u := range []string{archive.URL, trace.URL} {
		if code, body := get(t, u); code != http.StatusForbidden || !strings.Contains(body, "revoked") {
			t.Errorf("%s after the revocation: %d %.200s; want 403 saying the key was revoked", u, code, body)
		}
	}
}

// Text is refused by its length in bytes before it is tokenized or rendered: a prompt far longer
// than the model's context (1,024 tokens for the tiny model) costs a 400 naming the byte limit,
// not the time and memory of tokenizing it. The OpenAI endpoints' bodies have their own, smaller
// size limit (413).
func TestLongTextIsRefusedBeforeTokenizing(t *testing.T) {
	ts := newServer(t, gateway.Options{})
	big := strings.Repeat("lorem ipsum ", 1<<20/12) // 1 MiB, a thousand times the context
	for _, tc := range []struct{ name, path, body, param string }{
		{"completion", "/v1/completions", `{"model":"` + base + `","prompt":"` + big + `"}`, "prompt"},
		{"completion list", "/v1/completions", `{"model":"` + base + `","prompt":["` + big + `"]}`, "prompt"},
		{"chat", "/v1/chat/completions", `{"model":"` + base + `","messages":[{"role":"user","content":"` + big[:len(big)/2] +
			`"},{"role":"assistant","content":"ok"},{"role":"user","content":[{"type":"text","text":"` + big[:len(big)/2] + `"}]}]}`, "messages"},
	} {
		status, body := oai(t, "POST", ts.URL, "tml-long", tc.path, tc.body)
		var e struct {
			Error struct{ Message, Param string }
		}
		_ = json.Unmarshal(body, &e)
		if status != http.StatusBadRequest || e.Error.Param != tc.param || !strings.Contains(e.Error.Message, "bytes") {
			t.Errorf("%s: %d %.300s; want 400 on %q naming the byte limit", tc.name, status, body, tc.param)
		}
	}
	huge := `{"model":"` + base + `","prompt":"` + strings.Repeat("a", 20<<20) + `"}`
	if status, body := oai(t, "POST", ts.URL, "tml-long", "/v1/completions", huge); status != http.StatusRequestEntityTooLarge {
		t.Errorf("a 20 MiB completion body: %d %.300s; want 413", status, body)
	}
	// Within the limits nothing changes.
	if status, body := oai(t, "POST", ts.URL, "tml-long", "/v1/completions", `{"model":"`+base+`","prompt":"lorem ipsum","max_tokens":2}`); status != http.StatusOK {
		t.Errorf("a short prompt: %d %s", status, body)
	}
}
