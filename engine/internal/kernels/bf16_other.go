//go:build !(goexperiment.simd && amd64)

package kernels

// Without the vector kernel widen + backend matmul is faster than the scalar loops, which stay
// for tests; the engine keeps the widening path for every product (bf16.go).
func haveBF16Kernel() bool { return false }

func bf16NN(y, x []float32, w []uint16, R, K, N, j0, j1 int) {
	bf16NNScalar(y, x, w, R, K, N, j0, j1)
}

func bf16NT(y, x []float32, w []uint16, R, K, N, n0, n1 int) {
	bf16NTScalar(y, x, w, R, K, N, n0, n1)
}
