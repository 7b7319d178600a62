package engine

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/skein-ai/skein/engine/internal/backend"
	"github.com/skein-ai/skein/engine/internal/backend/cpu"
	"github.com/skein-ai/skein/engine/internal/kernels"
)

// BenchmarkBF16Product compares, shape by shape, the three ways a product meets its weight: a
// float32 weight in the backend matmul (f32), a bf16 weight widened into a step buffer for that
// matmul (widen), and the direct kernel over the bf16 bits (direct). Shapes are decode steps of
// the small preset (D 512, FFN 1536, tied head of 8192) and one of Qwen3-0.6B (D 1024, FFN
// 3072), at 1, 8 and 64 rows, and two odd shapes for the tails. Run one shape at a time, e.g.
//
//	GOEXPERIMENT=simd go test ./engine -run '^$' -bench 'BF16Product/up_1x' -benchtime 300ms
func BenchmarkBF16Product(b *testing.B) {
	mm, err := cpu.New(1 << 30)
	if err != nil {
		b.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, sh := range []struct {
		name   string
		K, N   int
		transB bool // W stored [N, K] (the tied head), multiplied transposed
	}{
		{name: "up", K: 512, N: 1536},
		{name: "down", K: 1536, N: 512},
		{name: "head", K: 512, N: 8192, transB: true},
		{name: "qwen06up", K: 1024, N: 3072},
		// Odd shapes run the kernels' tails: K%8 = 5 in x·Wᵀ, N%16 = 10 in x·W.
		{name: "oddup", K: 509, N: 1530},
		{name: "oddhead", K: 509, N: 8190, transB: true},
	} {
		wf := make([]float64, sh.K*sh.N)
		w16 := make([]uint16, len(wf))
		for i := range wf {
			w16[i] = kernels.BF16Of(float32(0.05 * rng.NormFloat64()))
			wf[i] = float64(kernels.BF16To32(w16[i]))
		}
		wDims := []int{sh.K, sh.N}
		if sh.transB {
			wDims = []int{sh.N, sh.K}
		}
		long := cpu.NewStep[float32](mm, backend.StepOptions{})
		w32 := long.From(wf, wDims...)
		for _, R := range []int{1, 8, 64} {
			xv := make([]float64, R*sh.K)
			for i := range xv {
				xv[i] = rng.NormFloat64()
			}
			x := long.From(xv, R, sh.K)
			y := make([]float32, R*sh.N)
			run := func(name string, f func(ar step[float32])) {
				b.Run(fmt.Sprintf("%s_%dx%dx%d/%s", sh.name, R, sh.K, sh.N, name), func(b *testing.B) {
					b.SetBytes(int64(2 * len(w16))) // the bf16 weight: MB/s compare across variants
					for b.Loop() {
						ar := cpu.NewStep[float32](mm, backend.StepOptions{})
						f(ar)
						if ar.Err() != nil {
							b.Fatal(ar.Err())
						}
						ar.Free()
					}
				})
			}
			run("f32", func(ar step[float32]) { ar.MatMul(x, w32, 0, sh.transB) })
			run("widen", func(ar step[float32]) {
				w := ar.Alloc(wDims...)
				kernels.WidenBF16(w.V, w16)
				ar.MatMul(x, w, 0, sh.transB)
				ar.ReleaseOne(w)
			})
			run("direct", func(step[float32]) { kernels.BF16Product(y, x.V, w16, R, sh.K, sh.N, sh.transB) })
		}
		long.Free()
	}
}
