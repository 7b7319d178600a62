package engine

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// The direct bf16 products (x·W and x·Wᵀ, vector kernel and scalar loops) agree with a float64
// reference over shapes that leave tails everywhere: rows 1…70 (every row tiling and its
// remainder), K and N not multiples of 8, N spanning partial panels, and products big enough to
// be split across cores. The bound is float32 summation's: K·2⁻²³ of Σ|x·w|.
func TestBF16ProductMatchesFloat64(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	type shape struct{ R, K, N int }
	var shapes []shape
	for R := 1; R <= 70; R++ {
		shapes = append(shapes, shape{R, 67, 83})
	}
	for _, R := range []int{1, 3, 4, 5, 9, 64, 70} {
		for _, K := range []int{1, 7, 9, 130} {
			for _, N := range []int{1, 5, 8, 17, 64, 65, 200} {
				shapes = append(shapes, shape{R, K, N})
			}
		}
	}
	for _, sh := range shapes {
		R, K, N := sh.R, sh.K, sh.N
		x := make([]float32, R*K)
		for i := range x {
			x[i] = float32(rng.NormFloat64())
		}
		w := make([]uint16, K*N)
		for i := range w {
			w[i] = bf16Of(float32(rng.NormFloat64()))
		}
		for _, transB := range []bool{false, true} {
			// W is [K, N], or [N, K] when transB.
			at := func(k, n int) float64 {
				if transB {
					return float64(bf16To32(w[n*K+k]))
				}
				return float64(bf16To32(w[k*N+n]))
			}
			fast, slow := make([]float32, R*N), make([]float32, R*N)
			for i := range fast {
				fast[i], slow[i] = float32(math.NaN()), float32(math.NaN()) // every output must be written
			}
			bf16Product(fast, x, w, R, K, N, transB)
			if transB {
				bf16NTScalar(slow, x, w, R, K, N, 0, N)
			} else {
				bf16NNScalar(slow, x, w, R, K, N, 0, N)
			}
			for r := range R {
				for n := range N {
					var ref, abs float64
					for k := range K {
						p := float64(x[r*K+k]) * at(k, n)
						ref += p
						abs += math.Abs(p)
					}
					tol := float64(K) * 0x1p-23 * abs
					for name, got := range map[string]float32{"kernel": fast[r*N+n], "scalar": slow[r*N+n]} {
						if d := math.Abs(float64(got) - ref); !(d <= tol) {
							t.Fatalf("%s %s: y[%d,%d] = %v, float64 %v (off by %.3g, bound %.3g)",
								name, shapeName(R, K, N, transB), r, n, got, ref, d, tol)
						}
					}
				}
			}
		}
	}
}

func shapeName(R, K, N int, transB bool) string {
	if transB {
		return fmt.Sprintf("[%d,%d]·[%d,%d]ᵀ", R, K, N, K)
	}
	return fmt.Sprintf("[%d,%d]·[%d,%d]", R, K, K, N)
}
