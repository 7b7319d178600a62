//go:build goexperiment.simd && amd64

package engine

import "simd/archsimd"

// haveAVX2 is the CPU's support, whatever kernel path is forced (see setKernelPath): widening
// bf16 has no scalar-vs-vector accuracy question, so it always takes the vector path.
var haveAVX2 = archsimd.X86.AVX2()

// widenBF16To32 writes dst[i] = src[i] (bfloat16 bits) as float32, 8 lanes at a time: each
// value zero-extended to 32 bits and shifted into the high half. As the 8-lane row kernels
// (see the note above load8) it has no scalar tail: the last 8 elements are one more vector,
// overlapping the loop's last one (widening is exact, so the overlap is written twice with the
// same values), and it clears the upper halves before returning. Fewer than 8 run scalar.
func widenBF16To32(dst []float32, src []uint16) {
	n := len(src)
	if !haveAVX2 || n < 8 {
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

// exp16 is exp32 on 16 lanes: the same range reduction and polynomial, with 2^k applied by
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

// expScaledShift32 sets v[i] = e^(v[i]·scale − shift) and returns their sum.
func expScaledShift32(v []float32, scale, shift float32) float64 {
	if useAVX2 {
		return expScaledShift8(v, scale, shift)
	}
	if !haveAVX512 {
		return expScaledShiftScalar(v, scale, shift)
	}
	// The tail first (see axpby32); its sum is taken again after the clear, as a float kept in
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

// sigmoid32 sets dst[i] = 1/(1+e^(−src[i])).
func sigmoid32(dst, src []float32) {
	if useAVX2 {
		sigmoid8(dst, src)
		return
	}
	if !haveAVX512 {
		sigmoidScalar(dst, src)
		return
	}
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
// fewer than 16 elements to the scalar version (kernels_scalar.go), which machines without
// AVX2 use for everything; simd_avx2_amd64.go has the 8-lane versions. Each clears the upper
// halves (VZEROUPPER) after its last vector, before scalar code (see the note above load8).

func load(v []float32) archsimd.Float32x16 { return archsimd.LoadFloat32x16Slice(v) }

func bcast(x float32) archsimd.Float32x16 { return archsimd.BroadcastFloat32x16(x) }

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

// max32 returns the largest element of v (not empty).
func max32(v []float32) float32 {
	if useAVX2 {
		return max8(v)
	}
	if !haveAVX512 || len(v) < 16 {
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

// dot32 returns Σ a·b (float32 lanes, summed in float64).
func dot32(a, b []float32) float64 {
	if useAVX2 {
		return dot8(a, b)
	}
	if !haveAVX512 {
		return dotScalar(a, b)
	}
	acc := bcast(0)
	i := 0
	for ; i+16 <= len(a); i += 16 {
		acc = load(a[i:]).MulAdd(load(b[i:]), acc)
	}
	return lanesSum(acc) + dotScalar(a[i:], b[i:])
}

// dot3_32 returns Σ a·b·c.
func dot3_32(a, b, c []float32) float64 {
	if useAVX2 {
		return dot3_8(a, b, c)
	}
	if !haveAVX512 {
		return dot3Scalar(a, b, c)
	}
	acc := bcast(0)
	i := 0
	for ; i+16 <= len(a); i += 16 {
		acc = load(a[i:]).Mul(load(b[i:])).MulAdd(load(c[i:]), acc)
	}
	return lanesSum(acc) + dot3Scalar(a[i:], b[i:], c[i:])
}

// axpby32 sets dst = x + alpha·dst.
func axpby32(dst, x []float32, alpha float32) {
	if useAVX2 {
		axpby8(dst, x, alpha)
		return
	}
	if !haveAVX512 {
		axpbyScalar(dst, x, alpha)
		return
	}
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

// axpy32 sets dst += alpha·x.
func axpy32(dst, x []float32, alpha float32) {
	if useAVX2 {
		axpy8(dst, x, alpha)
		return
	}
	if !haveAVX512 {
		axpyScalar(dst, x, alpha)
		return
	}
	m := len(dst) / 16 * 16
	axpyScalar(dst[m:], x[m:], alpha) // first: see axpby32
	al := bcast(alpha)
	for i := 0; i < m; i += 16 {
		load(x[i:]).MulAdd(al, load(dst[i:])).StoreSlice(dst[i:])
	}
	archsimd.ClearAVXUpperBits()
}

// mulScaled32 sets dst = a·b·s (RMSNorm: x·w·inv).
func mulScaled32(dst, a, b []float32, s float32) {
	if useAVX2 {
		mulScaled8(dst, a, b, s)
		return
	}
	if !haveAVX512 {
		mulScaledScalar(dst, a, b, s)
		return
	}
	m := len(dst) / 16 * 16
	mulScaledScalar(dst[m:], a[m:], b[m:], s) // first: see axpby32
	sc := bcast(s)
	for i := 0; i < m; i += 16 {
		load(a[i:]).Mul(load(b[i:])).Mul(sc).StoreSlice(dst[i:])
	}
	archsimd.ClearAVXUpperBits()
}

// rmsBack32 sets (or adds to) dx the RMSNorm input gradient inv·dy·w − x·c.
func rmsBack32(dx, dy, w, x []float32, inv, c float32, accumulate bool) {
	if useAVX2 {
		rmsBack8(dx, dy, w, x, inv, c, accumulate)
		return
	}
	if !haveAVX512 {
		rmsBackScalar(dx, dy, w, x, inv, c, accumulate)
		return
	}
	m := len(dx) / 16 * 16
	rmsBackScalar(dx[m:], dy[m:], w[m:], x[m:], inv, c, accumulate) // first: see axpby32
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

// softmaxBackRow32 sets dr = p·(dr − d)·scale.
func softmaxBackRow32(p, dr []float32, d, scale float32) {
	if useAVX2 {
		softmaxBackRow8(p, dr, d, scale)
		return
	}
	if !haveAVX512 {
		softmaxBackRowScalar(p, dr, d, scale)
		return
	}
	m := len(p) / 16 * 16
	softmaxBackRowScalar(p[m:], dr[m:], d, scale) // first: see axpby32
	dd, sc := bcast(d), bcast(scale)
	for i := 0; i < m; i += 16 {
		load(dr[i:]).Sub(dd).Mul(load(p[i:])).Mul(sc).StoreSlice(dr[i:])
	}
	archsimd.ClearAVXUpperBits()
}

// siluGate32 sets out = g·σ·u.
func siluGate32(g, u, sig, out []float32) {
	if useAVX2 {
		siluGate8(g, u, sig, out)
		return
	}
	i := 0
	if haveAVX512 {
		for ; i+16 <= len(g); i += 16 {
			load(g[i:]).Mul(load(sig[i:])).Mul(load(u[i:])).StoreSlice(out[i:])
		}
		archsimd.ClearAVXUpperBits()
	}
	siluGateScalar(g[i:], u[i:], sig[i:], out[i:])
}

// siluGateBack32 sets dg = da·u·σ·(1 + g·(1−σ)) and du = da·g·σ.
func siluGateBack32(da, g, u, sig, dg, du []float32) {
	if useAVX2 {
		siluGateBack8(da, g, u, sig, dg, du)
		return
	}
	i := 0
	if haveAVX512 {
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
	}
	siluGateBackScalar(da[i:], g[i:], u[i:], sig[i:], dg[i:], du[i:])
}
