//go:build !(goexperiment.simd && amd64)

package kernels

// Without the assembly no path has a GEMM (gemmKernel returns nil before reading these).
var avx2Micro, avx512Micro microKernel[float32]

var avx512bf16Micro microKernel[uint32]
