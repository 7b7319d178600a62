package engine

import (
	"context"
	"os"
	"testing"
)

// BenchmarkChatSharedSystemPrompt samples chat requests one after another, each a shared system
// prompt of 512 tokens and a user turn of 32 of its own (one sample, 16 new tokens), with the
// prefix cache (a request computes its user turn and the system prompt's last partial block)
// and without (each computes all 544). It reports tokens/s generated, and the prompt positions
// computed per request. The model is SKEIN_BENCH_MODEL (an attention model: a hybrid's prompts
// are not cached).
func BenchmarkChatSharedSystemPrompt(b *testing.B) {
	dir := os.Getenv("SKEIN_BENCH_MODEL")
	if dir == "" {
		b.Skip("SKEIN_BENCH_MODEL unset")
	}
	e, err := Load(dir, Options{KVCacheMB: 1024})
	if err != nil {
		b.Fatal(err)
	}
	seed := int64(1)
	system := make([]int, 512)
	for i := range system {
		system[i] = (i*37+11)%400 + 3
	}
	turn := 0 // every user turn differs, across the benchmark's rounds too
	for _, mode := range []struct {
		name  string
		cache bool
	}{{"prefix-cache", true}, {"no-cache", false}} {
		b.Run(mode.name, func(b *testing.B) {
			run := func() {
				tokens, before := 0, e.SamplerStats()
				for range b.N {
					turn++
					user := make([]int, 32)
					for k := range user {
						user[k] = (k*53+turn*7+turn/50)%400 + 3
					}
					req := SampleRequest{Prompt: append(append([]int(nil), system...), user...), Params: SampleParams{MaxTokens: 16, Temperature: 1, Seed: &seed}}
					res, err := e.SampleBatch(context.Background(), "", []SampleRequest{req})
					if err != nil {
						b.Fatal(err)
					}
					tokens += len(res[0].Sequences[0].Tokens)
				}
				after := e.SamplerStats()
				b.ReportMetric(float64(tokens)/b.Elapsed().Seconds(), "tokens/s")
				b.ReportMetric(float64(after.PrefillTokens-before.PrefillTokens)/float64(b.N), "prefill-tokens/req")
			}
			if mode.cache {
				// The system prompt cached once, before the timer: the steady state of a server.
				warm := SampleRequest{Prompt: system, Params: SampleParams{MaxTokens: 1}}
				if _, err := e.SampleBatch(context.Background(), "", []SampleRequest{warm}); err != nil {
					b.Fatal(err)
				}
				b.ResetTimer()
				run()
				return
			}
			withoutCache(e, run)
		})
	}
}
