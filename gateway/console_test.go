package gateway_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/skein-ai/skein/gateway"
)

// GET / is the console page (with headers that keep it from being framed or running foreign
// script), its assets are under /console/, and every other unknown path is still a JSON 404.
func TestConsoleIsServedAtRoot(t *testing.T) {
	ts := newServer(t, gateway.Options{})
	get := func(path string) (*http.Response, string) {
		t.Helper()
		resp, err := http.Get(ts.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	resp, body := get("/")
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") || !strings.Contains(body, "/console/console.js") {
		t.Fatalf("GET /: %d %q %.200s", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || !strings.Contains(csp, "frame-ancestors 'none'") {
		t.Fatalf("CSP %q", csp)
	}
	for _, asset := range []string{"/console/console.js", "/console/console.css"} {
		if resp, body := get(asset); resp.StatusCode != 200 || len(body) == 0 || resp.Header.Get("X-Frame-Options") != "DENY" {
			t.Fatalf("%s: %d (%d bytes)", asset, resp.StatusCode, len(body))
		}
	}
	for _, path := range []string{"/nope", "/console/nope.js", "/api/v1/nope"} {
		if resp, _ := get(path); resp.StatusCode != 404 {
			t.Fatalf("%s: %d", path, resp.StatusCode)
		}
	}
	if resp, body := get("/nope"); !strings.Contains(resp.Header.Get("Content-Type"), "json") || !strings.Contains(body, "no such endpoint") {
		t.Fatalf("unknown path lost its JSON 404: %q %s", resp.Header.Get("Content-Type"), body)
	}
	if resp, body := get("/api/v1/healthz"); resp.StatusCode != 200 || !strings.Contains(body, "ok") {
		t.Fatalf("healthz: %d %s", resp.StatusCode, body)
	}
}

// GET /api/v1/console/whoami tells the console whether the key may read the fleet: every
// caller in open mode, only admin keys in keys mode; no key is a 401.
func TestConsoleWhoami(t *testing.T) {
	open := newServer(t, gateway.Options{})
	if code, body := call(t, "GET", open.URL+"/api/v1/console/whoami", map[string]string{"X-API-Key": "tml-anyone"}, ""); code != 200 || body["admin"] != true || body["auth"] != "open" || body["tenant"] == "" {
		t.Fatalf("open mode: %d %v", code, body)
	}
	ts, st := newKeysServer(t)
	tenant, _ := issue(t, st, "tenant", false)
	admin, _ := issue(t, st, "ops", true)
	if code, body := call(t, "GET", ts.URL+"/api/v1/console/whoami", map[string]string{"X-API-Key": tenant}, ""); code != 200 || body["admin"] != false || body["auth"] != "keys" {
		t.Fatalf("tenant key: %d %v", code, body)
	}
	if code, body := call(t, "GET", ts.URL+"/api/v1/console/whoami", map[string]string{"X-API-Key": admin}, ""); code != 200 || body["admin"] != true {
		t.Fatalf("admin key: %d %v", code, body)
	}
	if code, _ := call(t, "GET", ts.URL+"/api/v1/console/whoami", nil, ""); code != 401 {
		t.Fatalf("no key: %d", code)
	}
}

// The console's first page says which key to enter: in open mode any key (tml-…), the one the
// scripts use (each key is its own tenant); with issued keys, one from the operator (issue 40
// item 18).
func TestConsoleSaysWhichKeyToEnter(t *testing.T) {
	page := func(url string) string {
		t.Helper()
		resp, err := http.Get(url + "/")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	open := page(newServer(t, gateway.Options{}).URL)
	if !strings.Contains(open, `id="key-hint"`) || !strings.Contains(open, "any key") || !strings.Contains(open, "tml-") {
		t.Fatalf("open mode's first page does not say which key to enter:\n%s", open)
	}
	ts, _ := newKeysServer(t)
	keys := page(ts.URL)
	if !strings.Contains(keys, `id="key-hint"`) || !strings.Contains(keys, "skein keys create") || strings.Contains(keys, "any key") {
		t.Fatalf("keys mode's first page:\n%s", keys)
	}
}
