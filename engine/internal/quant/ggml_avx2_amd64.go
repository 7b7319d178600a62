//go:build goexperiment.simd && amd64

package quant

import (
	"simd/archsimd"
	"unsafe"

	"github.com/skein-ai/skein/engine/internal/kernels"
)

// dotQ8_0 is DotQ8_0 with ggml's own AVX2 instructions where the path has them: per block the
// weights' absolute values (VPABSB) times the activations with the weights' signs (VPSIGNB),
// pairs summed to int16 (VPMADDUBSW: at most 2·128·127, never saturating) and those pairs to
// the eight int32 lanes of 4 products each (VPMADDWD by ones), converted and fused-multiply-added
// with the block's scale: the integer sums are exact, so every lane is DotQ8_0's bit for bit.
func dotQ8_0(w, a []byte, nb int) float32 {
	if !kernels.FewRowKernels() {
		return dotQ8_0Scalar(w, a, nb)
	}
	_, _ = w[nb*BlockBytesQ8_0-1], a[nb*BlockBytesQ8_0-1]
	wq := unsafe.Slice((*int8)(unsafe.Pointer(unsafe.SliceData(w))), len(w))
	aq := unsafe.Slice((*int8)(unsafe.Pointer(unsafe.SliceData(a))), len(a))
	ones := archsimd.BroadcastInt16x16(1)
	var acc archsimd.Float32x8
	for b := range nb {
		at := b * BlockBytesQ8_0
		d := F16ToF32(uint16(w[at])|uint16(w[at+1])<<8) * F16ToF32(uint16(a[at])|uint16(a[at+1])<<8)
		x := archsimd.LoadInt8x32Slice(wq[at+2 : at+34])
		y := archsimd.LoadInt8x32Slice(aq[at+2 : at+34])
		pairs := x.Abs().AsUint8x32().DotProductPairsSaturated(y.CopySign(x))
		s := pairs.DotProductPairs(ones).ConvertToFloat32()
		acc = s.MulAdd(archsimd.BroadcastFloat32x8(d), acc)
	}
	var lanes [8]float32
	acc.Store(&lanes)
	return hsum8(&lanes)
}

// q4KScaledLanesSIMD is q4KScaledLanes with AVX2 where the path has it (false: not run): the
// nibbles' products with the activations summed by pairs (VPMADDUBSW: at most 2·15·128) and the
// pairs by the sub-block's scale (VPMADDWD; the scales are 6-bit).
func q4KScaledLanesSIMD(q []byte, qs *[256]int8, sc *[8]int32, out *[4][8]int32) bool {
	if !kernels.FewRowKernels() {
		return false
	}
	_ = q[127]
	low := archsimd.BroadcastUint8x32(0x0f)
	for p := range 4 {
		v := archsimd.LoadUint8x32Slice(q[32*p : 32*p+32])
		lo := v.And(low).DotProductPairsSaturated(archsimd.LoadInt8x32Slice(qs[64*p : 64*p+32]))
		hi := v.AsUint16x16().ShiftAllRight(4).AsUint8x32().And(low).DotProductPairsSaturated(archsimd.LoadInt8x32Slice(qs[64*p+32 : 64*p+64]))
		lanes := lo.DotProductPairs(archsimd.BroadcastInt16x16(int16(sc[2*p]))).Add(hi.DotProductPairs(archsimd.BroadcastInt16x16(int16(sc[2*p+1]))))
		lanes.Store(&out[p])
	}
	return true
}

// q6KLanesSIMD is q6KLanes with AVX2 where the path has it (false: not run): per 32 elements
// the 6-bit values assembled from their nibbles and bit pairs, their products with the
// activations summed by pairs (VPMADDUBSW) and the pairs by the scale of their 16 (VPMADDWD).
func q6KLanesSIMD(x []byte, qs *[256]int8, lanes *[8]int32) bool {
	if !kernels.FewRowKernels() {
		return false
	}
	_ = x[207]
	low, two := archsimd.BroadcastUint8x32(0x0f), archsimd.BroadcastUint8x32(3)
	shr := func(v archsimd.Uint8x32, n uint64) archsimd.Uint8x32 {
		return v.AsUint16x16().ShiftAllRight(n).AsUint8x32()
	}
	shl4 := func(v archsimd.Uint8x32) archsimd.Uint8x32 { // v < 4: no bit crosses into the next byte
		return v.AsUint16x16().ShiftAllLeft(4).AsUint8x32()
	}
	var acc archsimd.Int32x8
	var sc [16]int16
	for half := range 2 {
		ql0 := archsimd.LoadUint8x32Slice(x[64*half : 64*half+32])
		ql1 := archsimd.LoadUint8x32Slice(x[64*half+32 : 64*half+64])
		qh := archsimd.LoadUint8x32Slice(x[128+32*half : 128+32*half+32])
		q := [4]archsimd.Uint8x32{
			ql0.And(low).Or(shl4(qh.And(two))),
			ql1.And(low).Or(shl4(shr(qh, 2).And(two))),
			shr(ql0, 4).And(low).Or(shl4(shr(qh, 4).And(two))),
			shr(ql1, 4).And(low).Or(shl4(shr(qh, 6).And(two))),
		}
		for t, v := range q {
			e := 128*half + 32*t
			a, b := int16(int8(x[192+e/16])), int16(int8(x[192+e/16+1]))
			for i := range 8 {
				sc[i], sc[8+i] = a, b
			}
			pairs := v.DotProductPairsSaturated(archsimd.LoadInt8x32Slice(qs[e : e+32]))
			acc = acc.Add(pairs.DotProductPairs(archsimd.LoadInt16x16(&sc)))
		}
	}
	acc.Store(lanes)
	return true
}

// fmaHW is a·b + c by VFMADD231SS where the path has it (AVX2 implies FMA here).
func fmaHW(a, b, c float32) (float32, bool) {
	if !kernels.FewRowKernels() {
		return 0, false
	}
	return archsimd.BroadcastFloat32x4(a).MulAdd(archsimd.BroadcastFloat32x4(b), archsimd.BroadcastFloat32x4(c)).GetElem(0), true
}

// dotQ4_KSIMD is DotQ4_K with its lanes in vector registers where the path has AVX2 (false: not
// run): the integer lanes as q4KScaledLanesSIMD's, summed over the four pairs, converted and
// fused-multiply-added with d; the mins' four lanes fused-multiply-added with dmin as one
// vector. The same operations on the same floats, lane for lane, as dotQ4_KScalar.
func dotQ4_KSIMD(w []byte, a []BlockQ8_K) (float32, bool) {
	if !kernels.FewRowKernels() {
		return 0, false
	}
	_ = w[len(a)*BlockBytesQ4_K-1]
	low := archsimd.BroadcastUint8x32(0x0f)
	var acc archsimd.Float32x8
	var accM archsimd.Float32x4
	for b := range a {
		y := &a[b]
		x := w[b*BlockBytesQ4_K : (b+1)*BlockBytesQ4_K]
		d, dmin, sc, pm := q4KBlockHead(x, y)
		accM = archsimd.LoadFloat32x4(&pm).MulAdd(archsimd.BroadcastFloat32x4(dmin), accM)
		q := x[16:]
		var lanes archsimd.Int32x8
		for p := range 4 {
			v := archsimd.LoadUint8x32Slice(q[32*p : 32*p+32])
			lo := v.And(low).DotProductPairsSaturated(archsimd.LoadInt8x32Slice(y.Qs[64*p : 64*p+32]))
			hi := v.AsUint16x16().ShiftAllRight(4).AsUint8x32().And(low).DotProductPairsSaturated(archsimd.LoadInt8x32Slice(y.Qs[64*p+32 : 64*p+64]))
			lanes = lanes.Add(lo.DotProductPairs(archsimd.BroadcastInt16x16(int16(sc[2*p])))).Add(hi.DotProductPairs(archsimd.BroadcastInt16x16(int16(sc[2*p+1]))))
		}
		acc = lanes.ConvertToFloat32().MulAdd(archsimd.BroadcastFloat32x8(d), acc)
	}
	var l [8]float32
	var m [4]float32
	acc.Store(&l)
	accM.Store(&m)
	return hsum8(&l) + ((m[0] + m[2]) + (m[1] + m[3])), true
}
