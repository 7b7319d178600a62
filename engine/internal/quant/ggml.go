package quant

import (
	"encoding/binary"
	"math"

	"github.com/skein-ai/skein/engine/internal/num"
)

// llama.cpp's CPU backend (ggml-cpu) multiplies a quantized weight by rounding each input row of
// the product (the activations) to blocks of 8-bit integers first and then taking integer dot
// products: Q8_0 blocks of 32 (one f16 scale each) for Q8_0 weights, Q8_K blocks of 256 (a
// float32 scale and sums of 16) for Q4_K and Q6_K. The functions here do that the way the
// prebuilt x86 AVX2 build (node-llama-cpp's haswell variant) does, so that a product over the same
// blocks gives llama.cpp's value: the rounding rules of quantize_row_q8_0 (AVX2) and
// quantize_row_q8_K(_ref), the integer sums of ggml_vec_dot_*_q8_* in the AVX2 kernel's eight
// 32-bit lanes, and its float combination (each lane converted to float32 and fused-multiply-added
// with the block's scale, the lanes summed as hsum_float_8 does). Scalar Go: it is for
// exactness.

// BlockQ8_K is one block of 256 activations as ggml's block_q8_K: value = D·Qs, with Bsums the
// sums of 16 consecutive Qs (the Q4_K product's min term and the Q6_K product's offset use them).
type BlockQ8_K struct {
	D     float32
	Qs    [256]int8
	Bsums [16]int16
}

// QuantizeActQ8_0 rounds x (a multiple of 32 values) to Q8_0 blocks in dst (34 bytes each) as
// ggml-cpu's quantize_row_q8_0 does on AVX2: per block amax = max|x|, d = amax/127 stored as f16,
// q = x·(127/amax) rounded to nearest, ties to even (_mm256_round_ps). The reference quantizer
// (QuantizeQ8_0, for weights) multiplies by 1/d and rounds ties away from zero: another block for
// some inputs.
func QuantizeActQ8_0(dst []byte, x []float32) {
	for b := range len(x) / BlockQ8_0 {
		blk := x[b*BlockQ8_0 : (b+1)*BlockQ8_0]
		var amax float32
		for _, v := range blk {
			amax = max(amax, abs32(v))
		}
		d := amax / 127
		var id float32
		if amax != 0 {
			id = 127 / amax
		}
		o := dst[b*BlockBytesQ8_0 : (b+1)*BlockBytesQ8_0]
		h := F32ToF16(d)
		o[0], o[1] = byte(h), byte(h>>8)
		for j, v := range blk {
			o[2+j] = byte(int8(math.RoundToEven(float64(float32(v * id)))))
		}
	}
}

// QuantizeActQ8_K rounds x (a multiple of 256 values) to Q8_K blocks as quantize_row_q8_K_ref
// does (the AVX2 build calls the reference): max is the value of largest magnitude (the first
// such), iscale = −127/max, q = nearest_int(iscale·x) capped at 127, d = 1/iscale; a block of
// zeros has d = 0. The repacked Q4_K kernel's 4-row quantizer (quantize_mat_q8_K_4x8) picks the
// sign of the scale otherwise when +max and −max both occur; it negates d and every q then, and
// the products, d·Σq·w, are the same floats.
func QuantizeActQ8_K(dst []BlockQ8_K, x []float32) {
	for b := range len(x) / 256 {
		blk := x[b*256 : (b+1)*256]
		y := &dst[b]
		var amax, mx float32
		for _, v := range blk {
			if a := abs32(v); a > amax {
				amax, mx = a, v
			}
		}
		if amax == 0 {
			*y = BlockQ8_K{}
			continue
		}
		iscale := -127 / mx
		for j, v := range blk {
			y.Qs[j] = int8(min(127, nearestInt(float32(iscale*v))))
		}
		for j := range 16 {
			s := 0
			for _, q := range y.Qs[16*j : 16*j+16] {
				s += int(q)
			}
			y.Bsums[j] = int16(s)
		}
		y.D = 1 / iscale
	}
}

func abs32(v float32) float32 { return math.Float32frombits(math.Float32bits(v) &^ (1 << 31)) }

// fma32 is a·b + c rounded once to float32, as VFMADD does: the instruction where the path has
// it (fmaHW), else num.FMA32's exact emulation (the same float).
func fma32(a, b, c float32) float32 {
	if r, ok := fmaHW(a, b, c); ok {
		return r
	}
	return num.FMA32(a, b, c)
}

// hsum8 is ggml's hsum_float_8: the high half added to the low, then lanes 0+2 and 1+3, then the
// two.
func hsum8(v *[8]float32) float32 {
	r0, r1, r2, r3 := v[4]+v[0], v[5]+v[1], v[6]+v[2], v[7]+v[3]
	return (r0 + r2) + (r1 + r3)
}

// DotQ8_0 is ggml_vec_dot_q8_0_q8_0 (AVX2; llamafile's tinyBLAS_Q0_AVX, which the prebuilt
// runs for several rows, sums in the same lanes and order) of nb blocks of weights w and
// activations a: per block, lane m holds the integer sum of products 4m…4m+3, converted to
// float32 and fused-multiply-added with d_w·d_a into lane m of the accumulator.
func DotQ8_0(w, a []byte, nb int) float32 { return dotQ8_0(w, a, nb) }

// dotQ8_0Scalar is DotQ8_0 in plain Go: the reference the SIMD kernels are checked against.
func dotQ8_0Scalar(w, a []byte, nb int) float32 {
	var acc [8]float32
	for b := range nb {
		wb := w[b*BlockBytesQ8_0 : (b+1)*BlockBytesQ8_0]
		ab := a[b*BlockBytesQ8_0 : (b+1)*BlockBytesQ8_0]
		d := F16ToF32(uint16(wb[0])|uint16(wb[1])<<8) * F16ToF32(uint16(ab[0])|uint16(ab[1])<<8)
		wq, aq := wb[2:34], ab[2:34]
		for m := range 8 {
			s := int32(0)
			for j := 4 * m; j < 4*m+4; j++ {
				s += int32(int8(wq[j])) * int32(int8(aq[j]))
			}
			acc[m] = fma32(d, float32(s), acc[m])
		}
	}
	return hsum8(&acc)
}

// DotQ4_K is ggml_vec_dot_q4_K_q8_K (AVX2) of Q4_K weight blocks w and activations a (one block
// each per 256): per block, lane m (of 8) is Σ sc_j·q4·q8 over the elements whose index mod 32 is
// in 4m…4m+3, fused-multiply-added with d_a·d_w; the mins term takes four lanes, lane n being
// m_2n·(bsums 4n + 4n+1) + m_2n+1·(bsums 4n+2 + 4n+3), fused-multiply-added with −d_a·dmin_w;
// the result is hsum_float_8 of the first plus (lanes 0+2) + (1+3) of the second.
func DotQ4_K(w []byte, a []BlockQ8_K) float32 {
	if r, ok := dotQ4_KSIMD(w, a); ok {
		return r
	}
	return dotQ4_KScalar(w, a)
}

// q4KScalesMins are a Q4_K super-block's eight 6-bit scales and mins (scaleMinK4).
// They are written through pointers: arrays returned by value are copied through X registers
// by legacy-SSE moves, which the vector kernel must not run (vexcheck).
func q4KScalesMins(x []byte, sc, mn *[8]int32) {
	for j := range 8 {
		s, m := scaleMinK4(j, x[4:16])
		sc[j], mn[j] = int32(s), int32(m)
	}
}

// q4KScalesMinsPacked is q4KScalesMins as ggml's AVX2 kernel unpacks them, in 32-bit words:
// byte j of sc (mn) is scale (min) j. Inlined, so the vector kernel calls nothing.
func q4KScalesMinsPacked(x []byte) (sc, mn uint64) {
	u01 := binary.LittleEndian.Uint64(x[4:12])
	u2 := uint64(binary.LittleEndian.Uint32(x[12:16]))
	u2 |= u2 << 28 // byte i of the top half: byte i >> 4
	// Scales 0–3 and mins 0–3 are bytes 0–7 of u01; scales 4–7 and mins 4–7 take u2's low and
	// high nibbles, and u01's top two bits as their bits 4–5.
	hi := u2&0x0f0f0f0f_0f0f0f0f | (u01>>6&0x03030303_03030303)<<4
	sc = u01&0x3f3f3f3f | hi<<32
	mn = u01>>32&0x3f3f3f3f | hi>>32<<32
	return sc, mn
}

// q4KBlockHead is what DotQ4_K's kernels take of one super-block x before its nibbles: d_a·d_w,
// −d_a·dmin_w, the eight scales, and the mins term's four lanes m_2n·(bsums 4n + 4n+1) +
// m_2n+1·(bsums 4n+2 + 4n+3) as float32.
func q4KBlockHead(x []byte, y *BlockQ8_K) (d, dmin float32, sc [8]int32, pm [4]float32) {
	d = y.D * F16ToF32(uint16(x[0])|uint16(x[1])<<8)
	dmin = -y.D * F16ToF32(uint16(x[2])|uint16(x[3])<<8)
	var mn [8]int32
	q4KScalesMins(x, &sc, &mn)
	for n := range 4 {
		bs := y.Bsums[4*n:]
		pm[n] = float32(mn[2*n]*int32(bs[0]+bs[1]) + mn[2*n+1]*int32(bs[2]+bs[3]))
	}
	return d, dmin, sc, pm
}

// dotQ4_KScalar is DotQ4_K in plain Go: the reference the SIMD kernel is checked against.
func dotQ4_KScalar(w []byte, a []BlockQ8_K) float32 {
	var acc [8]float32
	var accM [4]float32
	for b := range a {
		y := &a[b]
		x := w[b*BlockBytesQ4_K : (b+1)*BlockBytesQ4_K]
		d, dmin, sc, pm := q4KBlockHead(x, y)
		for n := range 4 {
			accM[n] = fma32(dmin, pm[n], accM[n])
		}
		var sl [4][8]int32
		q4KScaledLanes(x[16:BlockBytesQ4_K], &y.Qs, &sc, &sl)
		var lanes [8]int32 // integer sums: the same in any order
		for j := range 4 {
			for m := range 8 {
				lanes[m] += sl[j][m]
			}
		}
		for m := range 8 {
			acc[m] = fma32(d, float32(lanes[m]), acc[m])
		}
	}
	return hsum8(&acc) + ((accM[0] + accM[2]) + (accM[1] + accM[3]))
}

// q4KSums is one Q4_K super-block's integer sums with Q8_K activations, by pairs of sub-blocks
// (64 weights: the repacked kernels' step): isum[p] = sc_2p·Σq4·q8 + sc_2p+1·Σq4·q8 and
// imin[p] = m_2p·(bsums 4p + 4p+1) + m_2p+1·(bsums 4p+2 + 4p+3).
func q4KSums(x []byte, y *BlockQ8_K) (isum, imin [4]int32) {
	var sc, mn [8]int32
	q4KScalesMins(x, &sc, &mn)
	var sl [4][8]int32
	q4KScaledLanes(x[16:BlockBytesQ4_K], &y.Qs, &sc, &sl)
	for p := range 4 {
		for m := range 8 {
			isum[p] += sl[p][m]
		}
		bs := y.Bsums[4*p:]
		imin[p] = mn[2*p]*int32(bs[0]+bs[1]) + mn[2*p+1]*int32(bs[2]+bs[3])
	}
	return isum, imin
}

// q4KScaledLanes is a Q4_K super-block's 128 bytes of nibbles q times the Q8_K activations qs,
// scaled by the sub-blocks' scales sc, in eight lanes per pair of sub-blocks (the lanes of ggml's
// AVX2 kernels): out[p][m] = sc[2p]·Σ (q[32p+i] & 15)·qs[64p+i] + sc[2p+1]·Σ (q[32p+i] >> 4)·
// qs[64p+32+i] over i = 4m…4m+3. Integer sums: any order gives the same.
func q4KScaledLanes(q []byte, qs *[256]int8, sc *[8]int32, out *[4][8]int32) {
	if q4KScaledLanesSIMD(q, qs, sc, out) {
		return
	}
	q4KScaledLanesScalar(q, qs, sc, out)
}

func q4KScaledLanesScalar(q []byte, qs *[256]int8, sc *[8]int32, out *[4][8]int32) {
	_ = q[127]
	*out = [4][8]int32{}
	for p := range 4 {
		for i := range 32 {
			lo := int32(q[32*p+i]&0xf) * int32(qs[64*p+i])
			hi := int32(q[32*p+i]>>4) * int32(qs[64*p+32+i])
			out[p][i/4] += sc[2*p]*lo + sc[2*p+1]*hi
		}
	}
}

// DotQ4_KGemm is one output of ggml_gemm_q4_K_8x8_q8_K (AVX2), the kernel of a Q4_K weight that
// ggml-cpu repacked (its rows a multiple of 8) for a group of 4 activation rows: per pair of
// sub-blocks, float32(isum) fused-multiply-added with d_w·d_a and float32(imin) with
// dmin_w·d_a into two accumulators, the second subtracted at the end.
func DotQ4_KGemm(w []byte, a []BlockQ8_K) float32 {
	var acc, accM float32
	for b := range a {
		x := w[b*BlockBytesQ4_K : (b+1)*BlockBytesQ4_K]
		d := F16ToF32(uint16(x[0])|uint16(x[1])<<8) * a[b].D
		dmin := F16ToF32(uint16(x[2])|uint16(x[3])<<8) * a[b].D
		isum, imin := q4KSums(x, &a[b])
		for p := range 4 {
			acc = fma32(float32(isum[p]), d, acc)
			accM = fma32(float32(imin[p]), dmin, accM)
		}
	}
	return acc - accM
}

// DotQ4_KGemv is one output of ggml_gemv_q4_K_8x8_q8_K (AVX2): the repacked kernel for a single
// activation row (the rows past the last group of 4). As DotQ4_KGemm with the integer sums of
// the whole super-block fused-multiply-added once.
func DotQ4_KGemv(w []byte, a []BlockQ8_K) float32 {
	var acc, accM float32
	for b := range a {
		x := w[b*BlockBytesQ4_K : (b+1)*BlockBytesQ4_K]
		d := F16ToF32(uint16(x[0])|uint16(x[1])<<8) * a[b].D
		dmin := F16ToF32(uint16(x[2])|uint16(x[3])<<8) * a[b].D
		isum, imin := q4KSums(x, &a[b])
		acc = fma32(float32(isum[0]+isum[1]+isum[2]+isum[3]), d, acc)
		accM = fma32(float32(imin[0]+imin[1]+imin[2]+imin[3]), dmin, accM)
	}
	return acc - accM
}

// DotQ6_K is ggml_vec_dot_q6_K_q8_K (AVX2) of Q6_K weight blocks w and activations a: per block,
// lane m is Σ sc·q6·q8 (q6 the unsigned 6-bit value) over the elements whose index mod 32 is in
// 4m…4m+3, less 32·(bsums_2m·sc_2m + bsums_2m+1·sc_2m+1) (the −32 offset of every q6), converted to
// float32 and fused-multiply-added with d_a·d_w; the result is hsum_float_8.
func DotQ6_K(w []byte, a []BlockQ8_K) float32 {
	var acc [8]float32
	for b := range a {
		y := &a[b]
		x := w[b*BlockBytesQ6_K : (b+1)*BlockBytesQ6_K]
		scb := x[192:208]
		d := y.D * F16ToF32(uint16(x[208])|uint16(x[209])<<8)
		var lanes [8]int32
		q6KLanes(x, &y.Qs, &lanes)
		for m := range 8 {
			sub := int32(y.Bsums[2*m])*int32(int8(scb[2*m])) + int32(y.Bsums[2*m+1])*int32(int8(scb[2*m+1]))
			acc[m] = fma32(d, float32(lanes[m]-sub<<5), acc[m])
		}
	}
	return hsum8(&acc)
}

// ggmlProductQ8_0 sets y [R, N] = x [R, K]·Wᵀ for Q8_0 rows W [N, K] as ggml-cpu does: each row of
// x rounded to Q8_0 blocks (QuantizeActQ8_0), each output DotQ8_0.
func ggmlProductQ8_0(y, x []float32, w []byte, R, K, N int, parallel func(n int, fn func(lo, hi int))) {
	nb := K / BlockQ8_0
	ggmlRows(y, x, w, R, K, N, nb*BlockBytesQ8_0, nb*BlockBytesQ8_0, QuantizeActQ8_0,
		func(w, a []byte, _ int) float32 { return DotQ8_0(w, a, nb) }, parallel)
}

// ggmlProductQ4_K is ggmlProductK for Q4_K, with the kernel ggml-cpu takes on AVX2: a weight of
// a multiple of 8 rows is repacked (its "extra buffer type"), and multiplied by groups of 4
// activation rows through the gemm kernel and the rest one by one through gemv; any other
// through vec_dot.
func ggmlProductQ4_K(y, x []float32, w []byte, R, K, N int, parallel func(int, func(int, int))) {
	if N%8 != 0 {
		ggmlProductK(func(w []byte, a []BlockQ8_K, _ int) float32 { return DotQ4_K(w, a) }, BlockBytesQ4_K)(y, x, w, R, K, N, parallel)
		return
	}
	grouped := R - R%4
	ggmlProductK(func(w []byte, a []BlockQ8_K, r int) float32 {
		if r < grouped {
			return DotQ4_KGemm(w, a)
		}
		return DotQ4_KGemv(w, a)
	}, BlockBytesQ4_K)(y, x, w, R, K, N, parallel)
}

// ggmlProductK is ggmlProductQ8_0 for a k-quant (Q4_K, Q6_K): the rows of x rounded to Q8_K
// blocks, each output dot(weight row, activation row, the activation row's index).
func ggmlProductK(dot func(w []byte, a []BlockQ8_K, row int) float32, blockBytes int) func(y, x []float32, w []byte, R, K, N int, parallel func(int, func(int, int))) {
	return func(y, x []float32, w []byte, R, K, N int, parallel func(int, func(int, int))) {
		nb := K / 256
		ggmlRows(y, x, w, R, K, N, nb*blockBytes, nb, QuantizeActQ8_K, dot, parallel)
	}
}

// ggmlRows is the loop both products share: every row of x quantized once into actPer elements
// of A, then each output o of every row r as dot(W's row o, r's blocks, r).
func ggmlRows[A any](y, x []float32, w []byte, R, K, N, wRowBytes, actPer int, quantize func(dst []A, x []float32),
	dot func(w []byte, a []A, row int) float32, parallel func(int, func(int, int))) {
	if R == 0 || N == 0 {
		return
	}
	_, _, _ = y[R*N-1], x[R*K-1], w[N*wRowBytes-1]
	a := make([]A, R*actPer)
	parallel(R, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			quantize(a[r*actPer:(r+1)*actPer], x[r*K:(r+1)*K])
		}
	})
	parallel(N, func(lo, hi int) {
		for o := lo; o < hi; o++ {
			wo := w[o*wRowBytes : (o+1)*wRowBytes]
			for r := range R {
				y[r*N+o] = dot(wo, a[r*actPer:(r+1)*actPer], r)
			}
		}
	})
}

// q6KLanes is a Q6_K super-block x's scaled integer sums with the Q8_K activations qs in eight
// lanes: lane m = Σ sc·q6·q8 over the elements whose index mod 32 is in 4m…4m+3 (q6 the
// unsigned 6-bit value, sc the int8 scale of its 16).
func q6KLanes(x []byte, qs *[256]int8, lanes *[8]int32) {
	if q6KLanesSIMD(x, qs, lanes) {
		return
	}
	q6KLanesScalar(x, qs, lanes)
}

func q6KLanesScalar(x []byte, qs *[256]int8, lanes *[8]int32) {
	ql, qh, scb := x[0:128], x[128:192], x[192:208]
	*lanes = [8]int32{}
	for half := range 2 {
		ql, qh := ql[64*half:], qh[32*half:]
		for l := range 32 {
			q := [4]int32{
				int32(ql[l]&0xf | (qh[l]&3)<<4),
				int32(ql[l+32]&0xf | (qh[l]>>2&3)<<4),
				int32(ql[l]>>4 | (qh[l]>>4&3)<<4),
				int32(ql[l+32]>>4 | (qh[l]>>6&3)<<4),
			}
			for t, v := range q {
				e := 128*half + 32*t + l
				lanes[l/4] += int32(int8(scb[e/16])) * v * int32(qs[e])
			}
		}
	}
}
