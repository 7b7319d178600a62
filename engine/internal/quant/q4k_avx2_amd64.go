//go:build goexperiment.simd && amd64

package quant

import (
	"simd/archsimd"
	"unsafe"
)

// q4KBlockFloats is one super-block of DequantizeQ4_K with AVX2 (false: not run), the same
// floats bit for bit: per sub-block d·sc and dmin·m as float32 products, then each weight
// (d·sc)·q rounded and the min subtracted, two roundings as the scalar code's (no FMA). Eight
// nibble bytes at a time are zero-extended to 32-bit lanes (VPMOVZXBD), the low nibble masked
// and the high one shifted out; both sub-blocks of a 32-byte run come from the same bytes.
func q4KBlockFloats(out *[BlockQ4_K]float32, x []byte) bool {
	if !vectors() {
		return false
	}
	_ = x[BlockBytesQ4_K-1]
	d := f16x8(uint16(x[0]) | uint16(x[1])<<8)
	dmin := f16x8(uint16(x[2]) | uint16(x[3])<<8)
	sc, mn := q4KScalesMinsPacked(x)
	low, four := archsimd.BroadcastUint32x8(0x0f), archsimd.BroadcastUint32x8(4)
	q := x[16:]
	for p := range 4 {
		s1 := archsimd.BroadcastInt32x8(int32(sc >> (16 * p) & 0xff)).ConvertToFloat32()
		s2 := archsimd.BroadcastInt32x8(int32(sc >> (16*p + 8) & 0xff)).ConvertToFloat32()
		m1 := archsimd.BroadcastInt32x8(int32(mn >> (16 * p) & 0xff)).ConvertToFloat32()
		m2 := archsimd.BroadcastInt32x8(int32(mn >> (16*p + 8) & 0xff)).ConvertToFloat32()
		d1, mm1, d2, mm2 := d.Mul(s1), dmin.Mul(m1), d.Mul(s2), dmin.Mul(m2)
		for h := range 2 {
			v := archsimd.LoadUint8x16Slice(q[32*p+16*h : 32*p+16*h+16])
			for c := range 2 {
				// Bytes 0–7 or 8–15 of v, widened (no 128-bit value is copied: the compiler
				// moves those with legacy-SSE instructions).
				var u archsimd.Uint32x8
				if c == 0 {
					u = v.ExtendLo8ToUint32()
				} else {
					u = v.ConcatShiftBytesRight(8, v).ExtendLo8ToUint32()
				}
				i := 64*p + 16*h + 8*c
				d1.Mul(u.And(low).AsInt32x8().ConvertToFloat32()).Sub(mm1).Store((*[8]float32)(out[i : i+8]))
				d2.Mul(u.ShiftRight(four).AsInt32x8().ConvertToFloat32()).Sub(mm2).Store((*[8]float32)(out[i+32 : i+40]))
			}
		}
	}
	archsimd.ClearAVXUpperBits()
	return true
}

// q4KBlockPairs is one super-block of the widening into bf16 pairs (q4KBlockPairsScalar) with
// AVX2 (false: not run): q4KBlockFloats's floats as superBlockPairs writes them.
func q4KBlockPairs(dst []uint32, stride int, x []byte) bool {
	var f [BlockQ4_K]float32
	if !q4KBlockFloats(&f, x) {
		return false
	}
	superBlockPairs(dst, stride, &f)
	return true
}

// q6KBlockPairs is one super-block of Q6_KPairs with AVX2 (false: not run).
func q6KBlockPairs(dst []uint32, stride int, x []byte) bool {
	var f [BlockQ6_K]float32
	if !q6KBlockFloats(&f, x) {
		return false
	}
	superBlockPairs(dst, stride, &f)
	return true
}

// superBlockPairs writes 256 floats as bf16 pairs: each rounded in integer lanes as
// q8BlockPairs rounds it (in place), then element 2j in the low half of word j (at
// dst[j·stride]), 2j+1 in the high half.
func superBlockPairs(dst []uint32, stride int, f *[256]float32) {
	_ = dst[(256/2-1)*stride]
	r := (*[256]uint32)(unsafe.Pointer(f))
	one := archsimd.BroadcastUint32x8(1)
	half := archsimd.BroadcastUint32x8(0x7fff)
	top := archsimd.BroadcastUint32x8(0xffff0000)
	sixteen := archsimd.BroadcastUint32x8(16)
	for i := 0; i < 256; i += 8 {
		v := archsimd.LoadUint32x8((*[8]uint32)(r[i : i+8]))
		v.Add(half).Add(v.ShiftRight(sixteen).And(one)).And(top).Store((*[8]uint32)(r[i : i+8]))
	}
	archsimd.ClearAVXUpperBits()
	for j := range 256 / 2 {
		dst[j*stride] = r[2*j]>>16 | r[2*j+1]
	}
}

// q6KBlockFloats is one super-block of DequantizeQ6_K with AVX2 (false: not run), the same floats
// bit for bit: per 16 weights (d·sc) as one float32 product, then times q − 32. Eight bytes of
// low nibbles and of high bit pairs at a time, zero-extended to 32-bit lanes; each of the four
// quarters of a half takes its nibble and its bit pair by masks and shifts by vectors.
func q6KBlockFloats(out *[BlockQ6_K]float32, x []byte) bool {
	if !vectors() {
		return false
	}
	_ = x[BlockBytesQ6_K-1]
	d := f16x8(uint16(x[208]) | uint16(x[209])<<8)
	low, three, bias := archsimd.BroadcastInt32x8(0x0f), archsimd.BroadcastInt32x8(3), archsimd.BroadcastInt32x8(32)
	by2, by4, by6 := archsimd.BroadcastUint32x8(2), archsimd.BroadcastUint32x8(4), archsimd.BroadcastUint32x8(6)
	for h := range 2 {
		for l := 0; l < 32; l += 8 {
			// Every load of 16 bytes (8 used) stays inside the 210-byte block.
			a := archsimd.LoadUint8x16Slice(x[64*h+l : 64*h+l+16]).ExtendLo8ToUint32()
			b := archsimd.LoadUint8x16Slice(x[64*h+l+32 : 64*h+l+48]).ExtendLo8ToUint32()
			hb := archsimd.LoadUint8x16Slice(x[128+32*h+l : 128+32*h+l+16]).ExtendLo8ToUint32()
			is := 192 + 8*h + l/16
			for k := range 4 {
				var q archsimd.Int32x8
				switch k {
				case 0:
					q = a.AsInt32x8().And(low).Or(hb.AsInt32x8().And(three).AsUint32x8().ShiftLeft(by4).AsInt32x8())
				case 1:
					q = b.AsInt32x8().And(low).Or(hb.ShiftRight(by2).AsInt32x8().And(three).AsUint32x8().ShiftLeft(by4).AsInt32x8())
				case 2:
					q = a.ShiftRight(by4).AsInt32x8().Or(hb.ShiftRight(by4).AsInt32x8().And(three).AsUint32x8().ShiftLeft(by4).AsInt32x8())
				default:
					q = b.ShiftRight(by4).AsInt32x8().Or(hb.ShiftRight(by6).AsInt32x8().And(three).AsUint32x8().ShiftLeft(by4).AsInt32x8())
				}
				ds := d.Mul(archsimd.BroadcastInt32x8(int32(int8(x[is+2*k]))).ConvertToFloat32())
				i := 128*h + 32*k + l
				ds.Mul(q.Sub(bias).ConvertToFloat32()).Store((*[8]float32)(out[i : i+8]))
			}
		}
	}
	archsimd.ClearAVXUpperBits()
	return true
}
