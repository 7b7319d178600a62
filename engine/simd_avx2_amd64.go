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
// CPUs without AVX-512 (AMD before Zen 4, Intel client parts). They use only AVX, AVX2 and FMA
// instructions: several Float32x8 methods (RoundToEvenScaled, Scale, ConvertToFloat64) are
// AVX-512 instructions and would fault here.
//
// Go compiles scalar float code to legacy SSE and does not yet clear the upper halves of the
// vector registers between the two; on the CI machine (AMD EPYC, virtualised) an SSE
// instruction run while they are dirty costs about a hundred nanoseconds (a 15-float dot took
// 136 ns against 16). So a kernel runs no scalar float code between its first vector
// instruction and ClearAVXUpperBits (VZEROUPPER), which it calls once its last vector is
// stored: the last partial vector goes through masked loads and stores (VMASKMOVPS) instead
// of a scalar tail (whose float32 arguments the compiler would spill with a legacy MOVSS where
// the loop ends), exp8 is inlined (a call spills around it), no array literal is copied
// inside a loop, and a zero accumulator is declared (bcast8(0) is a legacy XORPS). To check after a change: go build -gcflags=-S, and look in each kernel for an
// instruction on an X register without the V prefix before its VZEROUPPER.

func load8(v []float32) archsimd.Float32x8 { return archsimd.LoadFloat32x8Slice(v) }

// part8 loads the first min(len(v), 8) elements of v, zeros after them.
func part8(v []float32) archsimd.Float32x8 { return archsimd.LoadFloat32x8SlicePart(v) }

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
	sc, sh := bcast8(scale), bcast8(-shift)
	var acc archsimd.Float32x8
	i := 0
	for ; i+8 <= len(v); i += 8 {
		e := exp8(load8(v[i:]).MulAdd(sc, sh))
		e.StoreSlice(v[i:])
		acc = acc.Add(e)
	}
	if i < len(v) {
		// The zero lanes after the tail would add e^−shift each: the tail is summed from v.
		exp8(part8(v[i:]).MulAdd(sc, sh)).StoreSlicePart(v[i:])
	}
	sum := lanesSum8(acc)
	for _, x := range v[i:] {
		sum += float64(x)
	}
	return sum
}

func sigmoid8(dst, src []float32) {
	dst = dst[:len(src)]
	one, neg := bcast8(1), bcast8(-1)
	for i := 0; i < len(src); i += 8 {
		e := exp8(part8(src[i:]).Mul(neg))
		one.Div(e.Add(one)).StoreSlicePart(dst[i:])
	}
	archsimd.ClearAVXUpperBits()
}

func max8(v []float32) float32 {
	if len(v) < 8 {
		return maxScalar(v)
	}
	acc := load8(v[len(v)-8:]) // the last 8, overlapping the loop's last vector where n%8 ≠ 0
	for i := 0; i+8 <= len(v); i += 8 {
		acc = acc.Max(load8(v[i:]))
	}
	var l [8]float32
	acc.Store(&l)
	archsimd.ClearAVXUpperBits()
	return maxScalar(l[:])
}

// The rest run one loop whose last vector may be partial: part8 and StoreSlicePart cost a
// length check per vector, and zero lanes add nothing to a dot product.

func dot8(a, b []float32) float64 {
	b = b[:len(a)]
	var acc archsimd.Float32x8
	for i := 0; i < len(a); i += 8 {
		acc = part8(a[i:]).MulAdd(part8(b[i:]), acc)
	}
	return lanesSum8(acc)
}

func dot3_8(a, b, c []float32) float64 {
	b, c = b[:len(a)], c[:len(a)]
	var acc archsimd.Float32x8
	for i := 0; i < len(a); i += 8 {
		acc = part8(a[i:]).Mul(part8(b[i:])).MulAdd(part8(c[i:]), acc)
	}
	return lanesSum8(acc)
}

func axpby8(dst, x []float32, alpha float32) {
	x = x[:len(dst)]
	al := bcast8(alpha)
	for i := 0; i < len(dst); i += 8 {
		part8(dst[i:]).MulAdd(al, part8(x[i:])).StoreSlicePart(dst[i:])
	}
	archsimd.ClearAVXUpperBits()
}

func axpy8(dst, x []float32, alpha float32) {
	x = x[:len(dst)]
	al := bcast8(alpha)
	for i := 0; i < len(dst); i += 8 {
		part8(x[i:]).MulAdd(al, part8(dst[i:])).StoreSlicePart(dst[i:])
	}
	archsimd.ClearAVXUpperBits()
}

func mulScaled8(dst, a, b []float32, s float32) {
	a, b = a[:len(dst)], b[:len(dst)]
	sc := bcast8(s)
	for i := 0; i < len(dst); i += 8 {
		part8(a[i:]).Mul(part8(b[i:])).Mul(sc).StoreSlicePart(dst[i:])
	}
	archsimd.ClearAVXUpperBits()
}

func rmsBack8(dx, dy, w, x []float32, inv, c float32, accumulate bool) {
	dy, w, x = dy[:len(dx)], w[:len(dx)], x[:len(dx)]
	iv, cc := bcast8(inv), bcast8(-c)
	for i := 0; i < len(dx); i += 8 {
		g := part8(dy[i:]).Mul(part8(w[i:])).Mul(iv)
		g = part8(x[i:]).MulAdd(cc, g)
		if accumulate {
			g = g.Add(part8(dx[i:]))
		}
		g.StoreSlicePart(dx[i:])
	}
	archsimd.ClearAVXUpperBits()
}

func softmaxBackRow8(p, dr []float32, d, scale float32) {
	dr = dr[:len(p)]
	dd, sc := bcast8(d), bcast8(scale)
	for i := 0; i < len(p); i += 8 {
		part8(dr[i:]).Sub(dd).Mul(part8(p[i:])).Mul(sc).StoreSlicePart(dr[i:])
	}
	archsimd.ClearAVXUpperBits()
}

func siluGate8(g, u, sig, out []float32) {
	u, sig, out = u[:len(g)], sig[:len(g)], out[:len(g)]
	for i := 0; i < len(g); i += 8 {
		part8(g[i:]).Mul(part8(sig[i:])).Mul(part8(u[i:])).StoreSlicePart(out[i:])
	}
	archsimd.ClearAVXUpperBits()
}

func siluGateBack8(da, g, u, sig, dg, du []float32) {
	da, u, sig, dg, du = da[:len(g)], u[:len(g)], sig[:len(g)], dg[:len(g)], du[:len(g)]
	one := bcast8(1)
	for i := 0; i < len(g); i += 8 {
		a, gg, s := part8(da[i:]), part8(g[i:]), part8(sig[i:])
		as := a.Mul(s)
		as.Mul(gg).StoreSlicePart(du[i:])
		// 1 + g·(1−σ)
		f := gg.MulAdd(one.Sub(s), one)
		as.Mul(part8(u[i:])).Mul(f).StoreSlicePart(dg[i:])
	}
	archsimd.ClearAVXUpperBits()
}
