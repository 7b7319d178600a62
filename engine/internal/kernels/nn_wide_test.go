//go:build goexperiment.simd && amd64

package kernels

import (
	"math"
	"math/rand/v2"
	"testing"
)

// fewRowCase is one few-row product of one weight kind: y over outputs [c0, N) of every row,
// computed the way the product runs now (with the assembly kernels where the path has them).
type fewRowCase struct {
	name    string
	product func(y []float32)
}

// fewRowCases are x·W (W [K, N]) and x·Wᵀ (W [N, K]) over float32 and over bf16 weights.
func fewRowCases(x, w []float32, w16 []uint16, R, K, N, c0 int) []fewRowCase {
	return []fewRowCase{
		{"f32 x·W", func(y []float32) { f32NN(y, x, w, R, K, N, c0, N) }},
		{"bf16 x·W", func(y []float32) { bf16NN(y, x, w16, R, K, N, c0, N) }},
		{"f32 x·Wᵀ", func(y []float32) { f32NT(y, x, w, R, K, N, c0, N) }},
		{"bf16 x·Wᵀ", func(y []float32) { bf16NT(y, x, w16, R, K, N, c0, N) }},
	}
}

// On every path the few-row products have the bits of the archsimd tiles they replace, and x·W
// the scalar loop's too: each output one chain of FMAs over k in order (x·W), or 8 lanes each a
// chain over its chunks of k summed in one fixed order (x·Wᵀ), whichever kernel computed it
// (AVX-512's 12-, 8- and 4-row kernels over 32 columns, AVX2's 6- and 4-row ones over 16 and
// 3- and 2-row ones against 4 weight rows, the tiles, the scalar tails). Rows 1…30 take every
// mix of them; K leaves tails of k (67, 130, 9) or none (8, 64) or only a tail (1); N spans
// whole panels, a panel and a tail, and a start off the panel grid (a core's share of outputs
// starts at any multiple of 16).
func TestFewRowProductsHaveTheTilesBits(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 5))
	for _, p := range SupportedPaths() {
		usePath(t, p)
		for R := 1; R <= 30; R++ {
			for _, sh := range []struct{ K, N, c0 int }{{67, 45, 0}, {130, 96, 0}, {9, 200, 16}, {8, 40, 0}, {64, 8, 0}, {1, 64, 0}} {
				K, N := sh.K, sh.N
				x, w, w16 := make([]float32, R*K), make([]float32, K*N), make([]uint16, K*N)
				for i := range x {
					x[i] = float32(rng.NormFloat64())
				}
				for i := range w {
					w[i] = float32(rng.NormFloat64())
					w16[i] = BF16Of(w[i])
				}
				for _, c := range fewRowCases(x, w, w16, R, K, N, sh.c0) {
					got, tiles := make([]float32, R*N), make([]float32, R*N)
					for i := range got {
						got[i] = float32(math.NaN())
					}
					c.product(got)
					assembly = false
					c.product(tiles)
					assembly = true
					for r := range R {
						for n := sh.c0; n < N; n++ {
							if g, s := got[r*N+n], tiles[r*N+n]; math.Float32bits(g) != math.Float32bits(s) {
								t.Fatalf("path %s, %s, R %d K %d N %d from %d: y[%d,%d] = %v, the tiles' %v", p, c.name, R, K, N, sh.c0, r, n, g, s)
							}
						}
					}
				}
				slow := make([]float32, R*N)
				f32NNScalar(slow, x, w, R, K, N, sh.c0, N)
				fast := make([]float32, R*N)
				f32NN(fast, x, w, R, K, N, sh.c0, N)
				for i := range slow {
					if math.Float32bits(fast[i]) != math.Float32bits(slow[i]) {
						t.Fatalf("path %s, f32 x·W, R %d K %d N %d: y[%d] = %v, the scalar loop's %v", p, R, K, N, i, fast[i], slow[i])
					}
				}
			}
		}
	}
}
