package kernels

import (
	"math"

	"github.com/skein-ai/skein/engine/internal/num"
)

// Products of a few rows (decode steps, the sampler's unembedding, short training sequences)
// are bound by reading the weight: widening a bf16 weight into a float32 copy first would read
// two bytes per element, write four and read those four again. Up to FewRowsBF16() rows the
// product reads the bf16 bits itself instead, widening 8 lanes at a time in registers (a 16-bit
// left shift) into FMA accumulators, so each weight byte is read once per call for all rows
// (bf16_avx2_amd64.go). More rows keep widen + backend matmul (bf16.go), whose tiled kernels
// win once the product is bound by arithmetic. The direct kernel sums in its own order, so its
// results are close to, not bit-identical with, a float32 engine's (TestBF16WeightsComputeAsFloat32).

// FewRowsBF16 is the most rows a product over a bf16 weight multiplies by the bits directly on
// the active path: past it the bf16 GEMM (from 24 rows, BenchmarkBF16FewRowsOrGEMM) or, without
// one, widening for the float32 GEMM (from 64) is faster.
func FewRowsBF16() int {
	if bf16Kernel() != nil {
		return 24
	}
	return 64
}

// FewRowsF32 is the most rows a product over float32 weights runs in the same tiles
// (f32_*_gen.go, derived from these) on the active path: past it the GEMM, packing B included,
// is faster (BenchmarkFewRowsOrGEMM: past one 12-row panel with AVX-512's, past 64 rows with AVX2's).
func FewRowsF32() int {
	if rowPath(active) >= AVX512 {
		return 12
	}
	return 64
}

//go:generate go run gen_f32_kernels.go

// widenedProduct sets y [R, N] = x [R, K] · W, W given as bf16 bits [K, N], or [N, K] when transB
// (then y = x·Wᵀ). Work is split across the cores by output columns, so every output sums its
// K products in the same order whatever the number of cores.
func widenedProduct(y, x []float32, w []uint16, R, K, N int, transB bool) {
	if R == 0 || N == 0 {
		return
	}
	if K == 0 {
		clear(y[:R*N])
		return
	}
	_, _, _ = y[R*N-1], w[K*N-1], x[R*K-1] // sizes checked once, up front
	kernel := bf16NN
	unit := 16 // columns per unit of work: two 8-lane vectors
	if transB {
		kernel, unit = bf16NT, 8 // rows of W per unit
	}
	units := (N + unit - 1) / unit
	if R*K*N < 1<<16 { // too little work to pay for goroutines
		kernel(y, x, w, R, K, N, 0, N)
		return
	}
	ParallelRows(units, func(lo, hi int) {
		kernel(y, x, w, R, K, N, lo*unit, min(hi*unit, N))
	})
}

// bf16NNScalar sets y[r, j] = Σ_k x[r, k]·W[k, j] for columns j0 ≤ j < j1, W [K, N]: the other
// machines' kernel and the vector kernel's tail.
func bf16NNScalar(y, x []float32, w []uint16, R, K, N, j0, j1 int) {
	for r := range R {
		xr, yr := x[r*K:(r+1)*K], y[r*N:(r+1)*N]
		for j := j0; j < j1; j++ {
			var acc float32
			for k, a := range xr { // fused, as the vector lanes: the same bits as the GEMM's
				acc = float32(math.FMA(float64(a), float64(BF16To32(w[k*N+j])), float64(acc)))
			}
			yr[j] = acc
		}
	}
}

// bf16NTScalar sets y[r, n] = Σ_k x[r, k]·W[n, k] for n0 ≤ n < n1, W [N, K].
func bf16NTScalar(y, x []float32, w []uint16, R, K, N, n0, n1 int) {
	for r := range R {
		xr := x[r*K : (r+1)*K]
		for n := n0; n < n1; n++ {
			y[r*N+n] = dotBF16Scalar(xr, w[n*K:(n+1)*K])
		}
	}
}

// dotBF16Scalar returns Σ x[k]·w[k], w as bf16 bits.
func dotBF16Scalar(x []float32, w []uint16) float32 {
	w = w[:len(x)]
	var acc float32
	for k, a := range x {
		acc += a * BF16To32(w[k])
	}
	return acc
}

// BF16To32 widens bfloat16 bits (num.BF16To32).
func BF16To32(b uint16) float32 { return num.BF16To32(b) }

// BF16Of rounds f to bfloat16, ties to even (num.BF16Of).
func BF16Of(f float32) uint16 { return num.BF16Of(f) }

// TransposeBF16 transposes a [rows, cols] matrix of bf16 bits (num.TransposeBF16).
func TransposeBF16(v []uint16, rows, cols int) []uint16 { return num.TransposeBF16(v, rows, cols) }

// WidenBF16 writes dst[i] = src[i] as a float, split across the cores for big weights.
func WidenBF16[E Float](dst []E, src []uint16) {
	const chunk = 1 << 14
	ParallelRows((len(src)+chunk-1)/chunk, func(lo, hi int) {
		lo, hi = lo*chunk, min(hi*chunk, len(src))
		if d, ok := any(dst).([]float32); ok {
			widenBF16To32(d[lo:hi], src[lo:hi])
			return
		}
		for i, b := range src[lo:hi] {
			dst[lo+i] = E(math.Float32frombits(uint32(b) << 16))
		}
	})
}

func widenBF16Scalar(dst []float32, src []uint16) {
	for i, b := range src {
		dst[i] = math.Float32frombits(uint32(b) << 16)
	}
}

// FewRowKernels reports whether the active path multiplies few rows by float32 or bf16 weights
// directly (BF16Product, F32Product); without it the engine widens and uses its matmul.
func FewRowKernels() bool { return haveBF16Kernel() }

// WidenBF16Cols writes columns [c0, c1) of src, a [rows, cols] matrix of bf16 bits, into dst as
// a [rows, c1−c0] float32 matrix, split across the cores: one chunk of a weight's outputs widened
// for the float32 GEMM without widening the rest.
func WidenBF16Cols(dst []float32, src []uint16, rows, cols, c0, c1 int) {
	n := c1 - c0
	ParallelRows(rows, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			widenBF16To32(dst[r*n:(r+1)*n], src[r*cols+c0:r*cols+c1])
		}
	})
}

// F32ProductNT sets y[r·N + n] = x[r]·w[n] for n0 ≤ n < n1 (x [R, K], w rows of K), on the
// calling goroutine, in F32Product's few-row kernels: for callers that split the work
// themselves, such as the products over quantized weights, a tile of dequantized rows at a time
// (y then starts at the tile's first output, w at its first row).
func F32ProductNT(y, x, w []float32, R, K, N, n0, n1 int) {
	if n1 <= n0 || R == 0 {
		return
	}
	_, _, _ = y[(R-1)*N+n1-1], x[R*K-1], w[n1*K-1]
	f32NT(y, x, w, R, K, N, n0, n1)
}
