package cpu

import (
	"sync"

	"github.com/skein-ai/skein/engine/internal/kernels"
	"github.com/skein-ai/skein/engine/internal/quant"
)

// rowsProduct is the product over a block format without a kernel of its own (Format.Product nil): the rows of W dequantized a
// tile of rowsTile outputs at a time into a buffer, then multiplied into every row of x by the
// float32 few-row kernels (kernels.F32ProductNT).
func rowsProduct(deq func([]float32, []byte), block, blockBytes int) func(y, x []float32, w []byte, R, K, N int, parallel func(int, func(int, int))) {
	return func(y, x []float32, w []byte, R, K, N int, parallel func(int, func(int, int))) {
		if R == 0 || N == 0 {
			return
		}
		rowBytes := K / block * blockBytes
		_, _, _ = y[R*N-1], x[R*K-1], w[N*rowBytes-1]
		parallel((N+rowsTile-1)/rowsTile, func(lo, hi int) {
			buf := make([]float32, rowsTile*K)
			for t := lo; t < hi; t++ {
				o0, o1 := t*rowsTile, min((t+1)*rowsTile, N)
				deq(buf[:(o1-o0)*K], w[o0*rowBytes:o1*rowBytes])
				kernels.F32ProductNT(y[o0:], x, buf, R, K, N, 0, o1-o0)
			}
		})
	}
}

// rowsTile is the outputs rowsProduct dequantizes at once: the few-row kernels' unit of 8.
const rowsTile = 8

// rowsProducts holds each format's rowsProduct, made once (a decode step multiplies by every
// quantized weight).
var rowsProducts sync.Map // *quant.Format → productFunc

type productFunc = func(y, x []float32, w []byte, R, K, N int, parallel func(int, func(int, int)))

// rowsProductOf is format qf's rowsProduct.
func rowsProductOf(qf *quant.Format) productFunc {
	if f, ok := rowsProducts.Load(qf); ok {
		return f.(productFunc)
	}
	f, _ := rowsProducts.LoadOrStore(qf, rowsProduct(qf.Dequantize, qf.Block, qf.BlockBytes))
	return f.(productFunc)
}
