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
