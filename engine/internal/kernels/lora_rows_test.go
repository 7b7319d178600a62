package kernels

import (
	"math"
	"math/rand/v2"
	"testing"
)

// LoRARows adds x·Aᵀ·Bs to y, as a float64 reference computes it, on every path the CPU has
// (odd sizes exercise the kernels' tails).
func TestLoRARowsMatchesReference(t *testing.T) {
	for _, p := range SupportedPaths() {
		undo, err := Use(p)
		if err != nil {
			t.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(4, 5))
		for _, sz := range [][4]int{{1, 512, 16, 1536}, {3, 37, 5, 29}, {2, 8, 1, 9}} {
			R, K, r, N := sz[0], sz[1], sz[2], sz[3]
			fill := func(n int) []float32 {
				v := make([]float32, n)
				for i := range v {
					v[i] = float32(rng.NormFloat64())
				}
				return v
			}
			x, a, bs, y := fill(R*K), fill(r*K), fill(r*N), fill(R*N)
			want := make([]float64, R*N)
			for row := range R {
				for n := range N {
					acc := float64(y[row*N+n])
					for j := range r {
						var xa float64
						for k := range K {
							xa += float64(x[row*K+k]) * float64(a[j*K+k])
						}
						acc += xa * float64(bs[j*N+n])
					}
					want[row*N+n] = acc
				}
			}
			LoRARows(y, x, a, bs, R, K, r, N)
			for i, w := range want {
				if d := math.Abs(float64(y[i]) - w); d > 1e-4*(1+math.Abs(w))*math.Sqrt(float64(K*r)) {
					t.Fatalf("%s %v: y[%d] = %v, want %v", p, sz, i, y[i], w)
				}
			}
		}
		undo()
	}
}
