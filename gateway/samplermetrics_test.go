package gateway_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/client"
	"github.com/skein-ai/skein/engine"
	"github.com/skein-ai/skein/gateway"
	"github.com/skein-ai/skein/replica"
	"github.com/skein-ai/skein/worker"
)

// With a prefix cache, a prompt sampled again is answered with its cached positions counted in
// prompt_cache_hit_tokens (the first answer has none), and /metrics counts them too.
func TestPromptCacheHitsReachTheAnswerAndMetrics(t *testing.T) {
	e, err := engine.Load(modelDir(), engine.Options{KVCacheMB: 16})
	if err != nil {
		t.Fatal(err)
	}
	rep := replica.New("r0", base, e, 8)
	gw, err := gateway.New(gateway.Options{DataDir: t.TempDir()}, rep)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(gw)
	t.Cleanup(func() { ts.Close(); gw.Close(); rep.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := client.New(ts.URL, "tml-cache")
	prompt := make([]int, 40)
	for i := range prompt {
		prompt[i] = (i*53+7)%400 + 3
	}
	n, mt := 2, 3
	var hits []int
	for range 2 {
		f, err := c.Sample(ctx, api.SampleRequest{BaseModel: base, NumSamples: &n,
			Prompt: api.ModelInput{Chunks: []api.Chunk{{Tokens: prompt}}}, SamplingParams: api.SamplingParams{MaxTokens: &mt}})
		if err != nil {
			t.Fatal(err)
		}
		var res api.SampleResponse
		if err := f.Result(ctx, &res); err != nil || len(res.Sequences) != n {
			t.Fatalf("sample: %v %+v", err, res)
		}
		hits = append(hits, res.PromptCacheHitTokens)
	}
	if hits[0] != 0 || hits[1] != 32 { // 40 positions: 2 whole blocks of 16 before the last
		t.Fatalf("prompt_cache_hit_tokens %v, want 0 then 32", hits)
	}
	body := metricsText(t, ts.URL)
	if v := metricValue(t, body, fmt.Sprintf(`skein_sampler_cached_tokens_total{base_model=%q}`, base)); v != 32 {
		t.Fatalf("/metrics counts %v cached positions, want 32", v)
	}
	if v := metricValue(t, body, fmt.Sprintf(`skein_prefix_cache_cap_bytes{base_model=%q}`, base)); v != 16<<20 {
		t.Fatalf("/metrics shows a cap of %v bytes, want 16 MiB", v)
	}
	// Billing tells the positions computed from those served from the cache: 40 + 8 and 32.
	hour := time.Now().UTC().Truncate(time.Hour)
	var usage api.BillingUsageResponse
	q := "billing/usage/events?starting_on=" + url.QueryEscape(hour.Format(time.RFC3339)) +
		"&ending_before=" + url.QueryEscape(hour.Add(2*time.Hour).Format(time.RFC3339))
	if err := c.Do(ctx, "GET", q, nil, &usage); err != nil {
		t.Fatal(err)
	}
	prefill := map[bool]int64{}
	for _, ev := range usage.Data {
		if ev.EventInfo.Type == "sampling_prefill" && ev.EventInfo.TokenCount != nil && ev.EventInfo.Cached != nil {
			prefill[*ev.EventInfo.Cached] += *ev.EventInfo.TokenCount
		}
	}
	if prefill[false] != 48 || prefill[true] != 32 {
		t.Fatalf("billing's prefill tokens: %d computed and %d cached, want 48 and 32", prefill[false], prefill[true])
	}
}

// A worker's sampler counters reach /metrics through its heartbeat, summed per base model; a
// heartbeat with a counter out of range is refused and changes nothing.
func TestWorkerSamplerCountersReachMetrics(t *testing.T) {
	ts, e, data := newWorkerGateway(t)
	w := newTestWorker(t, e, data)
	code, reply := postWorker(t, ts.URL, "register", clusterToken, registration("w", w.URL, e))
	secret, _ := reply["secret"].(string)
	if code != http.StatusOK || secret == "" {
		t.Fatalf("registration: %d %v", code, reply)
	}
	st := engine.SamplerStats{PromptTokens: 700, PrefillTokens: 300, CachedTokens: 400, CacheCapBytes: 1 << 30}
	if code, _ := postWorker(t, ts.URL, "heartbeat", clusterToken, worker.Heartbeat{ID: "w", Secret: secret, Sampler: &st}); code != http.StatusOK {
		t.Fatalf("heartbeat: %d", code)
	}
	bad := st
	bad.CachedTokens = -5
	if code, _ := postWorker(t, ts.URL, "heartbeat", clusterToken, worker.Heartbeat{ID: "w", Secret: secret, Sampler: &bad}); code != http.StatusBadRequest {
		t.Fatalf("heartbeat with a negative counter: %d", code)
	}
	body := metricsText(t, ts.URL)
	for name, want := range map[string]float64{"skein_sampler_prompt_tokens_total": 700, "skein_sampler_prefill_tokens_total": 300,
		"skein_sampler_cached_tokens_total": 400, "skein_prefix_cache_cap_bytes": 1 << 30} {
		if v := metricValue(t, body, fmt.Sprintf(`%s{base_model=%q}`, name, base)); v != want {
			t.Errorf("%s: %v, want %v", name, v, want)
		}
	}
}
