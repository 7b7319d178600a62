package gateway_test

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/gateway"
)

// The real tinker SDK's traffic (v0.25.0 and v0.24.1 running scripts/sdk_smoke.py against
// `skein serve --record`; -surface: the script with projects, access scopes, the audit log,
// billing usage, trace export with the SDK's CLI, disable_lora and a DPO loop), replayed against a fresh server: every status, every response key
// and every number (losses, logprobs, seeded samples) must come out the same. Ids that the
// server makes up (sessions, requests, samplers) are mapped as they appear.
func TestReplayRecordedSDKTraffic(t *testing.T) {
	for _, file := range []string{"testdata/sdk-0.25.0.jsonl", "testdata/sdk-0.24.1.jsonl", "testdata/sdk-0.25.0-surface.jsonl"} {
		t.Run(file, func(t *testing.T) { replay(t, file) })
	}
}

func readExchanges(t *testing.T, file string) []gateway.Exchange {
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []gateway.Exchange
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var ex gateway.Exchange
		if err := json.Unmarshal(sc.Bytes(), &ex); err != nil {
			t.Fatal(err)
		}
		out = append(out, ex)
	}
	return out
}

type idMap map[string]string

// apply rewrites recorded ids to the ones this server made: whole values for short ids,
// substrings for long ones (a session id inside a model id inside a tinker:// path).
func (m idMap) apply(s string) string {
	if v, ok := m[s]; ok {
		return v
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		if len(k) >= 12 {
			keys = append(keys, k)
		}
	}
	sort.Slice(keys, func(i, j int) bool { return len(keys[i]) > len(keys[j]) })
	for _, k := range keys {
		s = strings.ReplaceAll(s, k, m[k])
	}
	return s
}

func (m idMap) applyJSON(v any) any {
	switch x := v.(type) {
	case string:
		return m.apply(x)
	case map[string]any:
		for k, e := range x {
			x[k] = m.applyJSON(e)
		}
	case []any:
		for i, e := range x {
			x[i] = m.applyJSON(e)
		}
	}
	return v
}

// serverID matches the ids a server makes up: sessions, samplers, request ids.
var serverID = regexp.MustCompile(`^((sess|samp)-[0-9a-f]{16}|[0-9a-f]{8}-[0-9]+)$`)

// size_bytes follows the checkpoint file format, not the protocol.
// Audit times, billing buckets, storage and compute time, and trace event times follow the clock.
var unstableKeys = map[string]bool{"time": true, "last_request_time": true, "expires_at": true, "size_bytes": true,
	"timestamp": true, "bucket_start": true, "bucket_end": true, "gigabyte_hours": true, "compute_seconds": true,
	"ts": true, "dur": true}

// compare walks recorded and fresh JSON together, learning id mappings from differing strings
// and failing on any other difference.
func (m idMap) compare(t *testing.T, where string, rec, got any) {
	t.Helper()
	switch r := rec.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			t.Fatalf("%s: got %T, recorded an object", where, got)
		}
		if len(r) != len(g) {
			t.Fatalf("%s: keys %v, recorded %v", where, keysOf(g), keysOf(r))
		}
		for k, rv := range r {
			gv, ok := g[m.apply(k)] // keys may be ids too (billing's sessions)
			if !ok {
				t.Fatalf("%s: missing key %q", where, k)
			}
			if !unstableKeys[k] {
				m.compare(t, where+"."+k, rv, gv)
			}
		}
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(r) {
			t.Fatalf("%s: got %v, recorded %v", where, got, rec)
		}
		for i := range r {
			m.compare(t, fmt.Sprintf("%s[%d]", where, i), r[i], g[i])
		}
	case string:
		g, ok := got.(string)
		if !ok {
			t.Fatalf("%s: got %v, recorded %q", where, got, r)
		}
		if strings.HasSuffix(where, ".url") && strings.Contains(r, "/traces/") {
			// A signed download link: its token is this server's; the download that follows uses it.
			m[r[strings.LastIndex(r, "/")+1:]] = g[strings.LastIndex(g, "/")+1:]
			return
		}
		if want := m.apply(r); want != g {
			if !serverID.MatchString(r) {
				t.Fatalf("%s: got %q, recorded %q", where, g, want)
			}
			m[r] = g
		}
	case float64:
		g, ok := got.(float64)
		if !ok || math.Abs(g-r) > 1e-3*(1+math.Abs(r)) {
			t.Fatalf("%s: got %v, recorded %v", where, got, r)
		}
	default:
		if fmt.Sprint(rec) != fmt.Sprint(got) {
			t.Fatalf("%s: got %v, recorded %v", where, got, rec)
		}
	}
}

func keysOf(m map[string]any) []string {
	var k []string
	for x := range m {
		k = append(k, x)
	}
	sort.Strings(k)
	return k
}

func replay(t *testing.T, file string) {
	replayWith(t, file, newServer(t, gateway.Options{}), "tml-sdk-smoke", idMap{})
}

// replayWith replays a recording against ts, sending apiKey as the SDK does; ids starts with the
// renames known beforehand (the tenant of another key).
func replayWith(t *testing.T, file string, ts *testServer, apiKey string, ids idMap) {
	exchanges := readExchanges(t, file)
	if len(exchanges) < 40 {
		t.Fatalf("only %d exchanges in %s", len(exchanges), file)
	}
	// Samples drawn without a seed (compute_logprobs draws one token) are random: only their
	// shape is compared. Keyed by the recorded request id.
	unseeded := map[string]bool{}
	for i, ex := range exchanges {
		where := fmt.Sprintf("#%d %s %s", i, ex.Method, ex.Path)
		var body []byte
		switch {
		case ex.RequestJSON != nil:
			var v any
			if err := json.Unmarshal(ex.RequestJSON, &v); err != nil {
				t.Fatal(err)
			}
			body, _ = json.Marshal(ids.applyJSON(v))
		case ex.RequestBinary != nil:
			req, err := api.DecodeForwardBackwardRequest(ex.RequestBinary)
			if err != nil {
				t.Fatalf("%s: %v", where, err)
			}
			req.ModelID = ids.apply(req.ModelID)
			body = api.EncodeForwardBackwardRequest(req)
		}
		req, _ := http.NewRequest(ex.Method, ts.URL+shiftBillingWindow(t, ids.apply(ex.Path)), bytes.NewReader(body))
		for k, v := range ex.Headers {
			req.Header.Set(k, v)
		}
		req.Header.Set("X-API-Key", keyFor(ex.Headers[gateway.RecordedTenantHeader], apiKey))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != ex.Status {
			t.Fatalf("%s: status %d (%s), recorded %d", where, resp.StatusCode, got, ex.Status)
		}
		var recReq map[string]any
		_ = json.Unmarshal(ex.RequestJSON, &recReq)
		if strings.HasSuffix(ex.Path, "/asample") {
			var r struct {
				RequestID string `json:"request_id"`
			}
			_ = json.Unmarshal(ex.ResponseJSON, &r)
			if sp, _ := recReq["sampling_params"].(map[string]any); sp["seed"] == nil {
				unseeded[r.RequestID] = true
			}
		}
		random := strings.HasSuffix(ex.Path, "/retrieve_future") && unseeded[fmt.Sprint(recReq["request_id"])]
		switch {
		case ex.ResponseJSON != nil:
			var rv, gv any
			_ = json.Unmarshal(ex.ResponseJSON, &rv)
			if err := json.Unmarshal(got, &gv); err != nil {
				t.Fatalf("%s: response %q is not JSON", where, got)
			}
			ids.compare(t, where, rv, gv)
		case ex.ResponseBinary != nil:
			if !strings.Contains(resp.Header.Get("Content-Type"), "protobuf") {
				t.Fatalf("%s: got %s, recorded protobuf", where, resp.Header.Get("Content-Type"))
			}
			var rv, gv any
			if ex.Headers["X-Tinker-Request-Type"] == "Sample" {
				r1, err1 := api.DecodeSampleResponse(ex.ResponseBinary)
				r2, err2 := api.DecodeSampleResponse(got)
				if err1 != nil || err2 != nil {
					t.Fatalf("%s: %v %v", where, err1, err2)
				}
				rv, gv = roundTrip(r1), roundTrip(r2)
				if random {
					for i := range r1.Sequences {
						if len(r1.Sequences[i].Tokens) != len(r2.Sequences[i].Tokens) {
							t.Fatalf("%s: sequence lengths differ", where)
						}
					}
					rv, gv = roundTrip(r1.PromptLogprobs), roundTrip(r2.PromptLogprobs)
				}
			} else {
				r1, err1 := api.DecodeForwardBackwardOutput(ex.ResponseBinary)
				r2, err2 := api.DecodeForwardBackwardOutput(got)
				if err1 != nil || err2 != nil {
					t.Fatalf("%s: %v %v", where, err1, err2)
				}
				rv, gv = roundTrip(r1), roundTrip(r2)
			}
			ids.compare(t, where, rv, gv)
		}
	}
	t.Logf("replayed %d exchanges", len(exchanges))
}

func roundTrip(v any) any {
	b, _ := json.Marshal(v)
	var out any
	_ = json.Unmarshal(b, &out)
	return out
}

// otherRecordedKeys are the open-mode keys the smoke script uses besides its main one (for a
// second tenant); a recorded request names its tenant, the hash of its key.
var otherRecordedKeys = []string{"tml-sdk-smoke-other"}

func keyFor(tenant, main string) string {
	for _, k := range otherRecordedKeys {
		sum := sha256.Sum256([]byte(k))
		if tenant == "t-"+hex.EncodeToString(sum[:8]) {
			return k
		}
	}
	return main
}

// shiftBillingWindow moves a recorded billing query's window (hour−1 to hour+1 around the hour
// it was recorded in) to the same place around the current hour.
func shiftBillingWindow(t *testing.T, path string) string {
	u, err := url.Parse(path)
	if err != nil || !strings.HasSuffix(u.Path, "/billing/usage/events") {
		return path
	}
	q := u.Query()
	end, err := time.Parse(time.RFC3339, q.Get("ending_before"))
	if err != nil {
		t.Fatalf("recorded billing window %q: %v", path, err)
	}
	shift := time.Now().UTC().Truncate(time.Hour).Sub(end.Add(-time.Hour))
	for _, k := range []string{"starting_on", "ending_before"} {
		v, err := time.Parse(time.RFC3339, q.Get(k))
		if err != nil {
			t.Fatalf("recorded billing window %q: %v", path, err)
		}
		q.Set(k, v.Add(shift).UTC().Format(time.RFC3339))
	}
	u.RawQuery = q.Encode()
	return u.String()
}
