package replica

import (
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/skein-ai/skein/engine"
)

// BenchmarkArrivingSamples is issue 39's continuous batching, measured: a stream of sampling
// requests (SKEIN_BENCH_ARRIVALS of them, default 24, one every SKEIN_BENCH_INTERVAL, default
// 100ms, from 4 tenants; each 4 samples of 32 new tokens over its own 64-token prompt) on one
// in-process replica, run as continuous loops ("continuous": a request joins the running loop
// between decode steps) and as whole batches ("whole": it waits for the next batch or runs as a
// batch of its own between the running one's layers). It reports generated tokens/s over the
// stream's whole time and each request's latency from its arrival, p50 and p99.
// SKEIN_BENCH_MODEL picks the model (default: the tiny preset, generated).
func BenchmarkArrivingSamples(b *testing.B) {
	var e *engine.Engine
	if dir := os.Getenv("SKEIN_BENCH_MODEL"); dir != "" {
		var err error
		if e, err = engine.Load(dir, engine.Options{}); err != nil {
			b.Fatal(err)
		}
	} else {
		e = tinyEngine(b)
	}
	n, interval := 24, 100*time.Millisecond
	if v := os.Getenv("SKEIN_BENCH_ARRIVALS"); v != "" {
		fmt.Sscan(v, &n)
	}
	if v := os.Getenv("SKEIN_BENCH_INTERVAL"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			b.Fatal(err)
		}
		interval = d
	}
	V := e.Config.VocabSize
	seed := int64(1)
	reqs := make([]engine.SampleRequest, n)
	for i := range reqs {
		prompt := make([]int, 64)
		for k := range prompt {
			prompt[k] = (i*131+k*17)%(V-3) + 3
		}
		reqs[i] = engine.SampleRequest{Prompt: prompt, NumSamples: 4, Params: engine.SampleParams{MaxTokens: 32, Temperature: 1, Seed: &seed}}
		if err := e.Info().ValidateSample(&reqs[i]); err != nil {
			b.Fatal(err)
		}
	}
	for _, mode := range []string{"whole", "continuous"} {
		b.Run(mode, func(b *testing.B) {
			var lat []float64
			generated, wall := 0, 0.0
			for range b.N {
				r := New("r", "m", e, 2)
				r.SetContinuousBatching(mode == "continuous")
				var mu sync.Mutex
				var wg sync.WaitGroup
				start := time.Now()
				for i, q := range reqs {
					time.Sleep(time.Until(start.Add(time.Duration(i) * interval)))
					arrived := time.Now()
					wg.Add(1)
					err := r.Sample(Weights{Lane: fmt.Sprint("t", i%4)}, SampleJob{Req: q, Done: func(o SampleOutcome) {
						defer wg.Done()
						mu.Lock()
						defer mu.Unlock()
						if o.Err != nil {
							b.Error(o.Err)
							return
						}
						lat = append(lat, time.Since(arrived).Seconds())
						for _, s := range o.Result.Sequences {
							generated += len(s.Tokens)
						}
					}})
					if err != nil {
						b.Fatal(err)
					}
				}
				wg.Wait()
				wall += time.Since(start).Seconds()
				r.Close()
			}
			slices.Sort(lat)
			b.ReportMetric(float64(generated)/wall, "tokens/s")
			b.ReportMetric(lat[len(lat)/2], "p50-s")
			b.ReportMetric(lat[len(lat)*99/100], "p99-s")
		})
	}
}
