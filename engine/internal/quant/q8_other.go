//go:build !(goexperiment.simd && amd64)

package quant

func q8Outputs(y, x []float32, w []byte, R, K, N, lo, hi int) {
	q8OutputsScalar(y, x, w, R, K, N, lo, hi)
}
