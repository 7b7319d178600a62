//go:build !(goexperiment.simd && amd64)

package quant

func q8Outputs(y, x []float32, w []byte, R, K, N, lo, hi int) {
	q8OutputsScalar(y, x, w, R, K, N, lo, hi)
}

func q8BlockPairs(dst *[BlockQ8_0 / 2]uint32, w []byte, at int) { q8BlockPairsScalar(dst, w, at) }
