package worker

import (
	"context"
	"net/http/httptest"
	"path/filepath"
	"testing"

	"github.com/skein-ai/skein/engine"
)

// A worker's status carries its engine's sampler counters (for the gateway's /metrics): after a
// prompt sampled twice, the positions requested, computed and served from its prefix cache and
// the cache's cap, read through the client as the gateway reads them; a report with a negative
// counter is refused.
func TestStatusCarriesTheSamplerCounters(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tiny")
	if err := engine.InitTiny(dir, engine.ArchQwen2, "tiny", 1); err != nil {
		t.Fatal(err)
	}
	e, err := engine.Load(dir, engine.Options{KVCacheMB: 4})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(NewServer(e, "tok", t.TempDir()))
	defer ts.Close()
	c := NewClient(ts.URL, "tok", e.Info())
	ctx := context.Background()
	prompt := make([]int, 40)
	for i := range prompt {
		prompt[i] = (i*53+7)%400 + 3
	}
	for range 2 {
		if _, err := c.SampleBatch(ctx, "", []engine.SampleRequest{{Prompt: prompt, NumSamples: 2, Params: engine.SampleParams{MaxTokens: 2}}}); err != nil {
			t.Fatal(err)
		}
	}
	hb, err := c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := engine.SamplerStats{PromptTokens: 160, PrefillTokens: 40 + 8, CachedTokens: 32}
	if st := hb.Sampler; st == nil || st.PromptTokens != want.PromptTokens || st.PrefillTokens != want.PrefillTokens ||
		st.CachedTokens != want.CachedTokens || st.CacheCapBytes != 4<<20 || st.CacheBytes <= 0 {
		t.Fatalf("status sampler counters %+v, want %+v with a 4 MiB cap and some bytes", st, want)
	}
	bad := Heartbeat{Sampler: &engine.SamplerStats{CachedTokens: -1}}
	if bad.Validate() == nil {
		t.Fatal("a heartbeat with a negative sampler counter passed validation")
	}
}
