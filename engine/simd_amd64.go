//go:build goexperiment.simd && amd64

package engine

import "simd/archsimd"

// haveAVX2 is the CPU's support, whatever kernel path is forced (see setKernelPath): widening
// bf16 has no scalar-vs-vector accuracy question, so it always takes the vector path.
var haveAVX2 = archsimd.X86.AVX2()

// widenBF16To32 writes dst[i] = src[i] (bfloat16 bits) as float32, 8 lanes at a time: each
// value zero-extended to 32 bits and shifted into the high half.
func widenBF16To32(dst []float32, src []uint16) {
	if !haveAVX2 {
		widenBF16Scalar(dst, src)
		return
	}
	i := 0
	for ; i+8 <= len(src); i += 8 {
		archsimd.LoadUint16x8Slice(src[i:]).ExtendToUint32().ShiftAllLeft(16).AsFloat32x8().StoreSlice(dst[i:])
	}
	widenBF16Scalar(dst[i:], src[i:])
}

// exp16 is exp32 on 16 lanes: the same range reduction and polynomial, with 2^k applied by
// VSCALEFPS. Inputs are clamped to [-87.3, 88.7], so e^x below 1.2e-38 comes out as that.
func exp16(x archsimd.Float32x16) archsimd.Float32x16 {
	x = x.Max(archsimd.BroadcastFloat32x16(-87.3)).Min(archsimd.BroadcastFloat32x16(88.7))
	k := x.Mul(archsimd.BroadcastFloat32x16(1.44269504088896341)).RoundToEvenScaled(0)
	r := k.MulAdd(archsimd.BroadcastFloat32x16(-0.693145751953125), x)
	r = k.MulAdd(archsimd.BroadcastFloat32x16(-1.42860682030941723212e-6), r)
	p := archsimd.BroadcastFloat32x16(1.0 / 720)
	for _, c := range [...]float32{1.0 / 120, 1.0 / 24, 1.0 / 6, 0.5, 1, 1} {
		p = p.MulAdd(r, archsimd.BroadcastFloat32x16(c))
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
	sc, sh := archsimd.BroadcastFloat32x16(scale), archsimd.BroadcastFloat32x16(-shift)
	acc := archsimd.BroadcastFloat32x16(0)
	i := 0
	for ; i+16 <= len(v); i += 16 {
		e := exp16(archsimd.LoadFloat32x16Slice(v[i:]).MulAdd(sc, sh))
		e.StoreSlice(v[i:])
		acc = acc.Add(e)
	}
	var lanes [16]float32
	acc.Store(&lanes)
	var sum float64
	for _, x := range lanes {
		sum += float64(x)
	}
	return sum + expScaledShiftScalar(v[i:], scale, shift)
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
	sigmoidScalar(dst[i:], src[i:])
}

// The row kernels below are 16-lane versions of loops in kernels.go; each leaves a tail of
// fewer than 16 elements to the scalar version (kernels_scalar.go), which machines without
// AVX2 use for everything; simd_avx2_amd64.go has the 8-lane versions.

func load(v []float32) archsimd.Float32x16 { return archsimd.LoadFloat32x16Slice(v) }

func bcast(x float32) archsimd.Float32x16 { return archsimd.BroadcastFloat32x16(x) }

func lanesSum(x archsimd.Float32x16) float64 {
	var l [16]float32
	x.Store(&l)
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
	i := 0
	if haveAVX512 {
		al := bcast(alpha)
		for ; i+16 <= len(dst); i += 16 {
			load(dst[i:]).MulAdd(al, load(x[i:])).StoreSlice(dst[i:])
		}
	}
	axpbyScalar(dst[i:], x[i:], alpha)
}

// axpy32 sets dst += alpha·x.
func axpy32(dst, x []float32, alpha float32) {
	if useAVX2 {
		axpy8(dst, x, alpha)
		return
	}
	i := 0
	if haveAVX512 {
		al := bcast(alpha)
		for ; i+16 <= len(dst); i += 16 {
			load(x[i:]).MulAdd(al, load(dst[i:])).StoreSlice(dst[i:])
		}
	}
	axpyScalar(dst[i:], x[i:], alpha)
}

// mulScaled32 sets dst = a·b·s (RMSNorm: x·w·inv).
func mulScaled32(dst, a, b []float32, s float32) {
	if useAVX2 {
		mulScaled8(dst, a, b, s)
		return
	}
	i := 0
	if haveAVX512 {
		sc := bcast(s)
		for ; i+16 <= len(dst); i += 16 {
			load(a[i:]).Mul(load(b[i:])).Mul(sc).StoreSlice(dst[i:])
		}
	}
	mulScaledScalar(dst[i:], a[i:], b[i:], s)
}

// rmsBack32 sets (or adds to) dx the RMSNorm input gradient inv·dy·w − x·c.
func rmsBack32(dx, dy, w, x []float32, inv, c float32, accumulate bool) {
	if useAVX2 {
		rmsBack8(dx, dy, w, x, inv, c, accumulate)
		return
	}
	i := 0
	if haveAVX512 {
		iv, cc := bcast(inv), bcast(-c)
		for ; i+16 <= len(dx); i += 16 {
			g := load(dy[i:]).Mul(load(w[i:])).Mul(iv)
			g = load(x[i:]).MulAdd(cc, g)
			if accumulate {
				g = g.Add(load(dx[i:]))
			}
			g.StoreSlice(dx[i:])
		}
	}
	rmsBackScalar(dx[i:], dy[i:], w[i:], x[i:], inv, c, accumulate)
}

// softmaxBackRow32 sets dr = p·(dr − d)·scale.
func softmaxBackRow32(p, dr []float32, d, scale float32) {
	if useAVX2 {
		softmaxBackRow8(p, dr, d, scale)
		return
	}
	i := 0
	if haveAVX512 {
		dd, sc := bcast(d), bcast(scale)
		for ; i+16 <= len(p); i += 16 {
			load(dr[i:]).Sub(dd).Mul(load(p[i:])).Mul(sc).StoreSlice(dr[i:])
		}
	}
	softmaxBackRowScalar(p[i:], dr[i:], d, scale)
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
	}
	siluGateBackScalar(da[i:], g[i:], u[i:], sig[i:], dg[i:], du[i:])
}
