//go:build goexperiment.simd && amd64

package kernels

import "simd/archsimd"

// haveBF16Kernel: the direct bf16 product needs AVX2 (8-lane integer widening) and FMA. Without
// them widen + backend matmul is faster than a scalar loop, so the engine keeps it.
func haveBF16Kernel() bool { return active >= AVX2 }

// The tiles below keep their 8 accumulators (8 lanes each) in registers and widen each weight
// vector once per tile: bf16 bits zero-extended to 32 bits and shifted into the high half are
// the float32 bits. A tile of several rows reuses each widened vector for several FMAs; a single
// row needs 8 independent accumulators to keep the FMA units busy, so its tiles are 8 vectors
// wide.
//
// Like the row kernels (see the note above load8), every function here that runs 256-bit code
// clears the upper halves (VZEROUPPER) after its last vector and before any scalar float code:
// the scalar tails, a lane sum in scalar, its return. TestArchsimdKernelsStayVEX checks it.

// bfWiden8 returns the 8 bf16 values w[i:i+8] as float32 lanes. Loads go through full slice
// expressions of exactly 8 elements: one bounds check and no pointer masking, which halved the
// instructions of the loops (bfWide8 and bfLoad8 take such a slice from loops whose bound the
// compiler proves, and then check nothing).
func bfWiden8(w []uint16, i int) archsimd.Float32x8 { return bfWide8(w[i : i+8 : i+8]) }

func bfWide8(w []uint16) archsimd.Float32x8 {
	return archsimd.LoadUint16x8((*[8]uint16)(w)).ExtendToUint32().ShiftAllLeft(16).AsFloat32x8()
}

func bfLoad8(x []float32) archsimd.Float32x8 { return archsimd.LoadFloat32x8((*[8]float32)(x)) }

// bfStore8 writes a to y[i:i+8].
func bfStore8(a archsimd.Float32x8, y []float32, i int) { a.Store((*[8]float32)(y[i : i+8 : i+8])) }

func bfZero8() archsimd.Float32x8 { return archsimd.BroadcastFloat32x8(0) }

func bfBcast8(x float32) archsimd.Float32x8 { return archsimd.BroadcastFloat32x8(x) }

// bf16NN sets y[r, j] = Σ_k x[r, k]·W[k, j] for columns j0 ≤ j < j1, W [K, N] as bf16 bits.
// Columns go in panels of 64; within a panel, 16-column strips take rows four at a time (the
// strip, K×32 bytes, stays in cache for the next four), and the rows left over take the panel
// one row at a time. Each output is one chain of FMAs over k in order. The assembly kernels
// (bf16NNWide, nn_wide_amd64.go) take what they can first: the tiles are then the rows and
// columns left over.
func bf16NN(y, x []float32, w []uint16, R, K, N, j0, j1 int) {
	if !haveBF16Kernel() {
		bf16NNScalar(y, x, w, R, K, N, j0, j1)
		return
	}
	if rows, cols := bf16NNWide(y, x, w, R, K, N, j0, j1); rows > 0 {
		// The wide kernels did rows [0, rows) of columns [j0, cols): the tiles do the rest.
		if rows < R {
			bf16NN(y[rows*N:], x[rows*K:], w, R-rows, K, N, j0, cols)
		}
		j0 = cols
	}
	R4 := R / 4 * 4
	for jp := j0; jp < j1; jp += 64 {
		pe := min(jp+64, j1)
		strips := jp + (pe-jp)/16*16
		for j := jp; j < strips; j += 16 {
			for r := 0; r < R4; r += 4 {
				nn4x16(y, x, w, r, K, N, j)
			}
		}
		for r := R4; r < R; r++ {
			j := jp
			if pe-jp == 64 {
				nn1x64(y, x, w, r, K, N, j)
				j = pe
			}
			for ; j < strips; j += 16 {
				nn1x16(y, x, w, r, K, N, j)
			}
		}
		vecs := strips + (pe-strips)/8*8
		for r := range R {
			for j := strips; j < vecs; j += 8 {
				nn1x8(y, x, w, r, K, N, j)
			}
		}
		if vecs < pe {
			bf16NNScalar(y, x, w, R, K, N, vecs, pe)
		}
	}
}

func nn4x16(y, x []float32, w []uint16, r, K, N, j int) {
	x0, x1, x2, x3 := r*K, (r+1)*K, (r+2)*K, (r+3)*K
	_ = x[x3+K-1]
	a00, a01, a10, a11 := bfZero8(), bfZero8(), bfZero8(), bfZero8()
	a20, a21, a30, a31 := bfZero8(), bfZero8(), bfZero8(), bfZero8()
	o := j
	for k := range K {
		w0, w1 := bfWiden8(w, o), bfWiden8(w, o+8)
		b := bfBcast8(x[x0+k])
		a00, a01 = w0.MulAdd(b, a00), w1.MulAdd(b, a01)
		b = bfBcast8(x[x1+k])
		a10, a11 = w0.MulAdd(b, a10), w1.MulAdd(b, a11)
		b = bfBcast8(x[x2+k])
		a20, a21 = w0.MulAdd(b, a20), w1.MulAdd(b, a21)
		b = bfBcast8(x[x3+k])
		a30, a31 = w0.MulAdd(b, a30), w1.MulAdd(b, a31)
		o += N
	}
	o = r*N + j
	bfStore8(a00, y, o)
	bfStore8(a01, y, o+8)
	bfStore8(a10, y, o+N)
	bfStore8(a11, y, o+N+8)
	bfStore8(a20, y, o+2*N)
	bfStore8(a21, y, o+2*N+8)
	bfStore8(a30, y, o+3*N)
	bfStore8(a31, y, o+3*N+8)
	archsimd.ClearAVXUpperBits()
}

func nn1x64(y, x []float32, w []uint16, r, K, N, j int) {
	xr := x[r*K:][:K]
	a0, a1, a2, a3 := bfZero8(), bfZero8(), bfZero8(), bfZero8()
	a4, a5, a6, a7 := bfZero8(), bfZero8(), bfZero8(), bfZero8()
	o := j
	for _, xk := range xr {
		b := bfBcast8(xk)
		a0, a1 = bfWiden8(w, o).MulAdd(b, a0), bfWiden8(w, o+8).MulAdd(b, a1)
		a2, a3 = bfWiden8(w, o+16).MulAdd(b, a2), bfWiden8(w, o+24).MulAdd(b, a3)
		a4, a5 = bfWiden8(w, o+32).MulAdd(b, a4), bfWiden8(w, o+40).MulAdd(b, a5)
		a6, a7 = bfWiden8(w, o+48).MulAdd(b, a6), bfWiden8(w, o+56).MulAdd(b, a7)
		o += N
	}
	o = r*N + j
	bfStore8(a0, y, o)
	bfStore8(a1, y, o+8)
	bfStore8(a2, y, o+16)
	bfStore8(a3, y, o+24)
	bfStore8(a4, y, o+32)
	bfStore8(a5, y, o+40)
	bfStore8(a6, y, o+48)
	bfStore8(a7, y, o+56)
	archsimd.ClearAVXUpperBits()
}

func nn1x16(y, x []float32, w []uint16, r, K, N, j int) {
	xr := x[r*K:][:K]
	a0, a1 := bfZero8(), bfZero8()
	o := j
	for _, xk := range xr {
		b := bfBcast8(xk)
		a0, a1 = bfWiden8(w, o).MulAdd(b, a0), bfWiden8(w, o+8).MulAdd(b, a1)
		o += N
	}
	bfStore8(a0, y, r*N+j)
	bfStore8(a1, y, r*N+j+8)
	archsimd.ClearAVXUpperBits()
}

func nn1x8(y, x []float32, w []uint16, r, K, N, j int) {
	xr := x[r*K:][:K]
	a := bfZero8()
	o := j
	for _, xk := range xr {
		a = bfWiden8(w, o).MulAdd(bfBcast8(xk), a)
		o += N
	}
	bfStore8(a, y, r*N+j)
	archsimd.ClearAVXUpperBits()
}

// bf16NT sets y[r, n] = Σ_k x[r, k]·W[n, k] for n0 ≤ n < n1, W [N, K] as bf16 bits: dot
// products along rows of W, 8 k at a time, the lanes summed at the end. W rows go in blocks of
// 8; a block takes x rows two at a time in tiles of four W rows, and a row left over alone
// against all 8. The lanes are summed in vectors (bfHsum4) and stored as vectors: summing them
// through memory (a vector stored, read back as scalars) tripled the time of K=512 products.
// The assembly kernels (bf16NTWide, nn_wide_amd64.go) take the whole blocks first, in the same
// order of sums.
func bf16NT(y, x []float32, w []uint16, R, K, N, n0, n1 int) {
	if !haveBF16Kernel() {
		bf16NTScalar(y, x, w, R, K, N, n0, n1)
		return
	}
	if rows, cols := bf16NTWide(y, x, w, R, K, N, n0, n1); rows > 0 {
		// The assembly kernels did rows [0, rows) of outputs [n0, cols), whole blocks of 8.
		if rows < R {
			bf16NT(y[rows*N:], x[rows*K:], w, R-rows, K, N, n0, cols)
		}
		n0 = cols
	}
	for nb := n0; nb < n1; nb += 8 {
		ne := min(nb+8, n1)
		r := 0
		if ne-nb == 8 {
			for ; r+2 <= R; r += 2 {
				nt2x4(y, x, w, r, K, N, nb)
				nt2x4(y, x, w, r, K, N, nb+4)
			}
			for ; r < R; r++ {
				nt1x8(y, x, w, r, K, N, nb)
			}
		}
		for ; r < R; r++ {
			for n := nb; n < ne; n++ {
				y[r*N+n] = dotBF16(x[r*K:][:K], w[n*K:][:K])
			}
		}
	}
}

// bfLanes8 returns the sum of a's lanes. It is its caller's last vector code: it clears the
// upper halves once the lanes are in memory (a value left in a register across the clear is
// spilled with a legacy-SSE move before it) and adds them in scalar.
func bfLanes8(a archsimd.Float32x8) float32 {
	var l [4]float32
	a.GetLo().Add(a.GetHi()).Store(&l)
	archsimd.ClearAVXUpperBits()
	return (l[0] + l[1]) + (l[2] + l[3])
}

// bfHsum4 returns the sums of the lanes of a0…a3.
func bfHsum4(a0, a1, a2, a3 archsimd.Float32x8) archsimd.Float32x4 {
	u := a0.AddPairsGrouped(a1).AddPairsGrouped(a2.AddPairsGrouped(a3))
	return u.GetLo().Add(u.GetHi())
}

// bfAddTails4 adds x·w0…x·w3 over the last K%8 elements (odd shapes only) to y[0:4], in
// scalar: the caller has stored its vectors and cleared the upper halves.
func bfAddTails4(y, x []float32, w0, w1, w2, w3 []uint16) {
	y = y[:4]
	y[0] += dotBF16Scalar(x, w0)
	y[1] += dotBF16Scalar(x, w1)
	y[2] += dotBF16Scalar(x, w2)
	y[3] += dotBF16Scalar(x, w3)
}

func nt2x4(y, x []float32, w []uint16, r, K, N, n int) {
	x0 := x[r*K:][:K]
	x1 := x[(r+1)*K:][:len(x0)]
	w0, w1 := w[n*K:][:len(x0)], w[(n+1)*K:][:len(x0)]
	w2, w3 := w[(n+2)*K:][:len(x0)], w[(n+3)*K:][:len(x0)]
	a00, a01, a02, a03 := bfZero8(), bfZero8(), bfZero8(), bfZero8()
	a10, a11, a12, a13 := bfZero8(), bfZero8(), bfZero8(), bfZero8()
	k := 0
	for ; k+8 <= len(x0); k += 8 {
		v0, v1 := bfWide8(w0[k:k+8:k+8]), bfWide8(w1[k:k+8:k+8])
		v2, v3 := bfWide8(w2[k:k+8:k+8]), bfWide8(w3[k:k+8:k+8])
		b := bfLoad8(x0[k : k+8 : k+8])
		a00, a01, a02, a03 = v0.MulAdd(b, a00), v1.MulAdd(b, a01), v2.MulAdd(b, a02), v3.MulAdd(b, a03)
		b = bfLoad8(x1[k : k+8 : k+8])
		a10, a11, a12, a13 = v0.MulAdd(b, a10), v1.MulAdd(b, a11), v2.MulAdd(b, a12), v3.MulAdd(b, a13)
	}
	y0, y1 := y[r*N+n:][:4], y[(r+1)*N+n:][:4]
	bfHsum4(a00, a01, a02, a03).StoreSlice(y0)
	bfHsum4(a10, a11, a12, a13).StoreSlice(y1)
	archsimd.ClearAVXUpperBits()
	if k < K {
		bfAddTails4(y0, x0[k:], w0[k:], w1[k:], w2[k:], w3[k:])
		bfAddTails4(y1, x1[k:], w0[k:], w1[k:], w2[k:], w3[k:])
	}
}

func nt1x8(y, x []float32, w []uint16, r, K, N, n int) {
	xr := x[r*K:][:K]
	w0, w1 := w[n*K:][:len(xr)], w[(n+1)*K:][:len(xr)]
	w2, w3 := w[(n+2)*K:][:len(xr)], w[(n+3)*K:][:len(xr)]
	w4, w5 := w[(n+4)*K:][:len(xr)], w[(n+5)*K:][:len(xr)]
	w6, w7 := w[(n+6)*K:][:len(xr)], w[(n+7)*K:][:len(xr)]
	a0, a1, a2, a3 := bfZero8(), bfZero8(), bfZero8(), bfZero8()
	a4, a5, a6, a7 := bfZero8(), bfZero8(), bfZero8(), bfZero8()
	k := 0
	for ; k+8 <= len(xr); k += 8 {
		b := bfLoad8(xr[k : k+8 : k+8])
		a0, a1 = bfWide8(w0[k:k+8:k+8]).MulAdd(b, a0), bfWide8(w1[k:k+8:k+8]).MulAdd(b, a1)
		a2, a3 = bfWide8(w2[k:k+8:k+8]).MulAdd(b, a2), bfWide8(w3[k:k+8:k+8]).MulAdd(b, a3)
		a4, a5 = bfWide8(w4[k:k+8:k+8]).MulAdd(b, a4), bfWide8(w5[k:k+8:k+8]).MulAdd(b, a5)
		a6, a7 = bfWide8(w6[k:k+8:k+8]).MulAdd(b, a6), bfWide8(w7[k:k+8:k+8]).MulAdd(b, a7)
	}
	yr := y[r*N+n:][:8]
	bfHsum4(a0, a1, a2, a3).StoreSlice(yr)
	bfHsum4(a4, a5, a6, a7).StoreSlice(yr[4:])
	archsimd.ClearAVXUpperBits()
	if k < K {
		bfAddTails4(yr, xr[k:], w0[k:], w1[k:], w2[k:], w3[k:])
		bfAddTails4(yr[4:], xr[k:], w4[k:], w5[k:], w6[k:], w7[k:])
	}
}

// dotBF16 returns Σ x[k]·w[k], w as bf16 bits.
func dotBF16(x []float32, w []uint16) float32 {
	w = w[:len(x)]
	a := bfZero8()
	k := 0
	for ; k+8 <= len(x); k += 8 {
		a = bfWide8(w[k:k+8:k+8]).MulAdd(bfLoad8(x[k:k+8:k+8]), a)
	}
	return bfLanes8(a) + dotBF16Scalar(x[k:], w[k:])
}

// bfLoadAt8 returns x[i:i+8] as lanes: the float32 weights' counterpart of bfWiden8 (the
// kernels of f32_avx2_amd64_gen.go are these, loading where these widen).
func bfLoadAt8(x []float32, i int) archsimd.Float32x8 { return bfLoad8(x[i : i+8 : i+8]) }
