//go:build !(goexperiment.simd && amd64)

package engine

// Without AVX2 assembly the backend's matmul is the only GEMM.
const haveGEMM = false

func gemmBatched(c, a, b []float32, batch, M, K, N int, transB bool) {
	panic("engine: no AVX2 GEMM in this build")
}
