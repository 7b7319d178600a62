package gateway_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/client"
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

// auditPages reads GET /api/v1/audit?query as key, following next_cursor, and returns every
// entry and the largest page.
func auditPages(t *testing.T, c *client.Client, query string) ([]api.AuditLogEntry, int) {
	t.Helper()
	var all []api.AuditLogEntry
	largest, cursor := 0, ""
	for range 1000 {
		q := query
		if cursor != "" {
			q += "&cursor=" + url.QueryEscape(cursor)
		}
		var page api.AuditLogResponse
		if err := c.Do(context.Background(), "GET", "audit?"+q, nil, &page); err != nil {
			t.Fatalf("audit?%s: %v", q, err)
		}
		all, largest = append(all, page.Entries...), max(largest, len(page.Entries))
		if cursor = page.NextCursor; cursor == "" {
			return all, largest
		}
	}
	t.Fatal("the audit log's cursor never ended")
	return nil, 0
}

// One tenant's stream of cheap calls cannot push other tenants' events, or the admin's, out of
// the audit log: the log pages (limit, next_cursor) instead of stopping at a cap, a tenant's
// routine events past its audit rate are collapsed into one row that counts them, and
// security-relevant events (keys, checkpoint saves and deletes) are always recorded.
func TestAuditLogPagesAndOneTenantCannotFloodIt(t *testing.T) {
	ts, st := newKeysServer(t)
	ctx := context.Background()
	adminKey, _ := issue(t, st, "admin", true)
	floodKey, _ := issue(t, st, "flood", false)
	quietKey, _ := issue(t, st, "quiet", false)
	admin := client.New(ts.URL, adminKey)

	flood, ftc := trainedModel(t, ts, floodKey)
	save, err := ftc.SaveState(ctx, "f1")
	await(t, save, err, nil)
	const calls = 250
	for i := range calls {
		if err := flood.Do(ctx, "PUT", "training_runs/"+ftc.ModelID+"/checkpoints/weights/f1/ttl", map[string]any{"ttl_seconds": 3600 + i}, nil); err != nil {
			t.Fatal(err)
		}
	}
	_, qtc := trainedModel(t, ts, quietKey)
	save, err = qtc.SaveState(ctx, "q1")
	await(t, save, err, nil)
	var created api.CreatedKey
	if err := admin.Do(ctx, "POST", "skein/keys", map[string]any{"name": "temp"}, &created); err != nil {
		t.Fatal(err)
	}
	if err := admin.Do(ctx, "DELETE", "skein/keys/"+created.ID, nil, nil); err != nil {
		t.Fatal(err)
	}

	// The flooding tenant's own log counts every call, most of them in "suppressed" rows.
	own, _ := auditPages(t, flood, "limit=10000")
	recorded, suppressed := 0, 0
	for _, e := range own {
		switch e.Event {
		case "checkpoint.set_ttl":
			recorded++
		case "audit.suppressed":
			var n int
			if _, err := fmt.Sscanf(e.Purpose, "%d", &n); err != nil || n < 1 {
				t.Fatalf("suppressed row without a count: %+v", e)
			}
			suppressed += n
		}
	}
	if recorded >= calls || recorded+suppressed != calls {
		t.Errorf("%d calls: %d recorded, %d counted as suppressed; want fewer recorded and all counted", calls, recorded, suppressed)
	}

	// The admin pages through everything; nothing of the others is missing.
	whole, _ := auditPages(t, admin, "")
	paged, largest := auditPages(t, admin, "limit=7")
	if largest > 7 || len(paged) != len(whole) {
		t.Fatalf("pages of 7: %d entries (largest page %d); unpaged %d", len(paged), largest, len(whole))
	}
	has := func(entries []api.AuditLogEntry, event, path string) bool {
		for _, e := range entries {
			if e.Event == event && strings.Contains(e.TinkerPath+e.Purpose, path) {
				return true
			}
		}
		return false
	}
	for _, want := range [][2]string{{"checkpoint.save", qtc.ModelID}, {"checkpoint.save", ftc.ModelID}, {"api_key.create", created.ID}, {"api_key.revoke", created.ID}} {
		if !has(paged, want[0], want[1]) {
			t.Errorf("the admin's pages miss %s of %s", want[0], want[1])
		}
	}
	for i := 1; i < len(paged); i++ {
		prev, _ := time.Parse(time.RFC3339Nano, paged[i-1].Timestamp)
		if at, err := time.Parse(time.RFC3339Nano, paged[i].Timestamp); err != nil || at.Before(prev) {
			t.Fatalf("pages out of order at %d: %+v then %+v", i, paged[i-1], paged[i])
		}
	}

	// Filters: by tenant (admin only) and by event.
	quietTenant := gateway.KeyTenant(strings.Split(strings.TrimPrefix(quietKey, "tml-"), "_")[0])
	only, _ := auditPages(t, admin, "tenant="+quietTenant+"&event=checkpoint.save")
	if len(only) != 1 || only[0].Actor != quietTenant || !strings.Contains(only[0].TinkerPath, qtc.ModelID) {
		t.Errorf("the quiet tenant's saves: %+v", only)
	}
	if err := flood.Do(ctx, "GET", "audit?tenant="+quietTenant, nil, nil); !isStatus(err, http.StatusForbidden) {
		t.Errorf("a tenant reading another's log: %v; want 403", err)
	}
	for _, bad := range []string{"limit=0", "limit=10001", "cursor=nonsense", "event=" + strings.Repeat("x", 200)} {
		if err := admin.Do(ctx, "GET", "audit?"+bad, nil, nil); !isStatus(err, http.StatusBadRequest) {
			t.Errorf("audit?%.40s: %v; want 400", bad, err)
		}
	}
}
