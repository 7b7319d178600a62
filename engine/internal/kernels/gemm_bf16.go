package kernels

import (
	"math"
	"unsafe"
)

// The bf16 GEMM multiplies float32 rows by a weight kept as bf16 bits, as PyTorch's bf16
// autocast does: the rows are rounded to bf16 (to nearest, ties to even), every product is of two
// bf16 values (exact in float32), and the sums are float32. The CPU's bf16 unit takes k two at a
// time: one uint32 holds the pair (k even in the low half, k odd in the high), and one
// instruction adds both products of a pair into a float32 lane (VDPBF16PS: the odd product, then
// the even one). The driver is the float32 GEMM's (gemm.go) over pairs: A is rounded into pairs
// once per product, B's panels are packed in pairs.

// bf16Kernel is the active path's bf16 micro-kernel, nil where the path has none.
func bf16Kernel() *microKernel[uint32] {
	switch {
	case !vectorBuild:
		return nil
	case active == AMX && amxBuilt:
		return &amxMicro
	case active >= AVX512BF16:
		return &avx512bf16Micro
	}
	return nil
}

// amxMinRows is the fewest rows a product takes AMX's tiles for on the AMX path; fewer go
// through AVX512_BF16's kernel. Issue 36 measured, on a 2-core Xeon with AMX, the small preset's
// training at 2 × 256 tokens slower on AMX than on AVX512_BF16 (449 against 651 tokens/s, a
// loaded machine) and at 8 × 256 1.9× faster: products of 512 rows lose to the tiles'
// configuration and packing, of 2,048 gain. 1,024 is between (modelled here: this machine has
// no AMX; the figure to measure again where one is).
const amxMinRows = 1024

// bf16KernelFor is the bf16 micro-kernel a product of M rows takes on the active path.
func bf16KernelFor(M int) *microKernel[uint32] {
	km := bf16Kernel()
	if km == &amxMicro && M < amxMinRows {
		return &avx512bf16Micro
	}
	return km
}

// pairsOf is the number of pairs a row of K values takes for kernel km: ⌈K/2⌉, rounded up to the
// kernel's unit of k (the pairs past K are 0).
func pairsOf(km *microKernel[uint32], K int) int {
	K2 := (K + 1) / 2
	if km.kunit > 1 {
		K2 = roundUp(K2, km.kunit)
	}
	return K2
}

// HaveBF16GEMM reports whether the active path multiplies by bf16 weights in bf16 (BF16MatMul);
// without it a bf16 weight is widened to float32 for the float32 GEMM.
func HaveBF16GEMM() bool { return bf16Kernel() != nil }

// BF16MatMul sets c [M, N] = bf16(a) [M, K] · W, W given as bf16 bits [K, N], or [N, K] when
// transB. The active path must have a bf16 GEMM (HaveBF16GEMM).
func BF16MatMul(c, a []float32, w []uint16, M, K, N int, transB bool) {
	km := bf16KernelFor(M)
	if km == nil {
		panic("kernels: BF16MatMul on a path without a bf16 GEMM")
	}
	bf16GEMM(km, c, a, w, M, K, N, transB)
}

func bf16GEMM(km *microKernel[uint32], c, a []float32, w []uint16, M, K, N int, transB bool) {
	if M == 0 || N == 0 {
		return
	}
	_ = w[K*N-1]
	roundedGEMM(km, c, a, M, K, N, func(dst []uint32, pc, kc, jc, nc int) {
		packPairs(dst, w, K, N, pc, kc, jc, nc, km.nr, transB)
	})
}

// roundedGEMM sets c [M, N] = bf16(a) [M, K] · B: a rounded into pairs once (rows padded to the
// kernel's unit of k), then the driver, with pack writing B's panels of pairs.
func roundedGEMM(km *microKernel[uint32], c, a []float32, M, K, N int, pack func(dst []uint32, pc, kc, jc, nc int)) {
	if M == 0 || N == 0 {
		return
	}
	_, _ = c[M*N-1], a[M*K-1]
	K2 := pairsOf(km, K)
	a2 := getBuffer[uint32](M * K2)
	defer putBuffer(a2)
	ParallelRows(M, func(lo, hi int) { roundPairsPadded(a2, a, lo, hi, K, K2) })
	km.gemm(c, a2, M, K2, N, pack, true)
}

// roundPairs writes rows lo…hi of a [M, K], rounded to bf16, as pairs: dst[r·K2+p] holds a[r, 2p]
// in its low half and a[r, 2p+1] in its high half (0 past K). That is the rows in bf16, one after
// another, each padded to an even length.
func roundPairs(dst []uint32, a []float32, lo, hi, K int) {
	roundPairsPadded(dst, a, lo, hi, K, (K+1)/2)
}

// roundPairsPadded is roundPairs with rows K2 ≥ ⌈K/2⌉ pairs apart, the pairs past K zero.
func roundPairsPadded(dst []uint32, a []float32, lo, hi, K, K2 int) {
	for r := lo; r < hi; r++ {
		out := unsafeSlice((*uint16)(unsafe.Pointer(&dst[r*K2])), 2*K2)
		rows.roundBF16(out[:K], a[r*K:][:K])
		clear(out[K:])
	}
}

// packPairs writes pairs pc…pc+kc of k (k = 2p and 2p+1) of w's columns jc…jc+nc, w [K, N] or
// [N, K] when transB, into panels of nr columns, each kc pairs of nr, 0 past K and past nc.
func packPairs(dst []uint32, w []uint16, K, N, pc, kc, jc, nc, nr int, transB bool) {
	at := func(k, j int) uint32 { // W[k, j] of the [K, N] view, 0 past K
		if k >= K {
			return 0
		}
		if transB {
			return uint32(w[j*K+k])
		}
		return uint32(w[k*N+j])
	}
	for j0 := 0; j0 < nc; j0 += nr {
		wd := min(nr, nc-j0)
		panel := dst[(j0/nr)*kc*nr:][:kc*nr]
		if wd < nr {
			clear(panel)
		}
		for j := range wd {
			col := jc + j0 + j
			if transB && 2*(pc+kc) <= K { // a row of w holds the column's pairs side by side
				src := w[col*K+2*pc:][:2*kc]
				for p := range kc {
					panel[p*nr+j] = uint32(src[2*p]) | uint32(src[2*p+1])<<16
				}
				continue
			}
			for p := range kc {
				k := 2 * (pc + p)
				panel[p*nr+j] = at(k, col) | at(k+1, col)<<16
			}
		}
	}
}

// dotPairBF16 is the arithmetic of one VDPBF16PS lane, the model the assembly is tested
// against: acc plus the product of the pairs' high halves, rounded to float32, plus the product
// of their low halves, rounded again. Each product is exact (it is not rounded, nor flushed when
// it is below float32's normal range: measured on AMD Zen, where the model's bits match the
// instruction's, tiny operands included); denormal inputs count as zero and denormal sums are
// flushed to zero (DAZ, FTZ), whatever MXCSR says. The float64 sum is exact but where acc and
// the product are more than 2^29 apart, and then rounds as the exact sum does but in ties.
func dotPairBF16(acc float32, a, b uint32) float32 {
	acc = flushDenormal(acc)
	acc = flushDenormal(float32(float64(acc) + float64(bf16Value(uint16(a>>16)))*float64(bf16Value(uint16(b>>16)))))
	return flushDenormal(float32(float64(acc) + float64(bf16Value(uint16(a)))*float64(bf16Value(uint16(b)))))
}

// bf16Value widens bf16 bits, a denormal as zero of its sign.
func bf16Value(h uint16) float32 { return flushDenormal(BF16To32(h)) }

func flushDenormal(f float32) float32 {
	if b := math.Float32bits(f); b&0x7f800000 == 0 {
		return math.Float32frombits(b & 0x80000000)
	}
	return f
}

// modelBF16Micro is the bf16 micro-kernel in Go, lane for lane the assembly's arithmetic: it
// drives the same driver (blocking, packing, edges) on any CPU, and is the reference the
// assembly is compared with where the CPU has it.
func modelBF16Micro(mr, nr int) func(kp int, a *uint32, lda int, b *uint32, c *float32, ldc int, first bool) {
	return func(kp int, a *uint32, lda int, b *uint32, c *float32, ldc int, first bool) {
		as := unsafeSlice(a, (mr-1)*lda+kp)
		bs := unsafeSlice(b, kp*nr)
		cs := unsafeSlice(c, (mr-1)*ldc+nr)
		for i := range mr {
			for j := range nr {
				var acc float32
				if !first {
					acc = cs[i*ldc+j]
				}
				for p := range kp {
					acc = dotPairBF16(acc, as[i*lda+p], bs[p*nr+j])
				}
				cs[i*ldc+j] = acc
			}
		}
	}
}
