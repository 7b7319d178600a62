//go:build goexperiment.simd && amd64

package engine

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// The GEMM agrees with a float64 reference over shapes with every kind of edge: rows not a
// multiple of the micro-kernel's 6 or of a block, columns not a multiple of 16 or of a panel
// block, contracting lengths across the packing block, transposed or not.
func TestGEMMMatchesFloat64(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 5))
	type shape struct{ M, K, N int }
	shapes := []shape{{1, 1, 1}, {6, 16, 16}, {7, 17, 15}, {97, 300, 33}, {200, 513, 70}, {13, 5, 2049}, {96, 256, 16}, {300, 64, 2100}}
	for _, sh := range shapes {
		M, K, N := sh.M, sh.K, sh.N
		a, b := make([]float32, M*K), make([]float32, K*N)
		for i := range a {
			a[i] = float32(rng.NormFloat64())
		}
		for i := range b {
			b[i] = float32(rng.NormFloat64())
		}
		for _, transB := range []bool{false, true} {
			c := make([]float32, M*N)
			for i := range c {
				c[i] = float32(math.NaN())
			}
			gemmF32(c, a, b, M, K, N, transB, true)
			for i := range M {
				for j := range N {
					var ref, abs float64
					for k := range K {
						bv := b[k*N+j]
						if transB {
							bv = b[j*K+k]
						}
						p := float64(a[i*K+k]) * float64(bv)
						ref += p
						abs += math.Abs(p)
					}
					if d := math.Abs(float64(c[i*N+j]) - ref); !(d <= float64(K)*0x1p-23*abs) {
						t.Fatalf("%v transB=%v: c[%d,%d] = %v, want %v", sh, transB, i, j, c[i*N+j], ref)
					}
				}
			}
		}
	}
}

// Each output of the GEMM is one chain of FMAs over k in order, as in the few-row kernels' vector
// lanes: x·W has the same bits whichever computes it, for any K (across packing blocks too). (The
// few-row kernels' scalar tail, columns past a multiple of 8, fuses in float64 and rounds twice:
// equal but for rare double roundings.)
func TestGEMMHasTheFewRowKernelsBits(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	for _, sh := range []struct{ M, K, N int }{{70, 600, 88}, {13, 257, 40}, {96, 256, 16}, {7, 1000, 64}} {
		a, b := make([]float32, sh.M*sh.K), make([]float32, sh.K*sh.N)
		for i := range a {
			a[i] = float32(rng.NormFloat64())
		}
		for i := range b {
			b[i] = float32(rng.NormFloat64())
		}
		g, f := make([]float32, sh.M*sh.N), make([]float32, sh.M*sh.N)
		gemmF32(g, a, b, sh.M, sh.K, sh.N, false, true)
		f32Product(f, a, b, sh.M, sh.K, sh.N, false)
		for i := range g {
			if math.Float32bits(g[i]) != math.Float32bits(f[i]) {
				t.Fatalf("%v: output %d is %v from the GEMM, %v from the few-row kernel", sh, i, g[i], f[i])
			}
		}
	}
}

func BenchmarkGEMM(b *testing.B) {
	backend, err := sharedBackend()
	if err != nil {
		b.Fatal(err)
	}
	for _, sh := range []struct {
		M, K, N int
		transB  bool
	}{{1024, 1024, 1024, false}, {2048, 512, 1408, false}, {2048, 1408, 512, false}, {2048, 512, 512, true}, {2048, 512, 8192, true}} {
		name := fmt.Sprintf("%dx%dx%d-t%v", sh.M, sh.K, sh.N, sh.transB)
		flops := 2 * float64(sh.M*sh.K*sh.N)
		ar := newArena[float32](newMatmuls(backend, 0))
		x, w := ar.alloc(sh.M, sh.K), ar.alloc(sh.K, sh.N)
		if sh.transB {
			w = ar.alloc(sh.N, sh.K)
		}
		for i := range x.v {
			x.v[i] = float32(i%7) * 0.1
		}
		for i := range w.v {
			w.v[i] = float32(i%5) * 0.1
		}
		c := make([]float32, sh.M*sh.N)
		b.Run(name+"/backend", func(b *testing.B) {
			defer setGEMMPath(gemmBackend)()
			best := time.Hour
			for range b.N {
				s := time.Now()
				out := ar.matmul(x, w, 0, sh.transB)
				best = min(best, time.Since(s))
				ar.releaseOne(out)
			}
			b.ReportMetric(flops/best.Seconds()/1e9, "GFLOP/s")
		})
		b.Run(name+"/gemm", func(b *testing.B) {
			best := time.Hour
			for range b.N {
				s := time.Now()
				gemmF32(c, x.v, w.v, sh.M, sh.K, sh.N, sh.transB, true)
				best = min(best, time.Since(s))
			}
			b.ReportMetric(flops/best.Seconds()/1e9, "GFLOP/s")
		})
		ar.free()
	}
}

// The engine computes the same logprobs and gradients with either GEMM: a forward_backward on
// the tiny model through the AVX2 GEMM agrees with the backend's matmul to float32 rounding.
func TestGEMMPathsAgreeInTraining(t *testing.T) {
	if !haveGEMM {
		t.Skip("no AVX2 GEMM on this CPU")
	}
	run := func(k gemmKind) (*ForwardResult, []float64) {
		defer setGEMMPath(k)()
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
			g = append(g, q.g...)
		}
		return res, g
	}
	fast, gFast := run(gemmAVX2)
	slow, gSlow := run(gemmBackend)
	for i := range slow.Logprobs {
		for j, want := range slow.Logprobs[i] {
			if d := math.Abs(fast.Logprobs[i][j] - want); d > 1e-4 {
				t.Fatalf("datum %d position %d: logprob %v with the AVX2 GEMM, %v with the backend", i, j, fast.Logprobs[i][j], want)
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
}
