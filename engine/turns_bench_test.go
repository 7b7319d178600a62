package engine

import (
	"context"
	"os"
	"testing"
	"time"
)

// BenchmarkTurnGap measures the longest time between two turns (WithTurns) while one request
// of 64 samples of a 128-token prompt is served, with the prefill in chunks (the default) and in
// one pass: the longest another tenant's short sample waits on an in-process replica (issue 40
// item 8). The model is SKEIN_BENCH_MODEL (e.g. init-tiny --preset small --arch qwen3_5).
func BenchmarkTurnGap(b *testing.B) {
	dir := os.Getenv("SKEIN_BENCH_MODEL")
	if dir == "" {
		b.Skip("SKEIN_BENCH_MODEL unset")
	}
	e, err := Load(dir, Options{})
	if err != nil {
		b.Fatal(err)
	}
	prompt := make([]int, 128)
	for i := range prompt {
		prompt[i] = (i*37+11)%400 + 3
	}
	seed := int64(1)
	req := SampleRequest{Prompt: prompt, NumSamples: 64, Params: SampleParams{MaxTokens: 4, Temperature: 1, Seed: &seed}}
	for _, mode := range []struct {
		name  string
		limit int
	}{{"chunked", 0}, {"one-pass", 1 << 30}} {
		b.Run(mode.name, func(b *testing.B) {
			e.prefillLimit = mode.limit
			var worst time.Duration
			for range b.N {
				last := time.Now()
				ctx := WithTurns(context.Background(), func() {
					now := time.Now()
					worst = max(worst, now.Sub(last))
					last = now
				})
				if _, err := e.SampleBatch(ctx, "", []SampleRequest{req}); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(worst.Milliseconds()), "worst-gap-ms")
		})
	}
}

// BenchmarkRLGroup samples GRPO-style groups (8 prompts of 128 tokens × 16 samples, 16 new
// tokens) with each prompt prefilled once for its group and, for comparison, once per sample.
// The model is SKEIN_BENCH_MODEL.
func BenchmarkRLGroup(b *testing.B) {
	dir := os.Getenv("SKEIN_BENCH_MODEL")
	if dir == "" {
		b.Skip("SKEIN_BENCH_MODEL unset")
	}
	e, err := Load(dir, Options{})
	if err != nil {
		b.Fatal(err)
	}
	seed := int64(1)
	var reqs []SampleRequest
	for g := range 8 {
		prompt := make([]int, 128)
		for i := range prompt {
			prompt[i] = (i*37+11*g)%400 + 3
		}
		reqs = append(reqs, SampleRequest{Prompt: prompt, NumSamples: 16, Params: SampleParams{MaxTokens: 16, Temperature: 1, Seed: &seed}})
	}
	for _, mode := range []struct {
		name  string
		share bool
	}{{"shared-prefill", true}, {"prefill-per-sample", false}} {
		b.Run(mode.name, func(b *testing.B) {
			e.noPrefixShare = !mode.share
			defer func() { e.noPrefixShare = false }()
			tokens := 0
			for range b.N {
				res, err := e.SampleBatch(context.Background(), "", reqs)
				if err != nil {
					b.Fatal(err)
				}
				for _, r := range res {
					for _, s := range r.Sequences {
						tokens += len(s.Tokens)
					}
				}
			}
			b.ReportMetric(float64(tokens)/b.Elapsed().Seconds(), "tokens/s")
		})
	}
}
