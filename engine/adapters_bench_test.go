package engine

import (
	"context"
	"fmt"
	"os"
	"testing"
)

// Sampling 8 requests of 4 samples (32 rows, 32 new tokens each) in one batch: all on one
// adapter, or each on its own (8 adapters, every one's LoRA on its rows: segments.go and, for a
// mixture of experts, each row's experts' LoRA, moe.go). Issue 37's target: 8 adapters at ≥ 0.8×
// one adapter's tokens/s on a MoE. SKEIN_BENCH_MODEL picks the model (default: the tiny-moe
// Qwen3-MoE).
//
//	SKEIN_BENCH_MODEL=DIR go test ./engine -run '^$' -bench BenchmarkAdaptersInOneBatch
func BenchmarkAdaptersInOneBatch(b *testing.B) {
	dir := os.Getenv("SKEIN_BENCH_MODEL")
	if dir == "" {
		dir = tinyModel(b, ArchQwen3MoE)
	}
	e, err := Load(dir, Options{})
	if err != nil {
		b.Fatal(err)
	}
	for i := range 8 {
		if _, err := e.CreateAdapter(fmt.Sprintf("a%d", i), LoraConfig{Rank: 16, Seed: int64(i), TrainAttn: true, TrainMLP: true}); err != nil {
			b.Fatal(err)
		}
		a, _ := e.adapter(fmt.Sprintf("a%d", i))
		for j, p := range a.params { // B non-zero: every LoRA term is real work on real numbers
			if j%2 == 1 {
				w := make([]float64, p.size())
				for k := range w {
					w[k] = 1e-3 * float64((k+j)%7-3)
				}
				p.setFloat64s('w', w)
			}
		}
	}
	seed := int64(2)
	for _, mode := range []struct {
		name     string
		adapters int
	}{{"one-adapter", 1}, {"8-adapters", 8}} {
		b.Run(mode.name, func(b *testing.B) {
			var reqs []SampleRequest
			for i := range 8 {
				prompt := make([]int, 64)
				for k := range prompt {
					prompt[k] = (k*31+7*i)%400 + 3
				}
				reqs = append(reqs, SampleRequest{Adapter: fmt.Sprintf("a%d", i%mode.adapters), Prompt: prompt, NumSamples: 4,
					Params: SampleParams{MaxTokens: 32, Temperature: 1, TopK: -1, TopP: 1, Seed: &seed}})
			}
			tokens := 0
			b.ResetTimer()
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
