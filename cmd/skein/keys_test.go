package main

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/skein-ai/skein/client"
	"github.com/skein-ai/skein/gateway"
)

// Open mode is the default only on loopback; any other address needs --auth keys, and the
// refusal says how to get there.
func TestAuthModeRefusesOpenOffLoopback(t *testing.T) {
	for _, c := range []struct {
		flag, addr, want string
	}{
		{"", "127.0.0.1:8000", gateway.AuthOpen},
		{"", "localhost:8000", gateway.AuthOpen},
		{"", "[::1]:8000", gateway.AuthOpen},
		{"open", "127.0.0.2:8000", gateway.AuthOpen},
		{"keys", "127.0.0.1:8000", gateway.AuthKeys},
		{"keys", "0.0.0.0:8000", gateway.AuthKeys},
		{"keys", ":8000", gateway.AuthKeys},
	} {
		if got, err := authMode(c.flag, c.addr); err != nil || got != c.want {
			t.Errorf("authMode(%q, %q) = %q, %v; want %q", c.flag, c.addr, got, err, c.want)
		}
	}
	for _, c := range []struct{ flag, addr string }{
		{"", "0.0.0.0:8000"}, {"", ":8000"}, {"", "10.1.2.3:8000"}, {"", "[::]:8000"}, {"", "example.com:8000"},
		{"open", "0.0.0.0:8000"}, {"", "no-port"}, {"closed", "127.0.0.1:8000"},
	} {
		_, err := authMode(c.flag, c.addr)
		if err == nil {
			t.Errorf("authMode(%q, %q) accepted", c.flag, c.addr)
			continue
		}
		if c.flag != "closed" && c.addr != "no-port" && (!strings.Contains(err.Error(), "--auth keys") || !strings.Contains(err.Error(), "skein keys create")) {
			t.Errorf("authMode(%q, %q): %q does not say what to do", c.flag, c.addr, err)
		}
	}
	// The server itself refuses before loading anything.
	err := run([]string{"serve", "--addr", "0.0.0.0:0", "--data", t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "--auth keys") {
		t.Fatalf("serve on 0.0.0.0 in open mode: %v", err)
	}
}

func keysCmd(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out, msgs bytes.Buffer
	err := keysCommand(args, &out, &msgs)
	return out.String(), err
}

// The bootstrapping path: `skein keys create` against the data directory, then a server in keys
// mode on it; `skein keys revoke` applies to the running server's next request.
func TestKeysCommandCreateListRevoke(t *testing.T) {
	data := t.TempDir()
	if _, err := keysCmd(t, "list", "--data", filepath.Join(data, "missing")); err == nil {
		t.Fatal("list on a data directory with no state store succeeded")
	}
	adminKey, err := keysCmd(t, "create", "--name", "ops", "--admin", "--data", data)
	if err != nil {
		t.Fatal(err)
	}
	adminKey = strings.TrimSpace(adminKey)
	aliceKey, err := keysCmd(t, "create", "--data", data, "--name", "alice")
	if err != nil {
		t.Fatal(err)
	}
	aliceKey = strings.TrimSpace(aliceKey)
	if !strings.HasPrefix(aliceKey, "tml-") || aliceKey == adminKey || strings.Contains(aliceKey, "\n") {
		t.Fatalf("create printed %q and %q, want one new tml- key each", adminKey, aliceKey)
	}
	for _, bad := range [][]string{{"create", "--data", data}, {"create", "--data", data, "--name", "a\tb"},
		{"revoke", "--data", data}, {"revoke", "--data", data, "0123456789abcdef"}, {"rotate", "--data", data}} {
		if _, err := keysCmd(t, bad...); err == nil {
			t.Errorf("keys %v accepted", bad)
		}
	}
	list, err := keysCmd(t, "list", "--data", data)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(list, "ops") || !strings.Contains(list, "alice") || strings.Contains(list, aliceKey[20:]) {
		t.Fatalf("list:\n%s", list)
	}
	aliceID := ""
	for _, line := range strings.Split(list, "\n") {
		if f := strings.Fields(line); len(f) > 1 && f[1] == "alice" {
			aliceID = f[0]
		}
	}
	if aliceID == "" || !strings.Contains(aliceKey, aliceID) {
		t.Fatalf("no id for alice in:\n%s", list)
	}

	gw, err := gateway.New(gateway.Options{DataDir: data, Auth: gateway.AuthKeys})
	if err != nil {
		t.Fatal(err)
	}
	defer gw.Close()
	ts := httptest.NewServer(gw)
	defer ts.Close()
	ctx := context.Background()
	alice := client.New(ts.URL, aliceKey)
	if _, err := alice.CreateSession(ctx); err != nil {
		t.Fatalf("a key from `skein keys create`: %v", err)
	}
	if err := client.New(ts.URL, adminKey).Do(ctx, "GET", "skein/replicas", nil, nil); err != nil {
		t.Fatalf("the admin key from `skein keys create --admin`: %v", err)
	}
	if _, err := keysCmd(t, "revoke", "--data", data, aliceID); err != nil {
		t.Fatal(err)
	}
	_, err = alice.CreateSession(ctx)
	if se, ok := err.(*client.StatusError); !ok || se.Status != http.StatusUnauthorized {
		t.Fatalf("after `skein keys revoke`, the next request: %v, want 401", err)
	}
	if list, _ := keysCmd(t, "list", "--data", data); !strings.Contains(list, "revoked") {
		t.Fatalf("list after revoke does not show it:\n%s", list)
	}
}
