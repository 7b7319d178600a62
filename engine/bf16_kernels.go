package engine

import "math"

// Products of a few rows (decode steps, the sampler's unembedding, short training sequences)
// are bound by reading the weight: widening a bf16 weight into a float32 copy first would read
// two bytes per element, write four and read those four again. Up to directBF16Rows rows the
// product reads the bf16 bits itself instead, widening 8 lanes at a time in registers (a 16-bit
// left shift) into FMA accumulators, so each weight byte is read once per call for all rows
// (bf16_avx2_amd64.go). More rows keep widen + backend matmul (bf16.go), whose tiled kernels
// win once the product is bound by arithmetic. The direct kernel sums in its own order, so its
// results are close to, not bit-identical with, a float32 engine's (TestBF16WeightsComputeAsFloat32).

// directBF16Rows is the most rows a product multiplies by bf16 bits directly.
const directBF16Rows = 64

// directF32Rows is the most rows a product over float32 weights runs in the same tiles
// (f32_*_gen.go, derived from these): the backend matmul packs its operands on every call, which
// for a decode step's few rows costs more than the product.
const directF32Rows = 64

//go:generate go run gen_f32_kernels.go

// baseProduct returns x·W for module lin's base weight, or x·Wᵀ when transposed (an input
// gradient); bias and LoRA are the caller's. A float32 pass of at most directBF16Rows rows over
// a weight kept in bf16 reads the bits directly where the machine has the kernel; everything
// else widens the weight for a backend matmul.
func (s *pass[E]) baseProduct(x mat[E], lin *linear[E], transposed bool) mat[E] {
	transB := lin.outIn != transposed // the stored layout multiplied transposed
	k, n := lin.in, lin.out
	if transposed {
		k, n = n, k
	}
	if xf, ok := any(x.v).([]float32); ok && haveBF16Kernel && len(x.dims) == 2 && x.dims[1] == k {
		rows := x.dims[0]
		if lin.w16 != nil && rows <= directBF16Rows {
			y := s.ar.alloc(rows, n)
			if s.ar.err == nil { // a failed step computes nothing more, as the matmul path
				bf16Product(any(y.v).([]float32), xf, lin.w16, rows, k, n, transB)
			}
			return y
		}
		if wf, ok := any(lin.w.v).([]float32); ok && lin.w16 == nil && rows <= directF32Rows {
			y := s.ar.alloc(rows, n)
			if s.ar.err == nil {
				f32Product(any(y.v).([]float32), xf, wf, rows, k, n, transB)
			}
			return y
		}
	}
	w, done := s.weight(lin)
	y := s.ar.matmul(x, w, 0, transB)
	done()
	return y
}

// bf16Product sets y [R, N] = x [R, K] · W, W given as bf16 bits [K, N], or [N, K] when transB
// (then y = x·Wᵀ). Work is split across the cores by output columns, so every output sums its
// K products in the same order whatever the number of cores.
func bf16Product(y, x []float32, w []uint16, R, K, N int, transB bool) {
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
	parallelRows(units, func(lo, hi int) {
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
				acc = float32(math.FMA(float64(a), float64(bf16To32(w[k*N+j])), float64(acc)))
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
		acc += a * bf16To32(w[k])
	}
	return acc
}

func bf16To32(b uint16) float32 { return math.Float32frombits(uint32(b) << 16) }
