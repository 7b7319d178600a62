//go:build !(goexperiment.simd && amd64)

package kernels

// Without archsimd every kernel is scalar: no vector path is supported.
const (
	vectorBuild = false
	amxBuilt    = false
)

func widenBF16To32(dst []float32, src []uint16) { widenBF16Scalar(dst, src) }
