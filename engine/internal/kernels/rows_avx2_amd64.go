//go:build goexperiment.simd && amd64

package kernels

import (
	"simd/archsimd"

	"github.com/skein-ai/skein/engine/internal/cpu"
)

// The 8-lane kernels below are the AVX2+FMA versions of the 16-lane ones in rows_avx512_amd64.go, for
// CPUs without AVX-512 (AMD before Zen 4, Intel client parts). They use only AVX, AVX2 and FMA
// instructions: several Float32x8 methods (RoundToEvenScaled, Scale, ConvertToFloat64) are
// AVX-512 instructions and would fault here.
//
// Go compiles scalar float code to legacy SSE and does not yet clear the upper halves of the
// vector registers between the two; on the CI machine (AMD EPYC, virtualised) an SSE
// instruction run while they are dirty costs about a hundred nanoseconds (a 15-float dot took
// 136 ns against 16). So a kernel runs no scalar float code between its first vector
// instruction and ClearAVXUpperBits (VZEROUPPER), which it calls once its last vector is
// stored. A row of n ≥ 8 has no scalar tail: its last 8 elements are one more vector,
// overlapping the loop's last one where n%8 ≠ 0, computed before the loop from the inputs and
// stored after it (so an in-place kernel writes the overlap twice with the same values); a
// reduction masks out the lanes the loop already counted. Rows shorter than 8 run scalar,
// with no vector code at all. (Masked loads of the tail, LoadFloat32x8SlicePart, would also
// do, but they convert a short slice to *[8]float32, which checkptr, on under -race, rejects.)
// Also: exp8 is inlined (a call spills around it), no array literal is copied inside a loop
// and a zero accumulator is declared (bcast8(0) is a legacy XORPS). TestAVX2KernelsStayVEX
// checks the compiled code for all of this.

func load8(v []float32) archsimd.Float32x8 { return archsimd.LoadFloat32x8Slice(v) }

// last8 loads the last 8 elements of v (len(v) ≥ 8).
func last8(v []float32) archsimd.Float32x8 { return load8(v[len(v)-8:]) }

// iota8 numbers the lanes, for newLanes8.
var iota8 = [8]int32{0, 1, 2, 3, 4, 5, 6, 7}

// newLanes8 marks, in the vector of the last 8 elements of a row of n, the lanes that the
// loop's full vectors did not cover: the top n%8 (none when n%8 = 0).
func newLanes8(n int) archsimd.Mask32x8 {
	return archsimd.LoadInt32x8Slice(iota8[:]).Greater(archsimd.BroadcastInt32x8(int32(7 - n%8)))
}

func bcast8(x float32) archsimd.Float32x8 { return archsimd.BroadcastFloat32x8(x) }

// lanesSum8 stores x, clears the upper halves and adds up the lanes in float64.
func lanesSum8(x archsimd.Float32x8) float64 {
	var l [8]float32
	x.Store(&l)
	archsimd.ClearAVXUpperBits()
	var s float64
	for i := range l {
		s += float64(l[i])
	}
	return s
}

// exp8 is exp16 on 8 lanes. AVX2 has no VSCALEFPS, so 2^k is added to the exponent bits of
// p = e^r instead (as Exp32 does): p is in [0.7, 1.42] and the clamp keeps k in [−126, 128]
// with p < 1 at k = 128 and p > 1 at k = −126, so the result is always a normal float32.
// NaN lanes are put back at the end, as Exp32 returns them: the clamp alone would turn them
// into a bound (VMAXPS/VMINPS return one operand when either is NaN, and the compiler may
// swap the operands, Max and Min being commutative).
func exp8(x archsimd.Float32x8) archsimd.Float32x8 {
	c := x.Max(bcast8(-87.3)).Min(bcast8(88.7))
	k := c.Mul(bcast8(1.44269504088896341)).RoundToEven()
	r := k.MulAdd(bcast8(-0.693145751953125), c)
	r = k.MulAdd(bcast8(-1.42860682030941723212e-6), r)
	p := bcast8(1.0 / 720)
	for i := range expPoly {
		p = p.MulAdd(r, bcast8(expPoly[i]))
	}
	e := p.AsInt32x8().Add(k.ConvertToInt32().ShiftAllLeft(23)).AsFloat32x8()
	return x.Merge(e, x.IsNaN())
}

// expPoly are the Taylor coefficients of e^r after the 1/720 of r⁶, highest first. A package
// array indexed in place (not a literal ranged over, which is copied with SSE moves on every
// call) keeps exp8 small enough to inline.
var expPoly = [...]float32{1.0 / 120, 1.0 / 24, 1.0 / 6, 0.5, 1, 1}

func expScaledShift8(v []float32, scale, shift float32) float64 {
	n := len(v)
	if n < 8 {
		return expScaledShiftScalar(v, scale, shift)
	}
	sc, sh := bcast8(scale), bcast8(-shift)
	last := exp8(last8(v).MulAdd(sc, sh))
	var acc archsimd.Float32x8
	for i := 0; i+8 <= n; i += 8 {
		e := exp8(load8(v[i:]).MulAdd(sc, sh))
		e.StoreSlice(v[i:])
		acc = acc.Add(e)
	}
	last.StoreSlice(v[n-8:])
	return lanesSum8(acc.Add(last.Masked(newLanes8(n))))
}

func sigmoid8(dst, src []float32) {
	n := len(src)
	if n < 8 {
		sigmoidScalar(dst, src)
		return
	}
	dst = dst[:n]
	one, neg := bcast8(1), bcast8(-1)
	sig := func(x archsimd.Float32x8) archsimd.Float32x8 { return one.Div(exp8(x.Mul(neg)).Add(one)) }
	last := sig(last8(src))
	for i := 0; i+8 <= n; i += 8 {
		sig(load8(src[i:])).StoreSlice(dst[i:])
	}
	last.StoreSlice(dst[n-8:])
	archsimd.ClearAVXUpperBits()
}

func max8(v []float32) float32 {
	if len(v) < 8 {
		return maxScalar(v)
	}
	acc := last8(v) // max minds no overlap
	for i := 0; i+8 <= len(v); i += 8 {
		acc = acc.Max(load8(v[i:]))
	}
	var l [8]float32
	acc.Store(&l)
	archsimd.ClearAVXUpperBits()
	return maxScalar(l[:])
}

func dot8(a, b []float32) float64 {
	n := len(a)
	if n < 8 {
		return dotScalar(a, b)
	}
	b = b[:n]
	var acc archsimd.Float32x8
	for i := 0; i+8 <= n; i += 8 {
		acc = load8(a[i:]).MulAdd(load8(b[i:]), acc)
	}
	return lanesSum8(acc.Add(last8(a).Mul(last8(b)).Masked(newLanes8(n))))
}

func dot3_8(a, b, c []float32) float64 {
	n := len(a)
	if n < 8 {
		return dot3Scalar(a, b, c)
	}
	b, c = b[:n], c[:n]
	var acc archsimd.Float32x8
	for i := 0; i+8 <= n; i += 8 {
		acc = load8(a[i:]).Mul(load8(b[i:])).MulAdd(load8(c[i:]), acc)
	}
	return lanesSum8(acc.Add(last8(a).Mul(last8(b)).Mul(last8(c)).Masked(newLanes8(n))))
}

// The element-wise kernels compute their last vector before the loop (see above): in place,
// the loop overwrites inputs of the overlap.

func axpby8(dst, x []float32, alpha float32) {
	n := len(dst)
	if n < 8 {
		axpbyScalar(dst, x, alpha)
		return
	}
	x = x[:n]
	al := bcast8(alpha)
	last := last8(dst).MulAdd(al, last8(x))
	for i := 0; i+8 <= n; i += 8 {
		load8(dst[i:]).MulAdd(al, load8(x[i:])).StoreSlice(dst[i:])
	}
	last.StoreSlice(dst[n-8:])
	archsimd.ClearAVXUpperBits()
}

func axpy8(dst, x []float32, alpha float32) {
	n := len(dst)
	if n < 8 {
		axpyScalar(dst, x, alpha)
		return
	}
	x = x[:n]
	al := bcast8(alpha)
	last := last8(x).MulAdd(al, last8(dst))
	for i := 0; i+8 <= n; i += 8 {
		load8(x[i:]).MulAdd(al, load8(dst[i:])).StoreSlice(dst[i:])
	}
	last.StoreSlice(dst[n-8:])
	archsimd.ClearAVXUpperBits()
}

func mulScaled8(dst, a, b []float32, s float32) {
	n := len(dst)
	if n < 8 {
		mulScaledScalar(dst, a, b, s)
		return
	}
	a, b = a[:n], b[:n]
	sc := bcast8(s)
	last := last8(a).Mul(last8(b)).Mul(sc)
	for i := 0; i+8 <= n; i += 8 {
		load8(a[i:]).Mul(load8(b[i:])).Mul(sc).StoreSlice(dst[i:])
	}
	last.StoreSlice(dst[n-8:])
	archsimd.ClearAVXUpperBits()
}

func rmsBack8(dx, dy, w, x []float32, inv, c float32, accumulate bool) {
	n := len(dx)
	if n < 8 {
		rmsBackScalar(dx, dy, w, x, inv, c, accumulate)
		return
	}
	dy, w, x = dy[:n], w[:n], x[:n]
	iv, cc := bcast8(inv), bcast8(-c)
	grad := func(dy, w, x, dx archsimd.Float32x8) archsimd.Float32x8 {
		g := x.MulAdd(cc, dy.Mul(w).Mul(iv))
		if accumulate {
			g = g.Add(dx)
		}
		return g
	}
	last := grad(last8(dy), last8(w), last8(x), last8(dx))
	for i := 0; i+8 <= n; i += 8 {
		grad(load8(dy[i:]), load8(w[i:]), load8(x[i:]), load8(dx[i:])).StoreSlice(dx[i:])
	}
	last.StoreSlice(dx[n-8:])
	archsimd.ClearAVXUpperBits()
}

func softmaxBackRow8(p, dr []float32, d, scale float32) {
	n := len(p)
	if n < 8 {
		softmaxBackRowScalar(p, dr, d, scale)
		return
	}
	dr = dr[:n]
	dd, sc := bcast8(d), bcast8(scale)
	last := last8(dr).Sub(dd).Mul(last8(p)).Mul(sc)
	for i := 0; i+8 <= n; i += 8 {
		load8(dr[i:]).Sub(dd).Mul(load8(p[i:])).Mul(sc).StoreSlice(dr[i:])
	}
	last.StoreSlice(dr[n-8:])
	archsimd.ClearAVXUpperBits()
}

func siluGate8(g, u, sig, out []float32) {
	n := len(g)
	if n < 8 {
		siluGateScalar(g, u, sig, out)
		return
	}
	u, sig, out = u[:n], sig[:n], out[:n]
	last := last8(g).Mul(last8(sig)).Mul(last8(u))
	for i := 0; i+8 <= n; i += 8 {
		load8(g[i:]).Mul(load8(sig[i:])).Mul(load8(u[i:])).StoreSlice(out[i:])
	}
	last.StoreSlice(out[n-8:])
	archsimd.ClearAVXUpperBits()
}

func siluGateBack8(da, g, u, sig, dg, du []float32) {
	n := len(g)
	if n < 8 {
		siluGateBackScalar(da, g, u, sig, dg, du)
		return
	}
	da, u, sig, dg, du = da[:n], u[:n], sig[:n], dg[:n], du[:n]
	one := bcast8(1)
	// dg = da·u·σ·(1 + g·(1−σ)), du = da·g·σ
	back := func(a, gg, uu, s archsimd.Float32x8) (dg, du archsimd.Float32x8) {
		as := a.Mul(s)
		return as.Mul(uu).Mul(gg.MulAdd(one.Sub(s), one)), as.Mul(gg)
	}
	lastG, lastU := back(last8(da), last8(g), last8(u), last8(sig))
	for i := 0; i+8 <= n; i += 8 {
		vg, vu := back(load8(da[i:]), load8(g[i:]), load8(u[i:]), load8(sig[i:]))
		vu.StoreSlice(du[i:])
		vg.StoreSlice(dg[i:])
	}
	lastU.StoreSlice(du[n-8:])
	lastG.StoreSlice(dg[n-8:])
	archsimd.ClearAVXUpperBits()
}

// widenBF16To32 writes dst[i] = src[i] (bfloat16 bits) as float32, 8 lanes at a time: each
// value zero-extended to 32 bits and shifted into the high half. As the 8-lane row kernels
// (see the note above load8) it has no scalar tail: the last 8 elements are one more vector,
// overlapping the loop's last one (widening is exact, so the overlap is written twice with the
// same values), and it clears the upper halves before returning. Fewer than 8 run scalar.
func widenBF16To32(dst []float32, src []uint16) {
	n := len(src)
	if !cpu.X86.AVX2 || n < 8 {
		widenBF16Scalar(dst, src)
		return
	}
	dst = dst[:n]
	widen := func(i int) {
		archsimd.LoadUint16x8Slice(src[i:]).ExtendToUint32().ShiftAllLeft(16).AsFloat32x8().StoreSlice(dst[i:])
	}
	for i := 0; i+8 <= n; i += 8 {
		widen(i)
	}
	widen(n - 8)
	archsimd.ClearAVXUpperBits()
}

var avx2Rows = rowTable{
	max: max8, dot: dot8, dot3: dot3_8, axpby: axpby8, axpy: axpy8, mulScaled: mulScaled8,
	rmsBack: rmsBack8, softmaxBackRow: softmaxBackRow8, siluGate: siluGate8,
	siluGateBack: siluGateBack8, expScaledShift: expScaledShift8, sigmoid: sigmoid8,
	roundBF16: roundBF16Scalar,
}
