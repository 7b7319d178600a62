package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// bf16Shapes have every kind of edge for the 12×32 pair kernels: rows not a multiple of 12 or of
// a block (96), columns not a multiple of 32 or of a panel block (2048), odd k, and k across the
// packing block (192 pairs = 384).
var bf16Shapes = []struct{ M, K, N int }{
	{1, 1, 1}, {12, 2, 32}, {11, 3, 31}, {13, 385, 33}, {25, 384, 64}, {97, 800, 65}, {200, 77, 70}, {7, 9, 2049},
}

func bf16Operands(rng *rand.Rand, M, K, N int) ([]float32, []uint16) {
	a, w := make([]float32, M*K), make([]uint16, K*N)
	for i := range a {
		a[i] = float32(rng.NormFloat64())
	}
	for i := range w {
		w[i] = BF16Of(float32(rng.NormFloat64() * 0.5))
	}
	return a, w
}

// modelBF16Kernel is the AVX512_BF16 path's blocking with the Go model in place of the assembly.
func modelBF16Kernel() *microKernel[uint32] {
	km := avx512bf16Micro
	if km.mr == 0 { // a build without the assembly: the same blocking
		km = microKernel[uint32]{name: "model", mr: 12, nr: 32, kc: 192, mc: 96, nc: 2048}
	}
	km.run = modelBF16Micro(km.mr, km.nr)
	return &km
}

// The bf16 GEMM's driver (pairs, packing, blocks, edges), run with the Go model of the
// instruction on any CPU, multiplies the bf16-rounded rows by the bf16 weight to float32
// accuracy: each output within K·2⁻²³·Σ|products| of the float64 sum.
func TestBF16GEMMModelMatchesFloat64(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 1))
	km := modelBF16Kernel()
	for _, sh := range bf16Shapes {
		M, K, N := sh.M, sh.K, sh.N
		a, w := bf16Operands(rng, M, K, N)
		for _, transB := range []bool{false, true} {
			wl := w
			if transB {
				wl = TransposeBF16(w, K, N) // [N, K]
			}
			c := make([]float32, M*N)
			for i := range c {
				c[i] = float32(math.NaN())
			}
			bf16GEMM(km, c, a, wl, M, K, N, transB)
			for i := range M {
				for j := range N {
					var ref, abs float64
					for k := range K {
						p := float64(BF16To32(BF16Of(a[i*K+k]))) * float64(BF16To32(w[k*N+j]))
						ref += p
						abs += math.Abs(p)
					}
					if d := math.Abs(float64(c[i*N+j]) - ref); !(d <= float64(K+1)*0x1p-23*abs) {
						t.Fatalf("%v transB=%v: c[%d,%d] = %v, want %v", sh, transB, i, j, c[i*N+j], ref)
					}
				}
			}
		}
	}
}

// One VDPBF16PS lane, modelled: the high pair's product first, each sum rounded to float32,
// denormal inputs read as zero and denormal sums flushed.
func TestDotPairBF16Model(t *testing.T) {
	pair := func(lo, hi float32) uint32 { return uint32(BF16Of(lo)) | uint32(BF16Of(hi))<<16 }
	for _, c := range []struct {
		acc    float32
		a, b   uint32
		want   float32
		reason string
	}{
		{1, pair(2, 3), pair(5, 7), 1 + 21 + 10, "exact"},
		// 2^24 + 1 (odd product first) rounds to 2^24, then + 1 rounds to 2^24 again: two roundings.
		{0x1p24, pair(1, 1), pair(1, 1), 0x1p24, "odd first, rounded twice"},
		{0, uint32(0x0001) | 0x3f80<<16, pair(1, 0), 0, "denormal input is zero"},
		{-0x1.8p-126, pair(0, 0x1p-63), pair(0, 0x1p-63), 0, "denormal sum flushed"},
	} {
		if got := dotPairBF16(c.acc, c.a, c.b); got != c.want {
			t.Errorf("%s: dotPairBF16(%v, %#x, %#x) = %v, want %v", c.reason, c.acc, c.a, c.b, got, c.want)
		}
	}
}

// Where the CPU has AVX512_BF16, the assembly kernel gives the model's bits on every shape; where
// it does not, the test says so and skips.
func TestBF16GEMMAssemblyMatchesModel(t *testing.T) {
	usePath(t, AVX512BF16)
	rng := rand.New(rand.NewPCG(8, 2))
	model := modelBF16Kernel()
	for _, sh := range bf16Shapes {
		M, K, N := sh.M, sh.K, sh.N
		a, w := bf16Operands(rng, M, K, N)
		for _, transB := range []bool{false, true} {
			wl := w
			if transB {
				wl = TransposeBF16(w, K, N)
			}
			got, want := make([]float32, M*N), make([]float32, M*N)
			BF16MatMul(got, a, wl, M, K, N, transB)
			bf16GEMM(model, want, a, wl, M, K, N, transB)
			for i := range got {
				if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
					t.Fatalf("%v transB=%v: output %d is %v from the assembly, %v from the model", sh, transB, i, got[i], want[i])
				}
			}
		}
	}
	// Tiny operands, whose products and sums are denormal: flushed alike.
	M, K, N := 24, 64, 64
	a, w := bf16Operands(rng, M, K, N)
	for i := range a {
		a[i] *= 0x1p-60
	}
	for i := range w {
		w[i] = BF16Of(BF16To32(w[i]) * 0x1p-66)
	}
	got, want := make([]float32, M*N), make([]float32, M*N)
	BF16MatMul(got, a, w, M, K, N, false)
	bf16GEMM(model, want, a, w, M, K, N, false)
	denormal := 0
	for i := range got {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("tiny operands: output %d is %v from the assembly, %v from the model", i, got[i], want[i])
		}
		if want[i] == 0 {
			denormal++
		}
	}
	t.Logf("tiny operands: %d of %d outputs flushed to zero, the same in both", denormal, len(got))
}

// BenchmarkBF16GEMM compares the bf16 GEMM with the float32 GEMM over the same weight widened
// (what a bf16 engine did before), on training shapes.
func BenchmarkBF16GEMM(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 1))
	for _, sh := range []struct {
		M, K, N int
		transB  bool
	}{{2048, 512, 1408, true}, {2048, 1408, 512, true}, {2048, 512, 512, false}, {2048, 512, 8192, true}} {
		a, w := bf16Operands(rng, sh.M, sh.K, sh.N)
		c := make([]float32, sh.M*sh.N)
		flops := 2 * float64(sh.M*sh.K*sh.N)
		name := fmt.Sprintf("%dx%dx%d-t%v", sh.M, sh.K, sh.N, sh.transB)
		b.Run(name+"/avx512bf16", func(b *testing.B) {
			usePath(b, AVX512BF16)
			for range b.N {
				BF16MatMul(c, a, w, sh.M, sh.K, sh.N, sh.transB)
			}
			b.ReportMetric(flops*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
		b.Run(name+"/widen+avx512", func(b *testing.B) {
			usePath(b, AVX512)
			wf := make([]float32, len(w))
			for range b.N {
				WidenBF16(wf, w)
				MatMul(c, a, wf, 1, sh.M, sh.K, sh.N, sh.transB)
			}
			b.ReportMetric(flops*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}

// BenchmarkBF16FewRowsOrGEMM times products of few rows over a bf16 weight both ways: the
// few-row kernels (the weight widened in registers) and the bf16 GEMM.
func BenchmarkBF16FewRowsOrGEMM(b *testing.B) {
	usePath(b, AVX512BF16)
	rng := rand.New(rand.NewPCG(1, 1))
	for _, sh := range []struct{ K, N int }{{512, 1408}, {512, 8192}} {
		for _, M := range []int{4, 8, 16, 32, 64} {
			x, w := bf16Operands(rng, M, sh.K, sh.N)
			c := make([]float32, M*sh.N)
			flops := 2 * float64(M*sh.K*sh.N)
			name := fmt.Sprintf("%dx%dx%d", M, sh.K, sh.N)
			b.Run(name+"/few", func(b *testing.B) {
				for range b.N {
					BF16Product(c, x, w, M, sh.K, sh.N, true)
				}
				b.ReportMetric(flops*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
			})
			b.Run(name+"/gemm", func(b *testing.B) {
				for range b.N {
					BF16MatMul(c, x, w, M, sh.K, sh.N, true)
				}
				b.ReportMetric(flops*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
			})
		}
	}
}

// pairsShapes: one row and several, K with a tail of pairs after the kernel's multiple of 32
// pairs and without, N with weight rows left over after the groups of four.
var pairsShapes = []struct{ R, K, N int }{{1, 64, 4}, {1, 66, 7}, {3, 512, 33}, {8, 1000, 9}, {24, 130, 1}}

// The few-row pairs product, with the Go model of its kernel in place of the assembly (any
// CPU), multiplies the bf16-rounded rows by the weight to float32 accuracy.
func TestBF16PairsProductModelMatchesFloat64(t *testing.T) {
	saved := dot4bf16
	t.Cleanup(func() { dot4bf16 = saved })
	dot4bf16 = dot4bf16Model
	rng := rand.New(rand.NewPCG(6, 3))
	for _, sh := range pairsShapes {
		x, w := bf16Operands(rng, sh.R, sh.K, sh.N) // w read as [N, K]
		y := make([]float32, sh.R*sh.N)
		bf16PairsProduct(y, x, w, sh.R, sh.K, sh.N)
		for r := range sh.R {
			for n := range sh.N {
				var ref, abs float64
				for k := range sh.K {
					p := float64(BF16To32(BF16Of(x[r*sh.K+k]))) * float64(BF16To32(w[n*sh.K+k]))
					ref += p
					abs += math.Abs(p)
				}
				if d := math.Abs(float64(y[r*sh.N+n]) - ref); !(d <= float64(sh.K)*0x1p-23*abs) {
					t.Fatalf("%v: y[%d,%d] = %v, want %v", sh, r, n, y[r*sh.N+n], ref)
				}
			}
		}
	}
}

// Where the CPU has AVX512_BF16 the pairs kernel gives its model's bits, and BF16Product takes
// it for x·Wᵀ; where it does not, the test says so and skips.
func TestBF16PairsAssemblyMatchesModel(t *testing.T) {
	usePath(t, AVX512BF16)
	if dot4bf16 == nil {
		t.Skip("no pairs kernel in this build")
	}
	rng := rand.New(rand.NewPCG(6, 4))
	for _, sh := range pairsShapes {
		x, w := bf16Operands(rng, sh.R, sh.K, sh.N)
		got, want := make([]float32, sh.R*sh.N), make([]float32, sh.R*sh.N)
		BF16Product(got, x, w, sh.R, sh.K, sh.N, true)
		saved := dot4bf16
		dot4bf16 = dot4bf16Model
		bf16PairsProduct(want, x, w, sh.R, sh.K, sh.N)
		dot4bf16 = saved
		for i := range got {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Fatalf("%v: output %d is %v from the assembly, %v from the model", sh, i, got[i], want[i])
			}
		}
	}
}
