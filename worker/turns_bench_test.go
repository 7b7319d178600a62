package worker

import (
	"context"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"github.com/skein-ai/skein/engine"
	"github.com/skein-ai/skein/replica"
)

// benchKeeper is an adapter's owner that keeps nothing: the benchmark only trains in memory.
type benchKeeper struct{}

func (benchKeeper) Saved() (string, error)                { return "", nil }
func (benchKeeper) Restored(string)                       {}
func (benchKeeper) Fresh() error                          { return nil }
func (benchKeeper) Claim(context.Context) (string, error) { return "", nil }
func (benchKeeper) Save(context.Context, string, func(string) error) (string, error) {
	return "", nil
}
func (benchKeeper) BeforeStep(context.Context) error { return nil }
func (benchKeeper) Stepped(int)                      {}
func (benchKeeper) Replaced(engine.LoraConfig, int)  {}

// BenchmarkSampleDuringARemoteTrainingOp (issue 39's check: a remote worker's sample during
// another tenant's long training op completes in ≤ 2 s, the in-process figure): the gateway's
// replica over a worker's client over a worker's server, one process; one tenant's
// forward_backward of 8 × 256 tokens, and a third of the way through it another tenant's
// one-token sample of the base model. It reports the sample's latency (sample-s) and the op's
// (op-s), with turns across the protocol ("turns") and with the worker running every call whole
// as before ("whole"). SKEIN_BENCH_MODEL picks the model (default: the tiny preset, generated).
func BenchmarkSampleDuringARemoteTrainingOp(b *testing.B) {
	e := loadTinyQwen3(b, os.Getenv("SKEIN_BENCH_MODEL"))
	info := e.Info()
	const rows, seq = 8, 256
	var data []engine.Datum
	for r := range rows {
		toks, tgts, ws := make([]int, seq), make([]float64, seq), make([]float64, seq)
		for i := range seq {
			toks[i] = (r*131+i*17)%(info.Config.VocabSize-3) + 3
			tgts[i] = float64((r*131+(i+1)*17)%(info.Config.VocabSize-3) + 3)
			ws[i] = 1
		}
		data = append(data, engine.Datum{Tokens: toks, Inputs: map[string]engine.TensorInput{
			"target_tokens": {DType: "int64", Data: tgts}, "weights": {DType: "float32", Data: ws}}})
	}
	for _, mode := range []string{"turns", "whole"} {
		b.Run(mode, func(b *testing.B) {
			if mode == "whole" {
				saved := givesTurns
				givesTurns = map[string]bool{}
				defer func() { givesTurns = saved }()
			}
			ts := httptest.NewServer(NewServer(e, "tok", b.TempDir()))
			defer ts.Close()
			r := replica.New("w", "m", NewClient(ts.URL, "tok", info), 4)
			defer r.Close()
			ctx := context.Background()
			a := replica.Adapter{ID: "train-" + mode, Lane: "trainer", Lora: engine.LoraConfig{Rank: 16, Seed: 1, TrainMLP: true, TrainAttn: true}, State: benchKeeper{}}
			defer r.Evict(ctx, a)
			batch := &engine.Batch{Data: data, Loss: "cross_entropy"}
			start := time.Now()
			if _, err := r.ForwardBackward(ctx, a, batch); err != nil { // places it, and times an op alone
				b.Fatal(err)
			}
			alone := time.Since(start)
			var sampleS, opS float64
			b.ResetTimer()
			for range b.N {
				done := make(chan error, 1)
				start := time.Now()
				go func() {
					_, err := r.ForwardBackward(ctx, a, batch)
					done <- err
				}()
				time.Sleep(alone / 3)
				answered := make(chan replica.SampleOutcome, 1)
				asked := time.Now()
				job := replica.SampleJob{Req: engine.SampleRequest{Prompt: []int{5, 6, 7, 8}, NumSamples: 1, Params: engine.SampleParams{MaxTokens: 1}},
					Done: func(o replica.SampleOutcome) { answered <- o }}
				if err := r.Sample(replica.Weights{Lane: "sampler"}, job); err != nil {
					b.Fatal(err)
				}
				if o := <-answered; o.Err != nil {
					b.Fatal(o.Err)
				}
				sampleS += time.Since(asked).Seconds()
				if err := <-done; err != nil {
					b.Fatal(err)
				}
				opS += time.Since(start).Seconds()
			}
			b.ReportMetric(sampleS/float64(b.N), "sample-s")
			b.ReportMetric(opS/float64(b.N), "op-s")
		})
	}
}
