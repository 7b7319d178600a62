//go:build goexperiment.simd && amd64

package quant

import (
	"simd/archsimd"
	"unsafe"
)

// dotQ8_0 is DotQ8_0 with ggml's own AVX2 instructions where the path has them: per block the
// weights' absolute values (VPABSB) times the activations with the weights' signs (VPSIGNB),
// pairs summed to int16 (VPMADDUBSW: at most 2·128·127, never saturating) and those pairs to
// the eight int32 lanes of 4 products each (VPMADDWD by ones), converted and fused-multiply-added
// with the block's scale: the integer sums are exact, so every lane is DotQ8_0's bit for bit.
func dotQ8_0(w, a []byte, nb int) float32 {
	if !vectors() {
		return dotQ8_0Scalar(w, a, nb)
	}
	_, _ = w[nb*BlockBytesQ8_0-1], a[nb*BlockBytesQ8_0-1]
	wq := unsafe.Slice((*int8)(unsafe.Pointer(unsafe.SliceData(w))), len(w))
	aq := unsafe.Slice((*int8)(unsafe.Pointer(unsafe.SliceData(a))), len(a))
	ones := archsimd.BroadcastInt16x16(1)
	var acc archsimd.Float32x8
	for b := range nb {
		at := b * BlockBytesQ8_0
		// d_w·d_a as one float32 product, in a vector: no scalar float code while acc is live.
		d := f16x8(uint16(w[at]) | uint16(w[at+1])<<8).Mul(f16x8(uint16(a[at]) | uint16(a[at+1])<<8))
		x := archsimd.LoadInt8x32Slice(wq[at+2 : at+34])
		y := archsimd.LoadInt8x32Slice(aq[at+2 : at+34])
		pairs := x.Abs().AsUint8x32().DotProductPairsSaturated(y.CopySign(x))
		s := pairs.DotProductPairs(ones).ConvertToFloat32()
		acc = s.MulAdd(d, acc)
	}
	var lanes [8]float32
	acc.Store(&lanes)
	archsimd.ClearAVXUpperBits()
	return hsum8(&lanes)
}

// f16x8 is the half h in every lane, converted in integer instructions (f16Bits) and moved in
// with VMOVD.
func f16x8(h uint16) archsimd.Float32x8 {
	return archsimd.BroadcastUint32x8(f16Bits(h)).AsFloat32x8()
}

// q4KScaledLanesSIMD is q4KScaledLanes with AVX2 where the path has it (false: not run): the
// nibbles' products with the activations summed by pairs (VPMADDUBSW: at most 2·15·128) and the
// pairs by the sub-block's scale (VPMADDWD; the scales are 6-bit).
func q4KScaledLanesSIMD(q []byte, qs *[256]int8, sc *[8]int32, out *[4][8]int32) bool {
	if !vectors() {
		return false
	}
	_ = q[127]
	low, four := archsimd.BroadcastUint8x32(0x0f), archsimd.BroadcastUint32x8(4)
	for p := range 4 {
		v := archsimd.LoadUint8x32Slice(q[32*p : 32*p+32])
		lo := v.And(low).DotProductPairsSaturated(archsimd.LoadInt8x32Slice(qs[64*p : 64*p+32]))
		hi := highNibbles(v, four, low).DotProductPairsSaturated(archsimd.LoadInt8x32Slice(qs[64*p+32 : 64*p+64]))
		lanes := lo.DotProductPairs(archsimd.BroadcastInt16x16(int16(sc[2*p]))).Add(hi.DotProductPairs(archsimd.BroadcastInt16x16(int16(sc[2*p+1]))))
		lanes.Store(&out[p])
	}
	archsimd.ClearAVXUpperBits()
	return true
}

// q6KLanesSIMD is q6KLanes with AVX2 where the path has it (false: not run): per 32 elements
// the 6-bit values assembled from their nibbles and bit pairs, their products with the
// activations summed by pairs (VPMADDUBSW) and the pairs by the scale of their 16 (VPMADDWD).
func q6KLanesSIMD(x []byte, qs *[256]int8, lanes *[8]int32) bool {
	if !vectors() {
		return false
	}
	_ = x[207]
	low, two := archsimd.BroadcastUint8x32(0x0f), archsimd.BroadcastUint8x32(3)
	// Shifts by vectors of counts over 32-bit lanes (VPSRLVD, VPSLLVD): a count in a register is
	// a legacy-SSE move (vexcheck), and AVX2 has no 16-bit shift by a vector. Bits that cross
	// into a neighbouring byte are masked away after each shift, so the lane width does not matter.
	shr := func(v archsimd.Uint8x32, n archsimd.Uint32x8) archsimd.Uint8x32 {
		return v.AsUint32x8().ShiftRight(n).AsUint8x32()
	}
	shl4 := func(v archsimd.Uint8x32, four archsimd.Uint32x8) archsimd.Uint8x32 { // v < 4: no bit leaves its byte
		return v.AsUint32x8().ShiftLeft(four).AsUint8x32()
	}
	by2, by4, by6 := archsimd.BroadcastUint32x8(2), archsimd.BroadcastUint32x8(4), archsimd.BroadcastUint32x8(6)
	var acc archsimd.Int32x8
	for half := range 2 {
		ql0 := archsimd.LoadUint8x32Slice(x[64*half : 64*half+32])
		ql1 := archsimd.LoadUint8x32Slice(x[64*half+32 : 64*half+64])
		qh := archsimd.LoadUint8x32Slice(x[128+32*half : 128+32*half+32])
		for t := range 4 {
			var v archsimd.Uint8x32
			switch t {
			case 0:
				v = ql0.And(low).Or(shl4(qh.And(two), by4))
			case 1:
				v = ql1.And(low).Or(shl4(shr(qh, by2).And(two), by4))
			case 2:
				v = shr(ql0, by4).And(low).Or(shl4(shr(qh, by4).And(two), by4))
			default:
				v = shr(ql1, by4).And(low).Or(shl4(shr(qh, by6).And(two), by4))
			}
			e := 128*half + 32*t
			// The first 16 elements take one scale, the next 16 the other.
			a, b := int16(int8(x[192+e/16])), int16(int8(x[192+e/16+1]))
			sc := archsimd.BroadcastInt16x16(a).SetHi(archsimd.BroadcastInt16x8(b))
			pairs := v.DotProductPairsSaturated(archsimd.LoadInt8x32Slice(qs[e : e+32]))
			acc = acc.Add(pairs.DotProductPairs(sc))
		}
	}
	acc.Store(lanes)
	archsimd.ClearAVXUpperBits()
	return true
}

// highNibbles is each byte of v shifted right by four (four: a vector of 4s), as bytes.
func highNibbles(v archsimd.Uint8x32, four archsimd.Uint32x8, low archsimd.Uint8x32) archsimd.Uint8x32 {
	return v.AsUint32x8().ShiftRight(four).AsUint8x32().And(low)
}

// fmaHW is a·b + c by VFMADD231SS where the path has it (AVX2 implies FMA here).
func fmaHW(a, b, c float32) (float32, bool) {
	if !vectors() {
		return 0, false
	}
	return archsimd.BroadcastFloat32x4(a).MulAdd(archsimd.BroadcastFloat32x4(b), archsimd.BroadcastFloat32x4(c)).GetElem(0), true
}

// dotQ4_KSIMD is DotQ4_K with its lanes in vector registers where the path has AVX2 (false: not
// run): the integer lanes as q4KScaledLanesSIMD's, summed over the four pairs, converted and
// fused-multiply-added with d; the mins' four lanes fused-multiply-added with dmin as one
// vector. The same operations on the same floats, lane for lane, as dotQ4_KScalar.
func dotQ4_KSIMD(w []byte, a []BlockQ8_K) (float32, bool) {
	if !vectors() {
		return 0, false
	}
	_ = w[len(a)*BlockBytesQ4_K-1]
	low, four := archsimd.BroadcastUint8x32(0x0f), archsimd.BroadcastUint32x8(4)
	// Arrays declared once, outside the vector loop: zeroing or copying one is a legacy-SSE
	// move. The mins' accumulator is 8 lanes wide (the last 4 stay 0): a Float32x4 is moved
	// by legacy-SSE instructions too.
	var pmi [8]int32
	var acc, accM archsimd.Float32x8
	for b := range a {
		y := &a[b]
		x := w[b*BlockBytesQ4_K : (b+1)*BlockBytesQ4_K]
		// q4KBlockHead's floats in vector registers, each the same one rounding: d_a·d_w,
		// d_a·(−dmin_w) (= −d_a·dmin_w exactly), the mins' integer sums converted.
		da := archsimd.BroadcastUint32x8(*(*uint32)(unsafe.Pointer(&y.D))).AsFloat32x8()
		d := da.Mul(f16x8(uint16(x[0]) | uint16(x[1])<<8))
		dmin := da.Mul(archsimd.BroadcastUint32x8(f16Bits(uint16(x[2])|uint16(x[3])<<8) ^ 1<<31).AsFloat32x8())
		sc, mn := q4KScalesMinsPacked(x)
		for n := range 4 {
			bs := y.Bsums[4*n:]
			pmi[n] = int32(mn>>(16*n)&0xff)*int32(bs[0]+bs[1]) + int32(mn>>(16*n+8)&0xff)*int32(bs[2]+bs[3])
		}
		accM = archsimd.LoadInt32x8(&pmi).ConvertToFloat32().MulAdd(dmin, accM)
		q := x[16:]
		var lanes archsimd.Int32x8
		for p := range 4 {
			v := archsimd.LoadUint8x32Slice(q[32*p : 32*p+32])
			lo := v.And(low).DotProductPairsSaturated(archsimd.LoadInt8x32Slice(y.Qs[64*p : 64*p+32]))
			hi := highNibbles(v, four, low).DotProductPairsSaturated(archsimd.LoadInt8x32Slice(y.Qs[64*p+32 : 64*p+64]))
			lanes = lanes.Add(lo.DotProductPairs(archsimd.BroadcastInt16x16(int16(sc >> (16 * p) & 0xff)))).Add(hi.DotProductPairs(archsimd.BroadcastInt16x16(int16(sc >> (16*p + 8) & 0xff))))
		}
		acc = lanes.ConvertToFloat32().MulAdd(d, acc)
	}
	var l, m [8]float32
	acc.Store(&l)
	accM.Store(&m)
	archsimd.ClearAVXUpperBits()
	return hsum8(&l) + ((m[0] + m[2]) + (m[1] + m[3])), true
}
