package kernels

import "unsafe"

// BF16Product sets y [R, N] = x [R, K] · W for a few rows, W given as bf16 bits [K, N], or [N, K]
// when transB (then y = x·Wᵀ). On a path with the bf16 unit, x·Wᵀ over an even K (a forward
// through a Hugging Face weight, every decode step's product) runs as bf16 pairs, four weight
// rows at a time (dot4bf16asm): the rows rounded to bf16 as in the bf16 GEMM, each output's
// pairs summed in 32 float32 lanes and then across them. Reading a bf16 weight is then as cheap
// as its bytes. Elsewhere the weight is widened in registers and the rows stay float32
// (widenedProduct).
func BF16Product(y, x []float32, w []uint16, R, K, N int, transB bool) {
	if transB && pairsProduct() && K%2 == 0 && K >= 64 && aligned4(w) {
		bf16PairsProduct(y, x, w, R, K, N)
		return
	}
	widenedProduct(y, x, w, R, K, N, transB)
}

// pairsProduct reports whether the active path runs few-row products as bf16 pairs.
func pairsProduct() bool { return bf16Kernel() != nil && dot4bf16 != nil }

func aligned4(w []uint16) bool { return len(w) > 0 && uintptr(unsafe.Pointer(&w[0]))%4 == 0 }

func bf16PairsProduct(y, x []float32, w []uint16, R, K, N int) {
	if R == 0 || N == 0 {
		return
	}
	_, _, _ = y[R*N-1], w[K*N-1], x[R*K-1]
	K2 := K / 2
	xp := getBuffer[uint32](R * K2)
	defer putBuffer(xp)
	roundPairs(xp, x, 0, R, K)
	w2 := unsafeSlice((*uint32)(unsafe.Pointer(&w[0])), N*K2)
	const unit = 4 // weight rows per kernel call
	units := (N + unit - 1) / unit
	if R*K*N < 1<<16 {
		pairsRows(y, xp, w2, R, K2, N, 0, N)
		return
	}
	ParallelRows(units, func(lo, hi int) { pairsRows(y, xp, w2, R, K2, N, lo*unit, min(hi*unit, N)) })
}

// pairsRows sets y[r, n] for n0 ≤ n < n1: four weight rows at a time through the kernel over the
// pairs it takes (a multiple of 32), the rest of each output's pairs added after, in order.
func pairsRows(y []float32, xp, w2 []uint32, R, K2, N, n0, n1 int) {
	body := K2 / 32 * 32
	var out [4]float32
	n := n0
	for ; n+4 <= n1; n += 4 {
		for r := range R {
			xr := xp[r*K2:][:K2]
			dot4bf16(body, &xr[0], &w2[n*K2], K2, &out[0])
			for j := range 4 {
				y[r*N+n+j] = dotPairsTail(out[j], xr[body:], w2[(n+j)*K2+body:][:K2-body])
			}
		}
	}
	for ; n < n1; n++ {
		for r := range R {
			y[r*N+n] = dotPairsTail(0, xp[r*K2:][:K2], w2[n*K2:][:K2])
		}
	}
}

// dotPairsTail adds to acc the pairs' products of x and w, pair after pair (dotPairBF16).
func dotPairsTail(acc float32, x, w []uint32) float32 {
	for p, a := range x {
		acc = dotPairBF16(acc, a, w[p])
	}
	return acc
}

// dot4bf16Model is dot4bf16asm in Go, lane for lane and in the same order of sums: per weight
// row, 16 lanes over the even 16-pair chunks and 16 over the odd ones, added lane by lane, then
// halved (upper 8 plus lower 8, upper 4 plus lower 4) and summed pairwise twice (VHADDPS).
func dot4bf16Model(kp int, x, w *uint32, ldw int, out *float32) {
	xs, ws, o := unsafeSlice(x, kp), unsafeSlice(w, 3*ldw+kp), unsafeSlice(out, 4)
	for j := range 4 {
		var even, odd [16]float32
		for c := 0; c < kp/16; c++ {
			acc := &even
			if c%2 == 1 {
				acc = &odd
			}
			for i := range 16 {
				p := c*16 + i
				acc[i] = dotPairBF16(acc[i], xs[p], ws[j*ldw+p])
			}
		}
		var l [16]float32
		for i := range 16 {
			l[i] = even[i] + odd[i]
		}
		for i := range 8 {
			l[i] += l[i+8]
		}
		for i := range 4 {
			l[i] += l[i+4]
		}
		o[j] = (l[0] + l[1]) + (l[2] + l[3])
	}
}
