package quant

import "github.com/skein-ai/skein/engine/internal/kernels"

// Format is one block format with what the engine does with it: quantize rows at load,
// dequantize for the float32 GEMM, multiply few rows straight from the blocks, and widen into
// the bf16 GEMM's pairs.
type Format struct {
	Name       string
	Block      int // weights per block, along a row
	BlockBytes int
	Quantize   func(x []float32, n int) ([]byte, error)
	Dequantize func(dst []float32, blocks []byte)
	// Product sets y [R, N] = x [R, K]·Wᵀ for rows W [N, K] held in blocks.
	Product func(y, x []float32, w []byte, R, K, N int, parallel func(n int, fn func(lo, hi int)))
	// Pairs writes Wᵀ [K, N] rounded to bf16 as pairs of rows (kernels.PackPairs's layout).
	Pairs func(dst []uint32, w []byte, K, N int, parallel func(n int, fn func(lo, hi int)))
	// GGMLProduct is Product as llama.cpp's CPU backend computes it: x rounded to 8-bit blocks
	// (Q8_0 or Q8_K), integer dot products (ggml.go).
	GGMLProduct func(y, x []float32, w []byte, R, K, N int, parallel func(n int, fn func(lo, hi int)))
}

// The formats, by the --precision names.
var (
	Q8_0 = &Format{Name: "q8_0", Block: BlockQ8_0, BlockBytes: BlockBytesQ8_0, Quantize: QuantizeQ8_0,
		Dequantize: DequantizeQ8_0, Product: Q8_0Product, Pairs: Q8_0Pairs, GGMLProduct: ggmlProductQ8_0}
	Q4_K = &Format{Name: "q4_k", Block: BlockQ4_K, BlockBytes: BlockBytesQ4_K, Quantize: QuantizeQ4_K,
		Dequantize: DequantizeQ4_K, Product: rowsProduct(DequantizeQ4_K, BlockQ4_K, BlockBytesQ4_K),
		Pairs: Q4_KPairs, GGMLProduct: ggmlProductQ4_K}
	// Q6_K: Q4_K_M's head and its attn_v and ffn_down on some layers; Q4_K's paths.
	Q6_K = &Format{Name: "q6_k", Block: BlockQ6_K, BlockBytes: BlockBytesQ6_K, Quantize: QuantizeQ6_K,
		Dequantize: DequantizeQ6_K, Product: rowsProduct(DequantizeQ6_K, BlockQ6_K, BlockBytesQ6_K),
		Pairs: Q6_KPairs, GGMLProduct: ggmlProductK(func(w []byte, a []BlockQ8_K, _ int) float32 { return DotQ6_K(w, a) }, BlockBytesQ6_K)}
)

// rowsProduct is a Product for a format without a kernel of its own: the rows of W dequantized a
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
