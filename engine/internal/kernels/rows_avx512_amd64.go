//go:build goexperiment.simd && amd64

package kernels

import (
	"math"
	"simd/archsimd"
)

// exp16 is Exp32 on 16 lanes: the same range reduction and polynomial, with 2^k applied by
// VSCALEFPS. Inputs are clamped to [-87.3, 88.7], so e^x below 1.2e-38 comes out as that.
func exp16(x archsimd.Float32x16) archsimd.Float32x16 {
	x = x.Max(archsimd.BroadcastFloat32x16(-87.3)).Min(archsimd.BroadcastFloat32x16(88.7))
	k := x.Mul(archsimd.BroadcastFloat32x16(1.44269504088896341)).RoundToEvenScaled(0)
	r := k.MulAdd(archsimd.BroadcastFloat32x16(-0.693145751953125), x)
	r = k.MulAdd(archsimd.BroadcastFloat32x16(-1.42860682030941723212e-6), r)
	p := archsimd.BroadcastFloat32x16(1.0 / 720)
	for i := range expPoly { // not a literal, which is copied with legacy SSE on every call
		p = p.MulAdd(r, archsimd.BroadcastFloat32x16(expPoly[i]))
	}
	return p.Scale(k)
}

// expScaledShift16 sets v[i] = e^(v[i]·scale − shift) and returns their sum.
func expScaledShift16(v []float32, scale, shift float32) float64 {
	// The tail first (see axpby16); its sum is taken again after the clear, as a float kept in
	// a register across it would be spilled with legacy SSE.
	m := len(v) / 16 * 16
	expScaledShiftScalar(v[m:], scale, shift)
	sc, sh := archsimd.BroadcastFloat32x16(scale), archsimd.BroadcastFloat32x16(-shift)
	var acc archsimd.Float32x16 // zero (a broadcast of 0 is a legacy XORPS)
	for i := 0; i < m; i += 16 {
		e := exp16(archsimd.LoadFloat32x16Slice(v[i:]).MulAdd(sc, sh))
		e.StoreSlice(v[i:])
		acc = acc.Add(e)
	}
	var lanes [16]float32
	acc.Store(&lanes)
	archsimd.ClearAVXUpperBits()
	var sum float64
	for _, x := range lanes {
		sum += float64(x)
	}
	var tail float64 // as expScaledShiftScalar summed it
	for _, e := range v[m:] {
		tail += float64(e)
	}
	return sum + tail
}

// sigmoid16 sets dst[i] = 1/(1+e^(−src[i])).
func sigmoid16(dst, src []float32) {
	one, neg := archsimd.BroadcastFloat32x16(1), archsimd.BroadcastFloat32x16(-1)
	i := 0
	for ; i+16 <= len(src); i += 16 {
		e := exp16(archsimd.LoadFloat32x16Slice(src[i:]).Mul(neg))
		one.Div(e.Add(one)).StoreSlice(dst[i:])
	}
	archsimd.ClearAVXUpperBits()
	sigmoidScalar(dst[i:], src[i:])
}

// The row kernels below are 16-lane versions of loops in kernels.go; each leaves a tail of
// fewer than 16 elements to the scalar version (rows_scalar.go), which machines without
// AVX2 use for everything; rows_avx2_amd64.go has the 8-lane versions. Each clears the upper
// halves (VZEROUPPER) after its last vector, before scalar code (see the note above load8).

func load(v []float32) archsimd.Float32x16 { return archsimd.LoadFloat32x16Slice(v) }

func bcast(x float32) archsimd.Float32x16 { return archsimd.BroadcastFloat32x16(x) }

func bcastBits(b uint32) archsimd.Uint32x16 { return bcast(math.Float32frombits(b)).AsUint32x16() }

func lanesSum(x archsimd.Float32x16) float64 {
	var l [16]float32
	x.Store(&l)
	archsimd.ClearAVXUpperBits()
	var s float64
	for _, v := range l {
		s += float64(v)
	}
	return s
}

// max16 returns the largest element of v (not empty).
func max16(v []float32) float32 {
	if len(v) < 16 {
		return maxScalar(v)
	}
	acc := load(v)
	i := 16
	for ; i+16 <= len(v); i += 16 {
		acc = acc.Max(load(v[i:]))
	}
	var l [16]float32
	acc.Store(&l)
	archsimd.ClearAVXUpperBits()
	m := maxScalar(l[:])
	if i < len(v) {
		m = max(m, maxScalar(v[i:]))
	}
	return m
}

// dot16 returns Σ a·b (float32 lanes, summed in float64).
func dot16(a, b []float32) float64 {
	acc := bcast(0)
	i := 0
	for ; i+16 <= len(a); i += 16 {
		acc = load(a[i:]).MulAdd(load(b[i:]), acc)
	}
	return lanesSum(acc) + dotScalar(a[i:], b[i:])
}

// dot3_16 returns Σ a·b·c.
func dot3_16(a, b, c []float32) float64 {
	acc := bcast(0)
	i := 0
	for ; i+16 <= len(a); i += 16 {
		acc = load(a[i:]).Mul(load(b[i:])).MulAdd(load(c[i:]), acc)
	}
	return lanesSum(acc) + dot3Scalar(a[i:], b[i:], c[i:])
}

// axpby16 sets dst = x + alpha·dst.
func axpby16(dst, x []float32, alpha float32) {
	// The tail goes first, while the upper halves are clean: a float argument kept for after
	// ClearAVXUpperBits is spilled with a legacy-SSE move right before it.
	m := len(dst) / 16 * 16
	axpbyScalar(dst[m:], x[m:], alpha)
	al := bcast(alpha)
	for i := 0; i < m; i += 16 {
		load(dst[i:]).MulAdd(al, load(x[i:])).StoreSlice(dst[i:])
	}
	archsimd.ClearAVXUpperBits()
}

// axpy16 sets dst += alpha·x.
func axpy16(dst, x []float32, alpha float32) {
	m := len(dst) / 16 * 16
	axpyScalar(dst[m:], x[m:], alpha) // first: see axpby16
	al := bcast(alpha)
	for i := 0; i < m; i += 16 {
		load(x[i:]).MulAdd(al, load(dst[i:])).StoreSlice(dst[i:])
	}
	archsimd.ClearAVXUpperBits()
}

// mulScaled16 sets dst = a·b·s (RMSNorm: x·w·inv).
func mulScaled16(dst, a, b []float32, s float32) {
	m := len(dst) / 16 * 16
	mulScaledScalar(dst[m:], a[m:], b[m:], s) // first: see axpby16
	sc := bcast(s)
	for i := 0; i < m; i += 16 {
		load(a[i:]).Mul(load(b[i:])).Mul(sc).StoreSlice(dst[i:])
	}
	archsimd.ClearAVXUpperBits()
}

// rmsBack16 sets (or adds to) dx the RMSNorm input gradient inv·dy·w − x·c.
func rmsBack16(dx, dy, w, x []float32, inv, c float32, accumulate bool) {
	m := len(dx) / 16 * 16
	rmsBackScalar(dx[m:], dy[m:], w[m:], x[m:], inv, c, accumulate) // first: see axpby16
	iv, cc := bcast(inv), bcast(-c)
	for i := 0; i < m; i += 16 {
		g := load(dy[i:]).Mul(load(w[i:])).Mul(iv)
		g = load(x[i:]).MulAdd(cc, g)
		if accumulate {
			g = g.Add(load(dx[i:]))
		}
		g.StoreSlice(dx[i:])
	}
	archsimd.ClearAVXUpperBits()
}

// softmaxBackRow16 sets dr = p·(dr − d)·scale.
func softmaxBackRow16(p, dr []float32, d, scale float32) {
	m := len(p) / 16 * 16
	softmaxBackRowScalar(p[m:], dr[m:], d, scale) // first: see axpby16
	dd, sc := bcast(d), bcast(scale)
	for i := 0; i < m; i += 16 {
		load(dr[i:]).Sub(dd).Mul(load(p[i:])).Mul(sc).StoreSlice(dr[i:])
	}
	archsimd.ClearAVXUpperBits()
}

// siluGate16 sets out = g·σ·u.
func siluGate16(g, u, sig, out []float32) {
	i := 0
	for ; i+16 <= len(g); i += 16 {
		load(g[i:]).Mul(load(sig[i:])).Mul(load(u[i:])).StoreSlice(out[i:])
	}
	archsimd.ClearAVXUpperBits()
	siluGateScalar(g[i:], u[i:], sig[i:], out[i:])
}

// siluGateBack16 sets dg = da·u·σ·(1 + g·(1−σ)) and du = da·g·σ.
func siluGateBack16(da, g, u, sig, dg, du []float32) {
	i := 0
	one := bcast(1)
	for ; i+16 <= len(g); i += 16 {
		a, gg, s := load(da[i:]), load(g[i:]), load(sig[i:])
		as := a.Mul(s)
		as.Mul(gg).StoreSlice(du[i:])
		// 1 + g·(1−σ)
		f := gg.MulAdd(one.Sub(s), one)
		as.Mul(load(u[i:])).Mul(f).StoreSlice(dg[i:])
	}
	archsimd.ClearAVXUpperBits()
	siluGateBackScalar(da[i:], g[i:], u[i:], sig[i:], dg[i:], du[i:])
}

var avx512Rows = rowTable{
	max: max16, dot: dot16, dot3: dot3_16, axpby: axpby16, axpy: axpy16, mulScaled: mulScaled16,
	rmsBack: rmsBack16, softmaxBackRow: softmaxBackRow16, siluGate: siluGate16,
	siluGateBack: siluGateBack16, expScaledShift: expScaledShift16, sigmoid: sigmoid16,
	roundBF16: roundBF16x16,
}

// roundBF16x16 sets dst[i] = BF16Of(src[i]), 16 lanes at a time: the bits plus 0x7fff plus
// their lowest kept bit, the high half kept (ties to even), and NaNs quieted as BF16Of does.
func roundBF16x16(dst []uint16, src []float32) {
	m := len(src) / 16 * 16
	roundBF16Scalar(dst[m:len(src)], src[m:]) // first: see axpby16
	// Integer broadcasts compile to a legacy-SSE MOVQ; float ones of the same bits do not.
	// (So is a shift by a constant count: the shifts take a vector of counts.)
	half, one, quiet, by16 := bcastBits(0x7fff), bcastBits(1), bcastBits(0x40), bcastBits(16)
	for i := 0; i < m; i += 16 {
		x := archsimd.LoadFloat32x16Slice(src[i:])
		b := x.AsUint32x16()
		hi := b.ShiftRight(by16)
		r := b.Add(half).Add(hi.And(one)).ShiftRight(by16)
		r = hi.Or(quiet).Merge(r, x.IsNaN())
		r.TruncateToUint16().StoreSlice(dst[i:])
	}
	archsimd.ClearAVXUpperBits()
}
