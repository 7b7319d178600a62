//go:build goexperiment.simd && amd64

package engine

import "simd/archsimd"

var haveAVX512 = archsimd.X86.AVX512()

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
