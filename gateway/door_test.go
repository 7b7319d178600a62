package gateway_test

import (
	"net/http"
	"strings"
	"testing"

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
