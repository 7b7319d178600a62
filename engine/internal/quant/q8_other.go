//go:build !(goexperiment.simd && amd64)

package quant

func q8Outputs(y, x []float32, w []byte, R, K, N, lo, hi int) {
	q8OutputsScalar(y, x, w, R, K, N, lo, hi)
}

func q8BlockPairs(dst []uint32, stride int, w []byte, at int) {
	q8BlockPairsScalar(dst, stride, w, at)
}

func dotQ8_0(w, a []byte, nb int) float32 { return dotQ8_0Scalar(w, a, nb) }

func q4KScaledLanesSIMD(q []byte, qs *[256]int8, sc *[8]int32, out *[4][8]int32) bool { return false }

func q6KLanesSIMD(x []byte, qs *[256]int8, lanes *[8]int32) bool { return false }

func fmaHW(a, b, c float32) (float32, bool) { return 0, false }

func dotQ4_KSIMD(w []byte, a []BlockQ8_K) (float32, bool) { return 0, false }

func q4KBlockFloats(out *[BlockQ4_K]float32, x []byte) bool { return false }

func q4KBlockPairs(dst []uint32, stride int, x []byte) bool { return false }

func q6KBlockFloats(out *[BlockQ6_K]float32, x []byte) bool { return false }

func q6KBlockPairs(dst []uint32, stride int, x []byte) bool { return false }
