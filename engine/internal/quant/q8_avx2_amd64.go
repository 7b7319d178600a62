//go:build goexperiment.simd && amd64

package quant

import (
	"simd/archsimd"
	"unsafe"
)

// q8Outputs computes outputs lo ≤ o < hi of Q8_0Product with AVX2: each block's 32 int8 weights
// are widened to four float32 vectors once (VPMOVSXBD, VCVTDQ2PS) and multiplied into every
// row, the block's sum scaled by d into a vector accumulator per row. w must have 16 readable
// bytes past its last block (QuantizeQ8_0 allocates them): the last quarter of a block is
// loaded as 16 bytes of which 8 are used.
func q8Outputs(y, x []float32, w []byte, R, K, N, lo, hi int) {
	if !vectors() || cap(w) < len(w)+16 {
		q8OutputsScalar(y, x, w, R, K, N, lo, hi)
		return
	}
	// Rows in groups of at most maxSIMDRows (an accumulator register each): a block is widened
	// once per group.
	for r0 := 0; r0 < R; r0 += maxSIMDRows {
		n := min(maxSIMDRows, R-r0)
		q8OutputsRows(y[r0*N:], x[r0*K:], w, n, K, N, lo, hi)
	}
}

// q8OutputsRows is q8Outputs for R ≤ maxSIMDRows rows. No scalar float code runs between its
// vector operations (vexcheck): the scale is broadcast from its bits, and each output's lanes
// are summed in vectors (hsumRows) and stored through integer moves.
func q8OutputsRows(y, x []float32, w []byte, R, K, N, lo, hi int) {
	nb := K / BlockQ8_0
	all := unsafe.Slice((*int8)(unsafe.Pointer(unsafe.SliceData(w))), cap(w))
	yb := unsafe.Slice((*uint32)(unsafe.Pointer(unsafe.SliceData(y))), len(y))
	var acc [maxSIMDRows]archsimd.Float32x8
	var sums [maxSIMDRows]uint32
	for o := lo; o < hi; o++ {
		for r := range R {
			acc[r] = archsimd.Float32x8{}
		}
		base := o * nb * BlockBytesQ8_0
		for b := range nb {
			at := base + b*BlockBytesQ8_0
			d := archsimd.BroadcastUint32x8(f16Bits(uint16(w[at]) | uint16(w[at+1])<<8)).AsFloat32x8()
			q := all[at+2:]
			w0 := archsimd.LoadInt8x16Slice(q[0:16]).ExtendLo8ToInt32().ConvertToFloat32()
			w1 := archsimd.LoadInt8x16Slice(q[8:24]).ExtendLo8ToInt32().ConvertToFloat32()
			w2 := archsimd.LoadInt8x16Slice(q[16:32]).ExtendLo8ToInt32().ConvertToFloat32()
			w3 := archsimd.LoadInt8x16Slice(q[24:40]).ExtendLo8ToInt32().ConvertToFloat32()
			for r := range R {
				xr := x[r*K+b*BlockQ8_0:]
				s := archsimd.LoadFloat32x8Slice(xr[0:8]).Mul(w0)
				s = archsimd.LoadFloat32x8Slice(xr[8:16]).MulAdd(w1, s)
				s = archsimd.LoadFloat32x8Slice(xr[16:24]).MulAdd(w2, s)
				s = archsimd.LoadFloat32x8Slice(xr[24:32]).MulAdd(w3, s)
				acc[r] = s.MulAdd(d, acc[r])
			}
		}
		for r := 0; r < R; r += 4 {
			hsumRows(acc[r], acc[r+1], acc[r+2], acc[r+3]).AsUint32x4().Store((*[4]uint32)(sums[r : r+4]))
		}
		for r := range R {
			yb[r*N+o] = sums[r]
		}
	}
	archsimd.ClearAVXUpperBits()
}

// hsumRows returns the sums of the lanes of a0…a3, each ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)),
// in vector registers (VHADDPS).
func hsumRows(a0, a1, a2, a3 archsimd.Float32x8) archsimd.Float32x4 {
	u := a0.AddPairsGrouped(a1).AddPairsGrouped(a2.AddPairsGrouped(a3))
	return u.GetLo().Add(u.GetHi())
}

// q8BlockPairs is q8BlockPairsScalar with AVX2: the block's 32 int8 widened to four float32
// vectors (as q8Outputs does), each multiplied by d (one rounding, as the scalar product) and
// rounded to bf16 in integer lanes (add 0x7fff and the kept bit's parity, keep the top half:
// BF16Of's rounding; d·q is never NaN, d being a finite f16). Even elements take the low half
// of their word, odd ones the high half. The widening into pairs, once per weight and product
// of a training pass, was most of what training over Q8_0 spent beyond bf16 on the 1b shape.
// w must have 16 readable bytes past its last block (QuantizeQ8_0 allocates them).
func q8BlockPairs(dst []uint32, stride int, w []byte, at int) {
	if !vectors() || cap(w) < at+BlockBytesQ8_0+16 {
		q8BlockPairsScalar(dst, stride, w, at)
		return
	}
	all := unsafe.Slice((*int8)(unsafe.Pointer(unsafe.SliceData(w))), cap(w))
	d := archsimd.BroadcastUint32x8(f16Bits(uint16(w[at]) | uint16(w[at+1])<<8)).AsFloat32x8()
	q := all[at+2:]
	one := archsimd.BroadcastUint32x8(1)
	half := archsimd.BroadcastUint32x8(0x7fff)
	top := archsimd.BroadcastUint32x8(0xffff0000)
	sixteen := archsimd.BroadcastUint32x8(16) // a shift by a vector: a count in a register is a legacy-SSE move
	var r [BlockQ8_0]uint32
	for i := range 4 {
		v := archsimd.LoadInt8x16Slice(q[8*i : 8*i+16]).ExtendLo8ToInt32().ConvertToFloat32().Mul(d).AsUint32x8()
		v = v.Add(half).Add(v.ShiftRight(sixteen).And(one)).And(top)
		v.Store((*[8]uint32)(r[8*i : 8*i+8]))
	}
	archsimd.ClearAVXUpperBits()
	_ = dst[(BlockQ8_0/2-1)*stride]
	for j := range BlockQ8_0 / 2 {
		dst[j*stride] = r[2*j]>>16 | r[2*j+1]
	}
}
