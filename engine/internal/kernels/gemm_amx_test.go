package kernels

import (
	"math"
	"math/rand/v2"
	"testing"
)

// modelAMXKernel is the AMX path's blocking (32×32, k in 16s) with the Go model in place of the
// assembly.
func modelAMXKernel() *microKernel[uint32] {
	km := microKernel[uint32]{name: "amx model", mr: 32, nr: 32, kc: 192, kunit: 16, mc: 96, nc: 2048}
	km.run = amxModelMicro
	return &km
}

// The AMX path's driver (k padded to 16 pairs, 32-row panels, edges), run with the Go model of
// the tiles on any CPU, multiplies the bf16-rounded rows by the weight to float32 accuracy, over
// rows and over pairs of rows, both ways round.
func TestAMXModelMatchesFloat64(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 1))
	km := modelAMXKernel()
	shapes := append([]struct{ M, K, N int }{{32, 32, 32}, {33, 31, 1}, {64, 400, 40}}, bf16Shapes...)
	for _, sh := range shapes {
		M, K, N := sh.M, sh.K, sh.N
		a, w := bf16Operands(rng, M, K, N)
		for _, transB := range []bool{false, true} {
			wl, rows, cols := w, K, N
			if transB {
				wl, rows, cols = TransposeBF16(w, K, N), N, K
			}
			for _, layout := range []string{"rows", "pairs"} {
				c := make([]float32, M*N)
				for i := range c {
					c[i] = float32(math.NaN())
				}
				if layout == "rows" {
					bf16GEMM(km, c, a, wl, M, K, N, transB)
				} else {
					pairsGEMM(km, c, a, PackPairs(wl, rows, cols), M, K, N, transB)
				}
				for i := range M {
					for j := range N {
						var ref, abs float64
						for k := range K {
							p := float64(BF16To32(BF16Of(a[i*K+k]))) * float64(BF16To32(w[k*N+j]))
							ref += p
							abs += math.Abs(p)
						}
						if d := math.Abs(float64(c[i*N+j]) - ref); !(d <= float64(K+1)*0x1p-23*abs) {
							t.Fatalf("%v transB=%v over %s: c[%d,%d] = %v, want %v", sh, transB, layout, i, j, c[i*N+j], ref)
						}
					}
				}
			}
		}
	}
}

// Where the CPU has AMX, the tile kernel agrees with its model to float32 rounding (the model's
// order of sums inside a pair is Intel's description, not yet measured); elsewhere the test says
// so and skips.
func TestAMXAssemblyMatchesModel(t *testing.T) {
	usePath(t, AMX)
	rng := rand.New(rand.NewPCG(9, 2))
	for _, sh := range bf16Shapes {
		M, K, N := sh.M, sh.K, sh.N
		a, w := bf16Operands(rng, M, K, N)
		got, want := make([]float32, M*N), make([]float32, M*N)
		BF16MatMul(got, a, w, M, K, N, false)
		bf16GEMM(modelAMXKernel(), want, a, w, M, K, N, false)
		for i := range got {
			if d := math.Abs(float64(got[i] - want[i])); d > 1e-5*math.Max(1, math.Abs(float64(want[i]))) {
				t.Fatalf("%v: output %d is %v from the tiles, %v from the model", sh, i, got[i], want[i])
			}
		}
	}
}
