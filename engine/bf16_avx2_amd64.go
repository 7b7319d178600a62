//go:build goexperiment.simd && amd64

package engine

import "simd/archsimd"

// haveBF16Kernel: the direct bf16 product needs AVX2 (8-lane integer widening) and FMA. Without
// them widen + backend matmul is faster than a scalar loop, so the engine keeps it.
var haveBF16Kernel = archsimd.X86.AVX2() && archsimd.X86.FMA()

// The tiles below keep their 8 accumulators (8 lanes each) in registers and widen each weight
// vector once per tile: bf16 bits zero-extended to 32 bits and shifted into the high half are
// the float32 bits. A tile of 4 rows reuses each widened vector for 4 FMAs; a single row needs
// 8 independent accumulators to keep the FMA units busy, so its tiles are 8 vectors wide.

// widen8 returns the 8 bf16 values at the head of w as float32 lanes.
func widen8(w []uint16) archsimd.Float32x8 {
	return archsimd.LoadUint16x8Slice(w).ExtendToUint32().ShiftAllLeft(16).AsFloat32x8()
}

func zero8() archsimd.Float32x8 { return archsimd.BroadcastFloat32x8(0) }

func bcast8(x float32) archsimd.Float32x8 { return archsimd.BroadcastFloat32x8(x) }

// bf16NN sets y[r, j] = Σ_k x[r, k]·W[k, j] for columns j0 ≤ j < j1, W [K, N] as bf16 bits.
// Columns go in panels of 64; within a panel, 16-column strips take rows four at a time (the
// strip, K×32 bytes, stays in cache for the next four), and the rows left over take the panel
// one row at a time. Each output is one chain of FMAs over k in order.
func bf16NN(y, x []float32, w []uint16, R, K, N, j0, j1 int) {
	if !haveBF16Kernel {
		bf16NNScalar(y, x, w, R, K, N, j0, j1)
		return
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
	x0, x1, x2, x3 := x[r*K:][:K], x[(r+1)*K:][:K], x[(r+2)*K:][:K], x[(r+3)*K:][:K]
	a00, a01, a10, a11 := zero8(), zero8(), zero8(), zero8()
	a20, a21, a30, a31 := zero8(), zero8(), zero8(), zero8()
	o := j
	for k := range K {
		wk := w[o : o+16]
		w0, w1 := widen8(wk), widen8(wk[8:])
		b := bcast8(x0[k])
		a00, a01 = w0.MulAdd(b, a00), w1.MulAdd(b, a01)
		b = bcast8(x1[k])
		a10, a11 = w0.MulAdd(b, a10), w1.MulAdd(b, a11)
		b = bcast8(x2[k])
		a20, a21 = w0.MulAdd(b, a20), w1.MulAdd(b, a21)
		b = bcast8(x3[k])
		a30, a31 = w0.MulAdd(b, a30), w1.MulAdd(b, a31)
		o += N
	}
	for i, a := range [4][2]archsimd.Float32x8{{a00, a01}, {a10, a11}, {a20, a21}, {a30, a31}} {
		yr := y[(r+i)*N+j:][:16]
		a[0].StoreSlice(yr)
		a[1].StoreSlice(yr[8:])
	}
}

func nn1x64(y, x []float32, w []uint16, r, K, N, j int) {
	xr := x[r*K:][:K]
	a0, a1, a2, a3 := zero8(), zero8(), zero8(), zero8()
	a4, a5, a6, a7 := zero8(), zero8(), zero8(), zero8()
	o := j
	for k := range K {
		wk := w[o : o+64]
		b := bcast8(xr[k])
		a0, a1 = widen8(wk).MulAdd(b, a0), widen8(wk[8:]).MulAdd(b, a1)
		a2, a3 = widen8(wk[16:]).MulAdd(b, a2), widen8(wk[24:]).MulAdd(b, a3)
		a4, a5 = widen8(wk[32:]).MulAdd(b, a4), widen8(wk[40:]).MulAdd(b, a5)
		a6, a7 = widen8(wk[48:]).MulAdd(b, a6), widen8(wk[56:]).MulAdd(b, a7)
		o += N
	}
	yr := y[r*N+j:][:64]
	for i, a := range [8]archsimd.Float32x8{a0, a1, a2, a3, a4, a5, a6, a7} {
		a.StoreSlice(yr[8*i:])
	}
}

func nn1x16(y, x []float32, w []uint16, r, K, N, j int) {
	xr := x[r*K:][:K]
	a0, a1 := zero8(), zero8()
	o := j
	for k := range K {
		wk := w[o : o+16]
		b := bcast8(xr[k])
		a0, a1 = widen8(wk).MulAdd(b, a0), widen8(wk[8:]).MulAdd(b, a1)
		o += N
	}
	yr := y[r*N+j:][:16]
	a0.StoreSlice(yr)
	a1.StoreSlice(yr[8:])
}

func nn1x8(y, x []float32, w []uint16, r, K, N, j int) {
	xr := x[r*K:][:K]
	a := zero8()
	o := j
	for k := range K {
		a = widen8(w[o:o+8]).MulAdd(bcast8(xr[k]), a)
		o += N
	}
	a.StoreSlice(y[r*N+j:][:8])
}

// bf16NT sets y[r, n] = Σ_k x[r, k]·W[n, k] for n0 ≤ n < n1, W [N, K] as bf16 bits: dot
// products along rows of W, 8 k at a time, lanes summed at the end. W rows go in blocks of 8;
// a block takes x rows four at a time in tiles of two W rows, and the rows left over one at a
// time against all 8 W rows.
func bf16NT(y, x []float32, w []uint16, R, K, N, n0, n1 int) {
	if !haveBF16Kernel {
		bf16NTScalar(y, x, w, R, K, N, n0, n1)
		return
	}
	R4 := R / 4 * 4
	for nb := n0; nb < n1; nb += 8 {
		ne := min(nb+8, n1)
		r := 0
		if ne-nb == 8 {
			for ; r < R4; r += 4 {
				for n := nb; n < ne; n += 2 {
					nt4x2(y, x, w, r, K, N, n)
				}
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

// lanes8 returns the sum of a's lanes.
func lanes8(a archsimd.Float32x8) float32 {
	var l [4]float32
	a.GetLo().Add(a.GetHi()).Store(&l)
	return (l[0] + l[1]) + (l[2] + l[3])
}

func nt4x2(y, x []float32, w []uint16, r, K, N, n int) {
	x0, x1, x2, x3 := x[r*K:][:K], x[(r+1)*K:][:K], x[(r+2)*K:][:K], x[(r+3)*K:][:K]
	w0, w1 := w[n*K:][:K], w[(n+1)*K:][:K]
	a00, a01, a10, a11 := zero8(), zero8(), zero8(), zero8()
	a20, a21, a30, a31 := zero8(), zero8(), zero8(), zero8()
	k := 0
	for ; k+8 <= K; k += 8 {
		v0, v1 := widen8(w0[k:]), widen8(w1[k:])
		b := archsimd.LoadFloat32x8Slice(x0[k:])
		a00, a01 = v0.MulAdd(b, a00), v1.MulAdd(b, a01)
		b = archsimd.LoadFloat32x8Slice(x1[k:])
		a10, a11 = v0.MulAdd(b, a10), v1.MulAdd(b, a11)
		b = archsimd.LoadFloat32x8Slice(x2[k:])
		a20, a21 = v0.MulAdd(b, a20), v1.MulAdd(b, a21)
		b = archsimd.LoadFloat32x8Slice(x3[k:])
		a30, a31 = v0.MulAdd(b, a30), v1.MulAdd(b, a31)
	}
	for i, a := range [4][2]archsimd.Float32x8{{a00, a01}, {a10, a11}, {a20, a21}, {a30, a31}} {
		xr := x[(r+i)*K+k : (r+i+1)*K]
		y[(r+i)*N+n] = lanes8(a[0]) + dotBF16Scalar(xr, w0[k:])
		y[(r+i)*N+n+1] = lanes8(a[1]) + dotBF16Scalar(xr, w1[k:])
	}
}

func nt1x8(y, x []float32, w []uint16, r, K, N, n int) {
	xr := x[r*K:][:K]
	w0, w1, w2, w3 := w[n*K:][:K], w[(n+1)*K:][:K], w[(n+2)*K:][:K], w[(n+3)*K:][:K]
	w4, w5, w6, w7 := w[(n+4)*K:][:K], w[(n+5)*K:][:K], w[(n+6)*K:][:K], w[(n+7)*K:][:K]
	a0, a1, a2, a3 := zero8(), zero8(), zero8(), zero8()
	a4, a5, a6, a7 := zero8(), zero8(), zero8(), zero8()
	k := 0
	for ; k+8 <= K; k += 8 {
		b := archsimd.LoadFloat32x8Slice(xr[k:])
		a0, a1 = widen8(w0[k:]).MulAdd(b, a0), widen8(w1[k:]).MulAdd(b, a1)
		a2, a3 = widen8(w2[k:]).MulAdd(b, a2), widen8(w3[k:]).MulAdd(b, a3)
		a4, a5 = widen8(w4[k:]).MulAdd(b, a4), widen8(w5[k:]).MulAdd(b, a5)
		a6, a7 = widen8(w6[k:]).MulAdd(b, a6), widen8(w7[k:]).MulAdd(b, a7)
	}
	yr := y[r*N+n:][:8]
	for i, a := range [8]archsimd.Float32x8{a0, a1, a2, a3, a4, a5, a6, a7} {
		yr[i] = lanes8(a) + dotBF16Scalar(xr[k:], w[(n+i)*K+k:(n+i+1)*K])
	}
}

// dotBF16 returns Σ x[k]·w[k], w as bf16 bits.
func dotBF16(x []float32, w []uint16) float32 {
	w = w[:len(x)]
	a := zero8()
	k := 0
	for ; k+8 <= len(x); k += 8 {
		a = widen8(w[k:]).MulAdd(archsimd.LoadFloat32x8Slice(x[k:]), a)
	}
	return lanes8(a) + dotBF16Scalar(x[k:], w[k:])
}
