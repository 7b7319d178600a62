//go:build goexperiment.simd && amd64

package engine

import "simd/archsimd"

// haveAVX512 and useAVX2 route the kernels of simd_amd64.go to their 16-lane or 8-lane bodies;
// with neither set they run scalar. At most one is set, by setKernelPath.
var haveAVX512, useAVX2 bool

func init() { setKernelPath(bestKernelPath()) }

// kernelPathSupported reports whether this CPU can run p. The 8-lane kernels need FMA as well
// as AVX2 (every MulAdd is a VFMADD); AVX-512 implies both.
func kernelPathSupported(p kernelPath) bool {
	switch p {
	case pathScalar:
		return true
	case pathAVX2:
		return archsimd.X86.AVX2() && archsimd.X86.FMA()
	case pathAVX512:
		return archsimd.X86.AVX512()
	}
	return false
}

// setKernelPath routes the float32 row kernels through p and reports true, or reports false
// and changes nothing where the CPU lacks p. Not safe while kernels run: init, tests and
// benchmarks call it.
func setKernelPath(p kernelPath) bool {
	if !kernelPathSupported(p) {
		return false
	}
	haveAVX512, useAVX2 = p == pathAVX512, p == pathAVX2
	return true
}

func activeKernelPath() kernelPath {
	switch {
	case haveAVX512:
		return pathAVX512
	case useAVX2:
		return pathAVX2
	}
	return pathScalar
}

// The 8-lane kernels below are the AVX2+FMA versions of the 16-lane ones in simd_amd64.go, for
// CPUs without AVX-512 (AMD before Zen 4, Intel client parts). Each leaves a tail of fewer than
// 8 elements to the scalar version (kernels_scalar.go). They use only AVX, AVX2 and FMA
// instructions: several Float32x8 methods (RoundToEvenScaled, Scale, ConvertToFloat64) are
// AVX-512 instructions and would fault here.

func load8(v []float32) archsimd.Float32x8 { return archsimd.LoadFloat32x8Slice(v) }

func bcast8(x float32) archsimd.Float32x8 { return archsimd.BroadcastFloat32x8(x) }

func lanesSum8(x archsimd.Float32x8) float64 {
	var l [8]float32
	x.Store(&l)
	var s float64
	for _, v := range l {
		s += float64(v)
	}
	return s
}

// exp8 is exp16 on 8 lanes. AVX2 has no VSCALEFPS, so 2^k is added to the exponent bits of
// p = e^r instead (as exp32 does): p is in [0.7, 1.42] and the clamp keeps k in [−126, 128]
// with p < 1 at k = 128 and p > 1 at k = −126, so the result is always a normal float32.
// NaN lanes are put back at the end, as exp32 returns them: the clamp alone would turn them
// into a bound (VMAXPS/VMINPS return one operand when either is NaN, and the compiler may
// swap the operands, Max and Min being commutative).
func exp8(x archsimd.Float32x8) archsimd.Float32x8 {
	c := x.Max(bcast8(-87.3)).Min(bcast8(88.7))
	k := c.Mul(bcast8(1.44269504088896341)).RoundToEven()
	r := k.MulAdd(bcast8(-0.693145751953125), c)
	r = k.MulAdd(bcast8(-1.42860682030941723212e-6), r)
	p := bcast8(1.0 / 720)
	for _, f := range [...]float32{1.0 / 120, 1.0 / 24, 1.0 / 6, 0.5, 1, 1} {
		p = p.MulAdd(r, bcast8(f))
	}
	e := p.AsInt32x8().Add(k.ConvertToInt32().ShiftAllLeft(23)).AsFloat32x8()
	return x.Merge(e, x.IsNaN())
}

func expScaledShift8(v []float32, scale, shift float32) float64 {
	sc, sh := bcast8(scale), bcast8(-shift)
	acc := bcast8(0)
	i := 0
	for ; i+8 <= len(v); i += 8 {
		e := exp8(load8(v[i:]).MulAdd(sc, sh))
		e.StoreSlice(v[i:])
		acc = acc.Add(e)
	}
	return lanesSum8(acc) + expScaledShiftScalar(v[i:], scale, shift)
}

func sigmoid8(dst, src []float32) {
	one, neg := bcast8(1), bcast8(-1)
	i := 0
	for ; i+8 <= len(src); i += 8 {
		e := exp8(load8(src[i:]).Mul(neg))
		one.Div(e.Add(one)).StoreSlice(dst[i:])
	}
	sigmoidScalar(dst[i:], src[i:])
}

func max8(v []float32) float32 {
	if len(v) < 8 {
		return maxScalar(v)
	}
	acc := load8(v)
	i := 8
	for ; i+8 <= len(v); i += 8 {
		acc = acc.Max(load8(v[i:]))
	}
	var l [8]float32
	acc.Store(&l)
	m := maxScalar(l[:])
	if i < len(v) {
		m = max(m, maxScalar(v[i:]))
	}
	return m
}

func dot8(a, b []float32) float64 {
	acc := bcast8(0)
	i := 0
	for ; i+8 <= len(a); i += 8 {
		acc = load8(a[i:]).MulAdd(load8(b[i:]), acc)
	}
	return lanesSum8(acc) + dotScalar(a[i:], b[i:])
}

func dot3_8(a, b, c []float32) float64 {
	acc := bcast8(0)
	i := 0
	for ; i+8 <= len(a); i += 8 {
		acc = load8(a[i:]).Mul(load8(b[i:])).MulAdd(load8(c[i:]), acc)
	}
	return lanesSum8(acc) + dot3Scalar(a[i:], b[i:], c[i:])
}

func axpby8(dst, x []float32, alpha float32) {
	al := bcast8(alpha)
	i := 0
	for ; i+8 <= len(dst); i += 8 {
		load8(dst[i:]).MulAdd(al, load8(x[i:])).StoreSlice(dst[i:])
	}
	axpbyScalar(dst[i:], x[i:], alpha)
}

func axpy8(dst, x []float32, alpha float32) {
	al := bcast8(alpha)
	i := 0
	for ; i+8 <= len(dst); i += 8 {
		load8(x[i:]).MulAdd(al, load8(dst[i:])).StoreSlice(dst[i:])
	}
	axpyScalar(dst[i:], x[i:], alpha)
}

func mulScaled8(dst, a, b []float32, s float32) {
	sc := bcast8(s)
	i := 0
	for ; i+8 <= len(dst); i += 8 {
		load8(a[i:]).Mul(load8(b[i:])).Mul(sc).StoreSlice(dst[i:])
	}
	mulScaledScalar(dst[i:], a[i:], b[i:], s)
}

func rmsBack8(dx, dy, w, x []float32, inv, c float32, accumulate bool) {
	iv, cc := bcast8(inv), bcast8(-c)
	i := 0
	for ; i+8 <= len(dx); i += 8 {
		g := load8(dy[i:]).Mul(load8(w[i:])).Mul(iv)
		g = load8(x[i:]).MulAdd(cc, g)
		if accumulate {
			g = g.Add(load8(dx[i:]))
		}
		g.StoreSlice(dx[i:])
	}
	rmsBackScalar(dx[i:], dy[i:], w[i:], x[i:], inv, c, accumulate)
}

func softmaxBackRow8(p, dr []float32, d, scale float32) {
	dd, sc := bcast8(d), bcast8(scale)
	i := 0
	for ; i+8 <= len(p); i += 8 {
		load8(dr[i:]).Sub(dd).Mul(load8(p[i:])).Mul(sc).StoreSlice(dr[i:])
	}
	softmaxBackRowScalar(p[i:], dr[i:], d, scale)
}

func siluGate8(g, u, sig, out []float32) {
	i := 0
	for ; i+8 <= len(g); i += 8 {
		load8(g[i:]).Mul(load8(sig[i:])).Mul(load8(u[i:])).StoreSlice(out[i:])
	}
	siluGateScalar(g[i:], u[i:], sig[i:], out[i:])
}

func siluGateBack8(da, g, u, sig, dg, du []float32) {
	one := bcast8(1)
	i := 0
	for ; i+8 <= len(g); i += 8 {
		a, gg, s := load8(da[i:]), load8(g[i:]), load8(sig[i:])
		as := a.Mul(s)
		as.Mul(gg).StoreSlice(du[i:])
		// 1 + g·(1−σ)
		f := gg.MulAdd(one.Sub(s), one)
		as.Mul(load8(u[i:])).Mul(f).StoreSlice(dg[i:])
	}
	siluGateBackScalar(da[i:], g[i:], u[i:], sig[i:], dg[i:], du[i:])
}
