//go:build !(goexperiment.simd && amd64)

package engine

func expScaledShift32(v []float32, scale, shift float32) float64 {
	return expScaledShiftScalar(v, scale, shift)
}

func sigmoid32(dst, src []float32)               { sigmoidScalar(dst, src) }
func max32(v []float32) float32                  { return maxScalar(v) }
func dot32(a, b []float32) float64               { return dotScalar(a, b) }
func dot3_32(a, b, c []float32) float64          { return dot3Scalar(a, b, c) }
func axpby32(dst, x []float32, alpha float32)    { axpbyScalar(dst, x, alpha) }
func axpy32(dst, x []float32, alpha float32)     { axpyScalar(dst, x, alpha) }
func mulScaled32(dst, a, b []float32, s float32) { mulScaledScalar(dst, a, b, s) }
func rmsBack32(dx, dy, w, x []float32, inv, c float32, accumulate bool) {
	rmsBackScalar(dx, dy, w, x, inv, c, accumulate)
}
func softmaxBackRow32(p, dr []float32, d, scale float32) { softmaxBackRowScalar(p, dr, d, scale) }
func siluGate32(g, u, sig, out []float32)                { siluGateScalar(g, u, sig, out) }
func siluGateBack32(da, g, u, sig, dg, du []float32)     { siluGateBackScalar(da, g, u, sig, dg, du) }
func widenBF16To32(dst []float32, src []uint16)          { widenBF16Scalar(dst, src) }

// Without archsimd every float32 kernel is scalar.
func kernelPathSupported(p kernelPath) bool { return p == pathScalar }
func setKernelPath(p kernelPath) bool       { return p == pathScalar }
func activeKernelPath() kernelPath          { return pathScalar }
