package gateway_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/skein-ai/skein/client"
	"github.com/skein-ai/skein/gateway"
	"github.com/skein-ai/skein/store"
)

// newKeysServer serves the tiny model in `--auth keys` mode over a store the test can issue keys in.
func newKeysServer(t *testing.T) (*testServer, store.Store) {
	t.Helper()
	dir := t.TempDir()
	st, err := store.OpenSQLite(filepath.Join(dir, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return newServer(t, gateway.Options{DataDir: dir, Store: st, Auth: gateway.AuthKeys}), st
}

func issue(t *testing.T, st store.Store, name string, admin bool) (string, store.APIKey) {
	t.Helper()
	key, row, err := gateway.IssueKey(context.Background(), st, name, admin)
	if err != nil {
		t.Fatal(err)
	}
	return key, row
}

// call sends one request with the given headers and returns the status and the decoded JSON body.
func call(t *testing.T, method, url string, headers map[string]string, body string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var out map[string]any
	if len(b) > 0 && strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		if err := json.Unmarshal(b, &out); err != nil {
			t.Fatalf("%s %s: body %q: %v", method, url, b, err)
		}
	}
	return resp.StatusCode, out
}

func statusOf(err error) int {
	var se *client.StatusError
	if errors.As(err, &se) {
		return se.Status
	}
	return 0
}

// In keys mode only issued, unrevoked keys are tenants; every other key is a 401 with the
// Tinker error shape, and a revocation applies to the very next request.
func TestKeysModeAcceptsOnlyIssuedKeys(t *testing.T) {
	ts, st := newKeysServer(t)
	key, row := issue(t, st, "alice", false)
	if !strings.HasPrefix(key, "tml-") {
		t.Fatalf("key %q: the tinker SDK needs the tml- prefix", key)
	}
	session := ts.URL + "/api/v1/create_session"
	tampered := key[:len(key)-1] + string("0123456789abcdef"[(strings.IndexByte("0123456789abcdef", key[len(key)-1])+1)%16])
	for name, h := range map[string]map[string]string{
		"no key":             nil,
		"any tml- string":    {"X-API-Key": "tml-anything"},
		"right id, bad hash": {"X-API-Key": tampered},
		"bearer, bad key":    {"Authorization": "Bearer tml-" + row.ID + "_" + strings.Repeat("0", 64)},
	} {
		code, body := call(t, "POST", session, h, "{}")
		if code != http.StatusUnauthorized || body["detail"] == "" || body["detail"] == nil {
			t.Errorf("%s: %d %v, want 401 with a detail", name, code, body)
		}
	}
	for name, h := range map[string]map[string]string{
		"X-API-Key":     {"X-API-Key": key},
		"Authorization": {"Authorization": "Bearer " + key},
	} {
		if code, body := call(t, "POST", session, h, "{}"); code != http.StatusOK {
			t.Fatalf("issued key in %s: %d %v", name, code, body)
		}
	}
	c := client.New(ts.URL, key)
	if _, err := c.CreateSession(context.Background()); err != nil {
		t.Fatalf("Go client with an issued key: %v", err)
	}
	if err := st.RevokeKey(context.Background(), row.ID, time.Now()); err != nil {
		t.Fatal(err)
	}
	_, err := c.CreateSession(context.Background())
	if statusOf(err) != http.StatusUnauthorized || !strings.Contains(err.Error(), "revoked") {
		t.Fatalf("revoked key on the next request: %v, want 401 naming the revocation", err)
	}
}

// Tenants of issued keys see only their own runs, and a key's tenant does not change when the
// gateway restarts (it derives from the key id).
func TestKeysModeTenantIsolation(t *testing.T) {
	ts, st := newKeysServer(t)
	aliceKey, _ := issue(t, st, "alice", false)
	bobKey, _ := issue(t, st, "bob", false)
	ctx := context.Background()
	alice, tc := newRun(t, ts.URL, aliceKey, 4)
	bob := client.New(ts.URL, bobKey)
	err := bob.Do(ctx, "POST", "get_info", map[string]any{"model_id": tc.ModelID}, nil)
	if statusOf(err) != http.StatusNotFound {
		t.Fatalf("bob reading alice's model: %v, want 404", err)
	}
	runsOf := func(c *client.Client) []string {
		var out struct {
			TrainingRuns []struct {
				ID string `json:"training_run_id"`
			} `json:"training_runs"`
		}
		if err := c.Do(ctx, "GET", "training_runs", nil, &out); err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, r := range out.TrainingRuns {
			ids = append(ids, r.ID)
		}
		return ids
	}
	// The capacity endpoint shows a tenant its own counts, never the fleet's.
	liveOf := func(c *client.Client) any {
		var out map[string]any
		if err := c.Do(ctx, "GET", "skein/capacity", nil, &out); err != nil {
			t.Fatal(err)
		}
		if out[base] != nil {
			t.Fatalf("a tenant sees the fleet's capacity: %v", out)
		}
		return out["live_loras"]
	}
	if a, b := liveOf(alice), liveOf(bob); a != 1.0 || b != 0.0 {
		t.Fatalf("live adapters: alice %v, bob %v; want 1 and 0", a, b)
	}
	if ids := runsOf(bob); len(ids) != 0 {
		t.Fatalf("bob sees runs %v", ids)
	}
	if ids := runsOf(alice); len(ids) != 1 || ids[0] != tc.ModelID {
		t.Fatalf("alice sees runs %v, want [%s]", ids, tc.ModelID)
	}
	// A second gateway on the same store (a restart, or another gateway on PostgreSQL) maps the
	// key to the same tenant.
	ts.gw.Close()
	again := newServer(t, gateway.Options{DataDir: t.TempDir(), Store: st, Auth: gateway.AuthKeys})
	if ids := runsOf(client.New(again.URL, aliceKey)); len(ids) != 1 || ids[0] != tc.ModelID {
		t.Fatalf("after restart alice sees runs %v, want [%s]", ids, tc.ModelID)
	}
}

// Fleet and key-management endpoints need an admin key in keys mode: 401 without a key, 403 with
// a tenant's. An admin manages keys over HTTP; the secret is shown once and never listed.
func TestKeysModeAdminEndpoints(t *testing.T) {
	ts, st := newKeysServer(t)
	tenantKey, _ := issue(t, st, "alice", false)
	adminKey, _ := issue(t, st, "ops", true)
	admin := map[string]string{"X-API-Key": adminKey}
	for _, ep := range []struct{ method, path string }{
		{"GET", "/api/v1/skein/replicas"}, {"GET", "/api/v1/skein/keys"},
		{"POST", "/api/v1/skein/keys"}, {"DELETE", "/api/v1/skein/keys/whatever"}, {"GET", "/metrics"},
	} {
		if code, _ := call(t, ep.method, ts.URL+ep.path, nil, `{"name":"x"}`); code != http.StatusUnauthorized {
			t.Errorf("%s %s without a key: %d, want 401", ep.method, ep.path, code)
		}
		if code, body := call(t, ep.method, ts.URL+ep.path, map[string]string{"X-API-Key": tenantKey}, `{"name":"x"}`); code != http.StatusForbidden || body["detail"] == nil {
			t.Errorf("%s %s with a tenant key: %d %v, want 403 with a detail", ep.method, ep.path, code, body)
		}
	}
	if code, _ := call(t, "GET", ts.URL+"/api/v1/skein/capacity", nil, ""); code != http.StatusUnauthorized {
		t.Errorf("capacity without a key: %d, want 401", code)
	}
	code, fleet := call(t, "GET", ts.URL+"/api/v1/skein/capacity", admin, "")
	if code != http.StatusOK || fleet[base] == nil {
		t.Errorf("capacity with the admin key: %d %v, want the fleet's slots", code, fleet)
	}
	for _, path := range []string{"/api/v1/skein/replicas", "/metrics"} {
		if code, _ := call(t, "GET", ts.URL+path, admin, ""); code != http.StatusOK {
			t.Errorf("GET %s with the admin key: %d", path, code)
		}
	}
	code, created := call(t, "POST", ts.URL+"/api/v1/skein/keys", admin, `{"name":"carol"}`)
	newKey, _ := created["key"].(string)
	newID, _ := created["id"].(string)
	if code != http.StatusOK || !strings.HasPrefix(newKey, "tml-") || newID == "" || created["admin"] != false {
		t.Fatalf("create key: %d %v", code, created)
	}
	if _, err := client.New(ts.URL, newKey).CreateSession(context.Background()); err != nil {
		t.Fatalf("a key made over HTTP: %v", err)
	}
	for _, bad := range []string{`{}`, `{"name":"` + strings.Repeat("n", 200) + `"}`, `{"name":"a\nb"}`, `{"name":1}`} {
		if code, body := call(t, "POST", ts.URL+"/api/v1/skein/keys", admin, bad); code != http.StatusBadRequest {
			t.Errorf("create key %s: %d %v, want 400", bad, code, body)
		}
	}
	code, listed := call(t, "GET", ts.URL+"/api/v1/skein/keys", admin, "")
	rows, _ := listed["keys"].([]any)
	if code != http.StatusOK || len(rows) != 3 {
		t.Fatalf("list keys: %d %v", code, listed)
	}
	raw, _ := json.Marshal(listed)
	if strings.Contains(string(raw), newKey[len(newKey)-20:]) || strings.Contains(string(raw), `"hash"`) {
		t.Fatalf("listing shows secrets: %s", raw)
	}
	if code, _ := call(t, "DELETE", ts.URL+"/api/v1/skein/keys/nope", admin, ""); code != http.StatusNotFound {
		t.Errorf("revoke unknown key: %d, want 404", code)
	}
	if code, body := call(t, "DELETE", ts.URL+"/api/v1/skein/keys/"+newID, admin, ""); code != http.StatusOK {
		t.Fatalf("revoke: %d %v", code, body)
	}
	if _, err := client.New(ts.URL, newKey).CreateSession(context.Background()); statusOf(err) != http.StatusUnauthorized {
		t.Fatalf("key revoked over HTTP, next request: %v, want 401", err)
	}
}

// Open mode keeps today's behaviour: any key is a tenant and the fleet endpoints answer any key,
// but keys cannot be managed over HTTP (an unauthenticated caller must not mint admin keys).
func TestOpenModeKeepsAnyKeyAndRefusesKeyManagement(t *testing.T) {
	ts := newServer(t, gateway.Options{})
	anyKey := map[string]string{"X-API-Key": "tml-anything"}
	if code, _ := call(t, "GET", ts.URL+"/api/v1/skein/replicas", anyKey, ""); code != http.StatusOK {
		t.Errorf("open mode replicas: %d", code)
	}
	if code, _ := call(t, "GET", ts.URL+"/metrics", nil, ""); code != http.StatusOK {
		t.Errorf("open mode metrics: %d", code)
	}
	if code, _ := call(t, "POST", ts.URL+"/api/v1/skein/keys", anyKey, `{"name":"x","admin":true}`); code != http.StatusForbidden {
		t.Errorf("open mode create key: %d, want 403", code)
	}
}

// `skein serve --record` never writes an issued key to its recording.
func TestRecorderKeepsNewKeysOut(t *testing.T) {
	ts, st := newKeysServer(t)
	adminKey, _ := issue(t, st, "ops", true)
	path := filepath.Join(t.TempDir(), "rec.jsonl")
	rec, err := gateway.Recorder(ts.gw, path)
	if err != nil {
		t.Fatal(err)
	}
	recorded := httptest.NewServer(rec)
	defer recorded.Close()
	code, created := call(t, "POST", recorded.URL+"/api/v1/skein/keys", map[string]string{"X-API-Key": adminKey}, `{"name":"carol"}`)
	newKey, _ := created["key"].(string)
	if code != http.StatusOK || newKey == "" {
		t.Fatalf("create key: %d %v", code, created)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), newKey[len(newKey)-32:]) || !strings.Contains(string(b), "skein/keys") {
		t.Fatalf("recording holds the new key (or not the exchange): %s", b)
	}
}

// The real SDK's recorded traffic runs unchanged in keys mode with an issued key.
func TestKeysModeReplaysRecordedSDKTraffic(t *testing.T) {
	ts, st := newKeysServer(t)
	key, row := issue(t, st, "sdk", false)
	// The recording's tenant is open mode's for the key it was made with, tml-sdk-smoke.
	sum := sha256.Sum256([]byte("tml-sdk-smoke"))
	replayWith(t, "testdata/sdk-0.25.0.jsonl", ts, key, idMap{"t-" + hex.EncodeToString(sum[:8]): gateway.KeyTenant(row.ID)})
}
