package quant

import (
	"sync/atomic"

	xcpu "golang.org/x/sys/cpu"
)

// Format is one block format with what the engine does with it: quantize rows at load,
// dequantize for the float32 GEMM, multiply few rows straight from the blocks, and widen into
// the bf16 GEMM's pairs.
type Format struct {
	Name       string
	Block      int // weights per block, along a row
	BlockBytes int
	Quantize   func(x []float32, n int) ([]byte, error)
	Dequantize func(dst []float32, blocks []byte)
	// Product sets y [R, N] = x [R, K]·Wᵀ for rows W [N, K] held in blocks (nil: the CPU
	// backend dequantizes the rows a few at a time into its few-row kernels).
	Product func(y, x []float32, w []byte, R, K, N int, parallel func(n int, fn func(lo, hi int)))
	// Pairs writes Wᵀ [K, N] rounded to bf16 as pairs of rows (the bf16 GEMM's layout).
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
		Dequantize: DequantizeQ4_K,
		Pairs:      Q4_KPairs, GGMLProduct: ggmlProductQ4_K}
	// Q6_K: Q4_K_M's head and its attn_v and ffn_down on some layers; Q4_K's paths.
	Q6_K = &Format{Name: "q6_k", Block: BlockQ6_K, BlockBytes: BlockBytesQ6_K, Quantize: QuantizeQ6_K,
		Dequantize: DequantizeQ6_K,
		Pairs:      Q6_KPairs, GGMLProduct: ggmlProductK(func(w []byte, a []BlockQ8_K, _ int) float32 { return DotQ6_K(w, a) }, BlockBytesQ6_K)}
)

// vectors reports whether the vector fast paths may run: this CPU has AVX2 and FMA, and the
// engine's kernel path has not been set below them (SetVectors; SKEIN_GEMM=scalar).
func vectors() bool { return vectorsOK.Load() }

var vectorsOK atomic.Bool

func init() { vectorsOK.Store(xcpu.X86.HasAVX2 && xcpu.X86.HasFMA && xcpu.X86.HasAVX) }

// SetVectors turns the vector fast paths off (or back on, where the CPU has them): the CPU
// backend follows its kernel path. Not safe while kernels run.
func SetVectors(on bool) {
	vectorsOK.Store(on && xcpu.X86.HasAVX2 && xcpu.X86.HasFMA && xcpu.X86.HasAVX)
}
