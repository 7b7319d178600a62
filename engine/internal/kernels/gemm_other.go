//go:build !(goexperiment.simd && amd64)

package kernels

// Without the assembly no path has a GEMM (gemmKernel returns nil before reading these).
var avx2Micro, avx512Micro microKernel[float32]

var avx512bf16Micro microKernel[uint32]

// dot4bf16 is nil: no pairs kernel without the assembly.
var dot4bf16 func(kp int, x, w *uint32, ldw int, out *float32)

// pairsNN is empty: no pairs kernels without the assembly.
var pairsNN [2]func(kp int, x, w *uint32, ldw int, y *float32)

var amxMicro microKernel[uint32]
