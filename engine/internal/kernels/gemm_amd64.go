//go:build goexperiment.simd && amd64

package kernels

// avx2Micro: 6×16 with 12 accumulators (8 lanes each), 12 independent FMA chains to cover the
// FMA units' latency. Go's register allocator spilled the same loop written with archsimd.
var avx2Micro = microKernel[float32]{name: "f32 AVX2 GEMM (6×16 kernel)", mr: 6, nr: 16, kc: 256, mc: 96, nc: 2048, run: micro6x16asmA}

// avx512Micro: 12×32 with 24 zmm accumulators; a B micro-panel of kc = 192 steps is 24 KB (L1).
var avx512Micro = microKernel[float32]{name: "f32 AVX-512 GEMM (12×32 kernel)", mr: 12, nr: 32, kc: 192, mc: 96, nc: 2048, run: micro12x32asm}

// avx512bf16Micro: 12×32 with 24 zmm accumulators over pairs of k (VDPBF16PS); a B micro-panel of
// kc = 192 pairs (384 steps of k) is 24 KB (L1).
var avx512bf16Micro = microKernel[uint32]{name: "bf16 AVX512_BF16 GEMM (12×32 kernel)", mr: 12, nr: 32, kc: 192, mc: 96, nc: 2048, run: micro12x32bf16asm}

//go:noescape
func micro6x16asmA(kc int, a *float32, lda int, b, c *float32, ldc int, first bool)

//go:noescape
func micro12x32asm(kc int, a *float32, lda int, b, c *float32, ldc int, first bool)

//go:noescape
func micro12x32bf16asm(kp int, a *uint32, lda int, b *uint32, c *float32, ldc int, first bool)

//go:noescape
func dot4bf16asm(kp int, x *uint32, w *uint32, ldw int, out *float32)

// dot4bf16 is the few-row bf16 pairs kernel (bf16_pairs.go).
var dot4bf16 = dot4bf16asm

//go:noescape
func pairsNN128asm(kp int, x *uint32, w *uint32, ldw int, y *float32)

//go:noescape
func pairsNN32asm(kp int, x *uint32, w *uint32, ldw int, y *float32)

// pairsNN are the few-row kernels over weights kept as pairs (bf16_pairs.go), 128 and 32 columns
// at a time.
var pairsNN = [2]func(kp int, x, w *uint32, ldw int, y *float32){pairsNN128asm, pairsNN32asm}

// amxMicro: 32×32 in four AMX tiles, k 16 pairs at a time; blocks of 192 pairs (a multiple of 16).
var amxMicro = microKernel[uint32]{name: "bf16 AMX GEMM (32×32 in tiles)", mr: 32, nr: 32, kc: 192, kunit: 16, mc: 96, nc: 2048, run: micro32x32amxasm}

//go:noescape
func micro32x32amxasm(kp int, a *uint32, lda int, b *uint32, c *float32, ldc int, first bool)
