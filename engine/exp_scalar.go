//go:build !(goexperiment.simd && amd64)

package engine

func expScaledShift32(v []float32, scale, shift float32) float64 {
	return expScaledShiftScalar(v, scale, shift)
}

func sigmoid32(dst, src []float32) { sigmoidScalar(dst, src) }
