//go:build goexperiment.simd && amd64

package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// gemmPaths are the paths with a float32 GEMM of their own.
var gemmPaths = []Path{AVX2, AVX512}

// forGEMMPaths runs f as a subtest on each GEMM path, skipped with "CPU lacks p" where it must be.
func forGEMMPaths(t *testing.T, f func(t *testing.T, km *microKernel[float32])) {
	for _, p := range gemmPaths {
		t.Run(p.String(), func(t *testing.T) {
			usePath(t, p)
			f(t, gemmKernel())
		})
	}
}

// Every path's GEMM agrees with a float64 reference over shapes with every kind of edge: rows not
// a multiple of the micro-kernel's rows (6, 12) or of a block, columns not a multiple of its
// columns (16, 32) or of a panel block, contracting lengths across the packing block (192, 256),
// transposed or not.
func TestGEMMMatchesFloat64(t *testing.T) { forGEMMPaths(t, testGEMMMatchesFloat64) }

func testGEMMMatchesFloat64(t *testing.T, km *microKernel[float32]) {
	rng := rand.New(rand.NewPCG(3, 5))
	type shape struct{ M, K, N int }
	shapes := []shape{{1, 1, 1}, {6, 16, 16}, {7, 17, 15}, {12, 32, 32}, {11, 193, 31}, {25, 385, 65}, {97, 300, 33}, {200, 513, 70}, {13, 5, 2049}, {96, 256, 16}, {300, 64, 2100}}
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
			gemmF32(km, c, a, b, M, K, N, transB, true)
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
func TestGEMMHasTheFewRowKernelsBits(t *testing.T) { forGEMMPaths(t, testGEMMHasTheFewRowKernelsBits) }

func testGEMMHasTheFewRowKernelsBits(t *testing.T, km *microKernel[float32]) {
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
		gemmF32(km, g, a, b, sh.M, sh.K, sh.N, false, true)
		F32Product(f, a, b, sh.M, sh.K, sh.N, false)
		for i := range g {
			if math.Float32bits(g[i]) != math.Float32bits(f[i]) {
				t.Fatalf("%v: output %d is %v from the GEMM, %v from the few-row kernel", sh, i, g[i], f[i])
			}
		}
	}
}

// The engine computes the same logprobs and gradients with either GEMM: a forward_backward on
// the tiny model through the AVX2 GEMM agrees with the backend's matmul to float32 rounding.

// BenchmarkGEMM compares the paths' GEMMs side by side on training shapes (GFLOP/s, best run).
func BenchmarkGEMM(b *testing.B) {
	for _, sh := range []struct {
		M, K, N int
		transB  bool
	}{{1024, 1024, 1024, false}, {2048, 512, 1408, false}, {2048, 1408, 512, false}, {2048, 512, 512, true}, {2048, 512, 8192, true}} {
		name := fmt.Sprintf("%dx%dx%d-t%v", sh.M, sh.K, sh.N, sh.transB)
		flops := 2 * float64(sh.M*sh.K*sh.N)
		x, w, c := make([]float32, sh.M*sh.K), make([]float32, sh.K*sh.N), make([]float32, sh.M*sh.N)
		for i := range x {
			x[i] = float32(i%7) * 0.1
		}
		for i := range w {
			w[i] = float32(i%5) * 0.1
		}
		for _, p := range gemmPaths {
			b.Run(name+"/"+p.String(), func(b *testing.B) {
				usePath(b, p)
				best := time.Hour
				for range b.N {
					s := time.Now()
					MatMul(c, x, w, 1, sh.M, sh.K, sh.N, sh.transB)
					best = min(best, time.Since(s))
				}
				b.ReportMetric(flops/best.Seconds()/1e9, "GFLOP/s")
			})
		}
	}
}

// BenchmarkFewRowsOrGEMM times products of few rows both ways, on the active path: the few-row
// kernels (no packing) and the GEMM (B packed per call). Where the GEMM wins decides
// gemmMinRows.
func BenchmarkFewRowsOrGEMM(b *testing.B) {
	km := gemmKernel()
	if km == nil {
		b.Skip("no GEMM on this path")
	}
	for _, sh := range []struct{ K, N int }{{2048, 512}, {512, 1408}, {512, 8192}} {
		for _, M := range []int{4, 8, 16, 32, 64} {
			x, w, c := make([]float32, M*sh.K), make([]float32, sh.K*sh.N), make([]float32, M*sh.N)
			flops := 2 * float64(M*sh.K*sh.N)
			name := fmt.Sprintf("%dx%dx%d", M, sh.K, sh.N)
			b.Run(name+"/few", func(b *testing.B) {
				for range b.N {
					F32Product(c, x, w, M, sh.K, sh.N, false)
				}
				b.ReportMetric(flops*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
			})
			b.Run(name+"/gemm", func(b *testing.B) {
				for range b.N {
					gemmF32(km, c, x, w, M, sh.K, sh.N, false, true)
				}
				b.ReportMetric(flops*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
			})
		}
	}
}

// MatMulAdd adds the product to what c holds, on every GEMM path, for few rows and many, rank-
// sized K and N, transposed or not: c0 + a·b to float32 accuracy.
func TestMatMulAddAddsTheProduct(t *testing.T) {
	forGEMMPaths(t, func(t *testing.T, km *microKernel[float32]) {
		rng := rand.New(rand.NewPCG(12, 1))
		for _, sh := range []struct{ M, K, N int }{{1, 16, 40}, {5, 16, 16}, {100, 16, 70}, {300, 40, 16}, {97, 300, 33}} {
			for _, transB := range []bool{false, true} {
				M, K, N := sh.M, sh.K, sh.N
				a, b, c := make([]float32, M*K), make([]float32, K*N), make([]float32, M*N)
				for i := range a {
					a[i] = float32(rng.NormFloat64())
				}
				for i := range b {
					b[i] = float32(rng.NormFloat64())
				}
				for i := range c {
					c[i] = float32(rng.NormFloat64())
				}
				c0 := append([]float32(nil), c...)
				MatMulAdd(c, a, b, M, K, N, transB)
				for i := range M {
					for j := range N {
						ref, abs := float64(c0[i*N+j]), math.Abs(float64(c0[i*N+j]))
						for k := range K {
							bv := b[k*N+j]
							if transB {
								bv = b[j*K+k]
							}
							ref += float64(a[i*K+k]) * float64(bv)
							abs += math.Abs(float64(a[i*K+k]) * float64(bv))
						}
						if d := math.Abs(float64(c[i*N+j]) - ref); !(d <= float64(K+1)*0x1p-23*abs) {
							t.Fatalf("%v transB=%v: c[%d,%d] = %v, want %v", sh, transB, i, j, c[i*N+j], ref)
						}
					}
				}
			}
		}
	})
}

// The GEMM's parallel splits — row blocks, and the panels of columns when there are fewer row
// blocks than cores (a LoRA gradient's rank-r rows), with B's packing split by panels — give the
// serial product's bits: each output is the same chain over k.
func TestParallelGEMMHasTheSerialBits(t *testing.T) {
	forGEMMPaths(t, func(t *testing.T, km *microKernel[float32]) {
		rng := rand.New(rand.NewPCG(7, 8))
		for _, sh := range []struct {
			M, K, N int
			transB  bool
		}{{16, 700, 1030, false}, {16, 700, 1030, true}, {13, 2048, 512, false}, {300, 300, 700, true}, {40, 4096, 96, false}} {
			a, b := make([]float32, sh.M*sh.K), make([]float32, sh.K*sh.N)
			for i := range a {
				a[i] = float32(rng.NormFloat64())
			}
			for i := range b {
				b[i] = float32(rng.NormFloat64())
			}
			serial, par := make([]float32, sh.M*sh.N), make([]float32, sh.M*sh.N)
			gemmF32(km, serial, a, b, sh.M, sh.K, sh.N, sh.transB, false)
			gemmF32(km, par, a, b, sh.M, sh.K, sh.N, sh.transB, true)
			for i := range serial {
				if math.Float32bits(serial[i]) != math.Float32bits(par[i]) {
					t.Fatalf("%+v: output %d is %v in parallel, %v serially", sh, i, par[i], serial[i])
				}
			}
		}
	})
}
