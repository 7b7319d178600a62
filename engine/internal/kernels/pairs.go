package kernels

// A bf16 weight kept as pairs of rows is the layout the bf16 unit multiplies in: W [K, N] becomes
// [⌈K/2⌉, N] uint32s, the pair at (p, n) holding W[2p, n] in its low half and W[2p+1, n] in its
// high half (0 past K). A bf16 engine packs its linear weights so once, at load, on a path with
// the bf16 unit (the same bytes as the file's): the bf16 GEMM then packs its panels by copying
// runs of pairs, and few-row products (every decode step) read the weight in place with one
// VDPBF16PS per 32 products. Products the layout does not suit, or a path without the unit,
// unpack what they need; results do not depend on the layout, only on the path.

// PackPairs returns w [K, N] (bf16 bits, row-major) as pairs of rows.
func PackPairs(w []uint16, K, N int) []uint32 {
	K2 := (K + 1) / 2
	out := make([]uint32, K2*N)
	for p := range K2 {
		lo, dst := w[2*p*N:][:N], out[p*N:][:N]
		if 2*p+1 < K {
			hi := w[(2*p+1)*N:][:N]
			for n := range dst {
				dst[n] = uint32(lo[n]) | uint32(hi[n])<<16
			}
			continue
		}
		for n := range dst {
			dst[n] = uint32(lo[n])
		}
	}
	return out
}

// UnpackPairs returns the weight [K, N] of w2, kept as pairs of rows, as bf16 bits row-major.
func UnpackPairs(w2 []uint32, K, N int) []uint16 {
	out := make([]uint16, K*N)
	for k := range K {
		src, dst, shift := w2[(k/2)*N:][:N], out[k*N:][:N], uint(16*(k%2))
		for n := range dst {
			dst[n] = uint16(src[n] >> shift)
		}
	}
	return out
}

// WidenPairs writes dst [K, N] = the weight of w2 (pairs of rows) as floats.
func WidenPairs[E Float](dst []E, w2 []uint32, K, N int) {
	ParallelRows(K, func(lo, hi int) {
		for k := lo; k < hi; k++ {
			src, row, shift := w2[(k/2)*N:][:N], dst[k*N:][:N], uint(16*(k%2))
			for n := range row {
				row[n] = E(BF16To32(uint16(src[n] >> shift)))
			}
		}
	})
}

// PairsProduct sets y [R, N] = x [R, K] · W for a few rows, W given as pairs of rows of [K, N],
// or of [N, K] when transB (then y = x·Wᵀ). x·W takes the pairs kernels where the path has the
// bf16 unit (x rounded to bf16, as in the bf16 GEMM); the rest unpacks the weight and multiplies
// as BF16Product does.
func PairsProduct(y, x []float32, w2 []uint32, R, K, N int, transB bool) {
	if !transB && pairsNN[0] != nil && bf16Kernel() != nil {
		pairsNNProduct(y, x, w2, R, K, N)
		return
	}
	if transB {
		widenedProduct(y, x, UnpackPairs(w2, N, K), R, K, N, true)
		return
	}
	widenedProduct(y, x, UnpackPairs(w2, K, N), R, K, N, false)
}

// pairsNNProduct: rows rounded to pairs once; columns split across the cores in strips of 128.
func pairsNNProduct(y, x []float32, w2 []uint32, R, K, N int) {
	if R == 0 || N == 0 {
		return
	}
	K2 := (K + 1) / 2
	_, _, _ = y[R*N-1], x[R*K-1], w2[K2*N-1]
	xp := getBuffer[uint32](R * K2)
	defer putBuffer(xp)
	roundPairs(xp, x, 0, R, K)
	const strip = 128
	strips := (N + strip - 1) / strip
	run := func(lo, hi int) {
		for s := lo; s < hi; s++ {
			pairsNNStrip(y, xp, w2, R, K2, N, s*strip, min((s+1)*strip, N))
		}
	}
	if R*K*N < 1<<16 {
		run(0, strips)
		return
	}
	ParallelRows(strips, run)
}

// pairsNNStrip sets columns n0…n1 of every row: 128 or 32 columns per kernel call, each column one
// chain of pair products over p in order; columns past the last 32 run that chain in Go.
func pairsNNStrip(y []float32, xp, w2 []uint32, R, K2, N, n0, n1 int) {
	for r := range R {
		xr := xp[r*K2:][:K2]
		n := n0
		for _, k := range []struct {
			cols int
			run  func(kp int, x, w *uint32, ldw int, y *float32)
		}{{128, pairsNN[0]}, {32, pairsNN[1]}} {
			for ; n+k.cols <= n1; n += k.cols {
				_ = w2[(K2-1)*N+n+k.cols-1]
				_ = y[r*N+n+k.cols-1]
				k.run(K2, &xr[0], &w2[n], N, &y[r*N+n])
			}
		}
		for ; n < n1; n++ {
			var acc float32
			for p, a := range xr {
				acc = dotPairBF16(acc, a, w2[p*N+n])
			}
			y[r*N+n] = acc
		}
	}
}

// pairsNNModel is pairsNN128asm and pairsNN32asm in Go (cols columns): the same chains.
func pairsNNModel(cols int) func(kp int, x, w *uint32, ldw int, y *float32) {
	return func(kp int, x, w *uint32, ldw int, y *float32) {
		xs, ws, ys := unsafeSlice(x, kp), unsafeSlice(w, (kp-1)*ldw+cols), unsafeSlice(y, cols)
		for j := range cols {
			var acc float32
			for p, a := range xs {
				acc = dotPairBF16(acc, a, ws[p*ldw+j])
			}
			ys[j] = acc
		}
	}
}

// PairsMatMul sets c [M, N] = bf16(a) [M, K] · W, W given as pairs of rows of [K, N], or of
// [N, K] when transB. The active path must have a bf16 GEMM (HaveBF16GEMM).
func PairsMatMul(c, a []float32, w2 []uint32, M, K, N int, transB bool) {
	km := bf16KernelFor(M)
	if km == nil {
		panic("kernels: PairsMatMul on a path without a bf16 GEMM")
	}
	pairsGEMM(km, c, a, w2, M, K, N, transB)
}

func pairsGEMM(km *microKernel[uint32], c, a []float32, w2 []uint32, M, K, N int, transB bool) {
	roundedGEMM(km, c, a, M, K, N, func(dst []uint32, pc, kc, jc, nc int) {
		if transB {
			packPairsOfColumns(dst, w2, K, N, pc, kc, jc, nc, km.nr)
		} else {
			packPairsOfRows(dst, w2, N, pc, kc, jc, nc, km.nr)
		}
	})
}

// packPairsOfRows writes pairs pc…pc+kc of columns jc…jc+nc of W [K, N] kept as pairs of rows
// into panels of nr columns: each panel row is a run of the weight's pairs, copied.
func packPairsOfRows(dst, w2 []uint32, N, pc, kc, jc, nc, nr int) {
	for j0 := 0; j0 < nc; j0 += nr {
		wd := min(nr, nc-j0)
		panel := dst[(j0/nr)*kc*nr:][:kc*nr]
		for p := range kc {
			row := panel[p*nr : p*nr+nr : p*nr+nr]
			if (pc+p)*N >= len(w2) { // a pair past K: the kernel's unit of k rounded up
				clear(row)
				continue
			}
			copy(row, w2[(pc+p)*N+jc+j0:][:wd])
			clear(row[wd:])
		}
	}
}

// packPairsOfColumns writes pairs pc…pc+kc of k of W [K, N] = Aᵀ, A [N, K] kept as pairs of rows
// (A[n, k] is half n%2 of the pair (n/2, k)), columns jc…jc+nc, into panels of nr columns: each
// pair of W along k is two halves of A's neighbouring pairs.
func packPairsOfColumns(dst, w2 []uint32, K, N, pc, kc, jc, nc, nr int) {
	for j0 := 0; j0 < nc; j0 += nr {
		wd := min(nr, nc-j0)
		panel := dst[(j0/nr)*kc*nr:][:kc*nr]
		if wd < nr {
			clear(panel)
		}
		for j := range wd {
			n := jc + j0 + j
			src, shift := w2[(n/2)*K:][:K], uint(16*(n%2))
			for p := range kc {
				k := 2 * (pc + p)
				if k >= K { // past K: the kernel's unit of k rounded up
					panel[p*nr+j] = 0
					continue
				}
				v := src[k] >> shift & 0xffff
				if k+1 < K {
					v |= (src[k+1] >> shift & 0xffff) << 16
				}
				panel[p*nr+j] = v
			}
		}
	}
}
