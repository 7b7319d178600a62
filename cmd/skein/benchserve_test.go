package main

import (
	"bytes"
	"encoding/json"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/skein-ai/skein/engine"
	"github.com/skein-ai/skein/gateway"
	"github.com/skein-ai/skein/replica"
)

// `skein bench serve` drives an open server through a workload of an RL tenant and a chat
// tenant sharing a system prompt: every request is answered, the server counts the prompt
// positions the bench requested; run again, every prompt's whole blocks are served from the
// prefix cache and only the rest computed; the latencies and KV bytes are reported.
func TestBenchServeDrivesAServer(t *testing.T) {
	dir := t.TempDir()
	if err := engine.InitTiny(dir, engine.ArchQwen3, "tiny", 1); err != nil {
		t.Fatal(err)
	}
	e, err := engine.Load(dir, engine.Options{KVCacheMB: 16})
	if err != nil {
		t.Fatal(err)
	}
	rep := replica.New("r0", "tiny", e, 8)
	gw, err := gateway.New(gateway.Options{DataDir: t.TempDir()}, rep)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(gw)
	t.Cleanup(func() { ts.Close(); gw.Close(); rep.Close() })
	workload := filepath.Join(t.TempDir(), "w.json")
	if err := os.WriteFile(workload, []byte(`{"seed": 1, "tenants": [
		{"name": "rl", "kind": "rl", "arrivals": 2, "interval_ms": 20, "prompts": 3, "num_samples": 4, "shared_prefix_tokens": 40, "prompt_tokens": 10, "max_tokens": 3, "temperature": 1},
		{"name": "chat", "kind": "chat", "arrivals": 5, "interval_ms": 10, "shared_prefix_tokens": 64, "prompt_tokens": 8, "max_tokens": 3}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	bench := func() map[string]float64 {
		t.Helper()
		var out bytes.Buffer
		old := benchOutput
		benchOutput = &out
		defer func() { benchOutput = old }()
		if err := run([]string{"bench", "serve", "--url", ts.URL, "--workload", workload, "--json"}); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s", out.String())
		var res map[string]float64
		if err := json.Unmarshal(out.Bytes(), &res); err != nil {
			t.Fatalf("output %q: %v", out.String(), err)
		}
		return res
	}
	// The first run's requests may all arrive before any is answered (one sampling batch, an
	// empty cache): what it serves from the cache depends on timing. The second run sends the
	// same prompts (the same seed), every one of them cached by then.
	first := bench()
	res := bench()
	requested := 2*3*4*50 + 5*72 // rl: 2 steps × 3 prompts × 4 samples × 50 positions; chat: 5 × 72
	cached := 2*3*48 + 5*64      // each prompt's whole blocks before its last position
	computed := 2*3*2 + 5*8
	switch {
	case first["requests"] != 2*3+5 || first["failed"] != 0 || res["requests"] != 2*3+5 || res["failed"] != 0:
		t.Fatalf("%v and %v requests, %v and %v failed; want 11 answered each time", first["requests"], res["requests"], first["failed"], res["failed"])
	case res["prompt_tokens_requested"] != float64(requested) || res["sampler_prompt_tokens_total"] != float64(requested):
		t.Fatalf("prompt positions: the bench asked %v, the server counted %v, want %d", res["prompt_tokens_requested"], res["sampler_prompt_tokens_total"], requested)
	case res["sampler_cached_tokens_total"] != float64(cached) || res["prompt_cache_hit_tokens"] != float64(cached):
		t.Fatalf("cached positions: %v at /metrics, %v in the answers; want %d", res["sampler_cached_tokens_total"], res["prompt_cache_hit_tokens"], cached)
	case res["sampler_prefill_tokens_total"] != float64(computed) || res["prefix_cache_hits_total"] != 11:
		t.Fatalf("%v positions computed, %v prompts hit; want %d and 11", res["sampler_prefill_tokens_total"], res["prefix_cache_hits_total"], computed)
	case res["generated_tokens"] <= 0 || res["tokens_per_s"] <= 0:
		t.Fatalf("generated %v tokens at %v/s", res["generated_tokens"], res["tokens_per_s"])
	case res["latency_p50_s"] <= 0 || res["latency_p99_s"] < res["latency_p50_s"] || res["latency_p50_s.chat"] <= 0:
		t.Fatalf("latencies p50 %v, p99 %v, chat's p50 %v", res["latency_p50_s"], res["latency_p99_s"], res["latency_p50_s.chat"])
	case res["kv_cache_bytes"] <= 0 || res["kv_cache_peak_bytes"] < res["kv_cache_bytes"] || res["kv_cache_cap_bytes"] != 16<<20:
		t.Fatalf("KV cache %v bytes (peak %v) of a cap of %v", res["kv_cache_bytes"], res["kv_cache_peak_bytes"], res["kv_cache_cap_bytes"])
	}
}

// A workload file is checked before anything is sent: the ones in workloads/ pass, and bad
// kinds, counts, sizes and unknown fields are refused with what is wrong.
func TestWorkloadFilesAreChecked(t *testing.T) {
	files, err := filepath.Glob("../../workloads/*.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("no workload files (%v)", err)
	}
	for _, f := range files {
		if _, err := readWorkload(f); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
	tenant := `"name": "a", "kind": "chat", "arrivals": 1, "prompt_tokens": 8, "max_tokens": 4`
	for _, c := range []struct{ body, want string }{
		{`{"tenants": []}`, "0 tenants"},
		{`{"tenants": [{` + strings.Replace(tenant, `"chat"`, `"batch"`, 1) + `}]}`, `kind "batch"`},
		{`{"tenants": [{` + strings.Replace(tenant, `"arrivals": 1`, `"arrivals": 0`, 1) + `}]}`, "arrivals 0"},
		{`{"tenants": [{` + tenant + `, "num_samples": 129}]}`, "num_samples 129"},
		{`{"tenants": [{` + tenant + `, "prompts": 2}]}`, "a chat turn is one prompt"},
		{`{"tenants": [{` + strings.Replace(tenant, `"prompt_tokens": 8`, `"prompt_tokens": 0`, 1) + `}]}`, "at least one token"},
		{`{"tenants": [{` + tenant + `}, {` + tenant + `}]}`, "unique"},
		{`{"tenants": [{` + tenant + `, "temperature": -1}]}`, "temperature"},
		{`{"tenants": [{` + tenant + `, "interval": 5}]}`, "unknown field"},
		{`{"vocab": -4, "tenants": [{` + tenant + `}]}`, "vocab -4"},
		{`{"tenants": [{"name": "a", "kind": "rl", "arrivals": 1000, "prompts": 1000, "prompt_tokens": 8, "max_tokens": 4}]}`, "1000000 requests"},
		{`{"tenants": [{"name": "a", "kind": "rl", "arrivals": 10000, "prompts": 10, "prompt_tokens": 1000, "max_tokens": 4}]}`, "100000000 prompt tokens"},
	} {
		f := filepath.Join(t.TempDir(), "w.json")
		if err := os.WriteFile(f, []byte(c.body), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := readWorkload(f); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one containing %q", c.body, err, c.want)
		}
	}
}
