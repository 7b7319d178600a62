//go:build goexperiment.simd && amd64

package engine

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/skein-ai/skein/engine/internal/backend"
	"github.com/skein-ai/skein/engine/internal/backend/cpu"
	"github.com/skein-ai/skein/engine/internal/kernels"
)

func BenchmarkGEMM(b *testing.B) {
	mm, err := cpu.New(0)
	if err != nil {
		b.Fatal(err)
	}
	for _, sh := range []struct {
		M, K, N int
		transB  bool
	}{{1024, 1024, 1024, false}, {2048, 512, 1408, false}, {2048, 1408, 512, false}, {2048, 512, 512, true}, {2048, 512, 8192, true}} {
		name := fmt.Sprintf("%dx%dx%d-t%v", sh.M, sh.K, sh.N, sh.transB)
		flops := 2 * float64(sh.M*sh.K*sh.N)
		ar := cpu.NewStep[float32](mm, backend.StepOptions{})
		x, w := ar.Alloc(sh.M, sh.K), ar.Alloc(sh.K, sh.N)
		if sh.transB {
			w = ar.Alloc(sh.N, sh.K)
		}
		for i := range x.V {
			x.V[i] = float32(i%7) * 0.1
		}
		for i := range w.V {
			w.V[i] = float32(i%5) * 0.1
		}
		c := make([]float32, sh.M*sh.N)
		b.Run(name+"/backend", func(b *testing.B) {
			undo, _ := kernels.Use(kernels.Scalar)
			defer undo()
			best := time.Hour
			for range b.N {
				s := time.Now()
				out := ar.MatMul(x, w, 0, sh.transB)
				best = min(best, time.Since(s))
				ar.ReleaseOne(out)
			}
			b.ReportMetric(flops/best.Seconds()/1e9, "GFLOP/s")
		})
		b.Run(name+"/gemm", func(b *testing.B) {
			best := time.Hour
			for range b.N {
				s := time.Now()
				kernels.MatMul(c, x.V, w.V, 1, sh.M, sh.K, sh.N, sh.transB)
				best = min(best, time.Since(s))
			}
			b.ReportMetric(flops/best.Seconds()/1e9, "GFLOP/s")
		})
		ar.Free()
	}
}

// The engine computes the same logprobs and gradients on every kernel path: a forward_backward on
// the tiny model through each path's GEMM agrees with the backend's matmul (the scalar path) to
// float32 rounding.
func TestGEMMPathsAgreeInTraining(t *testing.T) {
	slow, gSlow := trainOnPath(t, kernels.Scalar)
	for _, p := range []kernels.Path{kernels.AVX2, kernels.AVX512} {
		t.Run(p.String(), func(t *testing.T) {
			fast, gFast := trainOnPath(t, p)
			for i := range slow.Logprobs {
				for j, want := range slow.Logprobs[i] {
					if d := math.Abs(fast.Logprobs[i][j] - want); d > 1e-4 {
						t.Fatalf("datum %d position %d: logprob %v with the %s GEMM, %v with the backend", i, j, fast.Logprobs[i][j], p, want)
					}
				}
			}
			var norm, diff float64
			for i := range gSlow {
				norm += gSlow[i] * gSlow[i]
				diff += (gFast[i] - gSlow[i]) * (gFast[i] - gSlow[i])
			}
			t.Logf("relative gradient difference %.3g", math.Sqrt(diff/norm))
			if norm == 0 || math.Sqrt(diff/norm) > 1e-4 {
				t.Fatalf("gradients differ between the GEMMs: relative %.3g (norm² %v)", math.Sqrt(diff/norm), norm)
			}
		})
	}
}

// trainOnPath runs one forward_backward on the tiny model with every kernel on path p (skipping
// t where the CPU lacks p) and returns its result and the adapter's gradients.
func trainOnPath(t *testing.T, p kernels.Path) (*ForwardResult, []float64) {
	t.Helper()
	undo, err := kernels.Use(p)
	if err != nil {
		t.Skipf("CPU lacks %s", p)
	}
	defer undo()
	e := loadTiny(t, ArchQwen2, Options{})
	if _, err := e.CreateAdapter("a", LoraConfig{Rank: 4, TrainAttn: true, TrainMLP: true, Seed: 3}); err != nil {
		t.Fatal(err)
	}
	ids := make([]int, 90) // more rows than the few-row kernels take
	for i := range ids {
		ids[i] = (i*7 + 3) % e.Config.VocabSize
	}
	res, err := e.ForwardBackward(context.Background(), "a", []Datum{textDatum(ids), textDatum(ids[:70])}, "cross_entropy", nil)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := e.adapter("a")
	var g []float64
	for _, q := range a.params {
		g = append(g, q.float64s('g')...)
	}
	return res, g
}
