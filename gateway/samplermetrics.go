package gateway

import (
	"fmt"
	"sort"
	"strings"

	"github.com/skein-ai/skein/engine"
)

// writeSamplerMetrics writes each base model's sampler counters (issue 39): prompt positions
// requested, computed and served from the prefix cache, the cache's lookups, blocks and bytes,
// and the running decode loops' keys and values. The in-process replicas of a model share its
// base and so one cache: the first of them speaks for them; each worker (a process, a cache of
// its own) adds what its last heartbeat reported.
func (s *Server) writeSamplerMetrics(b *strings.Builder) {
	reps := s.allReplicas()
	sort.Slice(reps, func(i, j int) bool { return reps[i].ID() < reps[j].ID() })
	byModel := map[string]engine.SamplerStats{}
	local := map[string]bool{}
	for _, r := range reps {
		m := r.BaseModel()
		if st, ok := r.SamplerStats(); ok {
			if !local[m] {
				local[m] = true
				byModel[m] = byModel[m].Add(st)
			}
			continue
		}
		if hb, ok := s.reported(r.ID()); ok && hb.Sampler != nil {
			byModel[m] = byModel[m].Add(*hb.Sampler)
		}
	}
	models := make([]string, 0, len(byModel))
	for m := range byModel {
		models = append(models, m)
	}
	sort.Strings(models)
	for _, m := range []struct {
		name, kind, help string
		of               func(engine.SamplerStats) int64
	}{
		{"skein_sampler_prompt_tokens_total", "counter", "Prompt positions sampling requested, each sample's prompt counted once per sample.", func(s engine.SamplerStats) int64 { return s.PromptTokens }},
		{"skein_sampler_prefill_tokens_total", "counter", "Prompt positions the sampler computed (a prompt once for its samples, less its cached prefix).", func(s engine.SamplerStats) int64 { return s.PrefillTokens }},
		{"skein_sampler_cached_tokens_total", "counter", "Prompt positions served from the prefix cache.", func(s engine.SamplerStats) int64 { return s.CachedTokens }},
		{"skein_prefix_cache_lookups_total", "counter", "Prompts looked up in the prefix cache.", func(s engine.SamplerStats) int64 { return s.Lookups }},
		{"skein_prefix_cache_hits_total", "counter", "Prompts that found a cached prefix.", func(s engine.SamplerStats) int64 { return s.Hits }},
		{"skein_prefix_cache_evictions_total", "counter", "Prefix cache blocks evicted (least recently used first).", func(s engine.SamplerStats) int64 { return s.EvictedBlocks }},
		{"skein_prefix_cache_bytes", "gauge", "Keys and values the prefix cache holds.", func(s engine.SamplerStats) int64 { return s.CacheBytes }},
		{"skein_prefix_cache_cap_bytes", "gauge", "The prefix cache's cap (--kv-cache-mb; 0: off).", func(s engine.SamplerStats) int64 { return s.CacheCapBytes }},
		{"skein_sampler_loop_kv_bytes", "gauge", "Keys, values and DeltaNet states of the decode loops running now.", func(s engine.SamplerStats) int64 { return s.LoopKVBytes }},
	} {
		fmt.Fprintf(b, "# HELP %s %s\n# TYPE %s %s\n", m.name, m.help, m.name, m.kind)
		for _, model := range models {
			fmt.Fprintf(b, "%s{base_model=%q} %d\n", m.name, model, m.of(byModel[model]))
		}
	}
}
