package quant

import (
	"fmt"
	"math"

	"github.com/skein-ai/skein/engine/internal/num"
)

// Q6_K: super-blocks of 256 weights along a row, each 210 bytes: 128 bytes of low nibbles (ql),
// 64 bytes of high bit pairs (qh), sixteen int8 scales (one per 16 weights), then f16 d.
// Weight = d·sc_j·(q − 32), q in [0, 63]. The quantizer is ggml's reference
// (quantize_row_q6_K_ref: per 16 weights a symmetric least-squares search over 19 scales,
// make_qx_quants with rmse_type 1), operation for operation in float32 as Q4_K's is.
const (
	BlockQ6_K      = 256
	BlockBytesQ6_K = 210
)

// groupMaxEps is ggml's GROUP_MAX_EPS: a group whose largest magnitude is below it is zero.
const groupMaxEps = 1e-15

// makeQX is ggml's make_qx_quants for rmse_type 1 without importance weights (w = x²): levels
// L in [0, 2·nmax) and the group's scale.
func makeQX(nmax int, x []float32, L []int8) float32 {
	var mx, amax float32
	for _, v := range x {
		if ax := float32(math.Abs(float64(v))); ax > amax {
			amax, mx = ax, v
		}
	}
	if amax < groupMaxEps {
		clear(L[:len(x)])
		return 0
	}
	level := func(iscale, v float32) int { return max(-nmax, min(nmax-1, nearestInt(float32(iscale*v)))) }
	sums := func(iscale float32) (sumLX, sumL2 float32) {
		for _, v := range x {
			l := float32(level(iscale, v))
			w := float32(v * v)
			sumLX += float32(float32(w*v) * l)
			sumL2 += float32(float32(w*l) * l)
		}
		return sumLX, sumL2
	}
	iscale := float32(-nmax) / mx
	for i, v := range x {
		L[i] = int8(level(iscale, v) + nmax)
	}
	sumLX, sumL2 := sums(iscale)
	var scale float32
	if sumL2 != 0 {
		scale = sumLX / sumL2
	}
	best := float32(scale * sumLX)
	for is := -9; is <= 9; is++ {
		if is == 0 {
			continue
		}
		iscale = -(float32(nmax) + float32(0.1*float32(is))) / mx
		sumLX, sumL2 = sums(iscale)
		if sumL2 > 0 && float32(sumLX*sumLX) > float32(best*sumL2) {
			for i, v := range x {
				L[i] = int8(level(iscale, v) + nmax)
			}
			scale = sumLX / sumL2
			best = float32(scale * sumLX)
		}
	}
	return scale
}

// QuantizeQ6_K quantizes rows of n weights (n a multiple of 256) as ggml's
// quantize_row_q6_K_ref does.
func QuantizeQ6_K(x []float32, n int) ([]byte, error) {
	if n <= 0 || n%BlockQ6_K != 0 || len(x)%n != 0 {
		return nil, fmt.Errorf("%w: %d weights in rows of %d (blocks of %d)", ErrRowLength, len(x), n, BlockQ6_K)
	}
	nb := len(x) / BlockQ6_K
	out := make([]byte, nb*BlockBytesQ6_K, nb*BlockBytesQ6_K+16)
	for i := range nb {
		quantizeBlockQ6_K(out[i*BlockBytesQ6_K:(i+1)*BlockBytesQ6_K], x[i*BlockQ6_K:(i+1)*BlockQ6_K])
	}
	return out, nil
}

// quantizeBlockQ6_K writes one super-block y of the 256 weights xb.
func quantizeBlockQ6_K(y []byte, xb []float32) {
	var L [BlockQ6_K]int8
	var scales [BlockQ6_K / 16]float32
	var maxScale, maxAbsScale float32
	for ib := range BlockQ6_K / 16 {
		s := makeQX(32, xb[16*ib:16*ib+16], L[16*ib:16*ib+16])
		scales[ib] = s
		if as := float32(math.Abs(float64(s))); as > maxAbsScale {
			maxAbsScale, maxScale = as, s
		}
	}
	if maxAbsScale < groupMaxEps {
		clear(y) // d = +0 too
		return
	}
	iscale := -128 / maxScale
	hd := F32ToF16(1 / iscale)
	y[208], y[209] = byte(hd), byte(hd>>8)
	sc := y[192:208]
	for ib := range BlockQ6_K / 16 {
		sc[ib] = byte(int8(min(127, nearestInt(float32(iscale*scales[ib])))))
	}
	d0 := F16ToF32(hd)
	for j := range BlockQ6_K / 16 {
		d := float32(d0 * float32(int8(sc[j])))
		if d == 0 {
			continue
		}
		for ii := range 16 {
			l := nearestInt(xb[16*j+ii] / d)
			L[16*j+ii] = int8(max(-32, min(31, l)) + 32)
		}
	}
	ql, qh := y[0:128], y[128:192]
	for j := 0; j < BlockQ6_K; j += 128 {
		for l := range 32 {
			q1, q2, q3, q4 := uint8(L[j+l]), uint8(L[j+l+32]), uint8(L[j+l+64]), uint8(L[j+l+96])
			ql[l] = q1&0xf | (q3&0xf)<<4
			ql[l+32] = q2&0xf | (q4&0xf)<<4
			qh[l] = q1>>4 | (q2>>4)<<2 | (q3>>4)<<4 | (q4>>4)<<6
		}
		ql, qh = ql[64:], qh[32:]
	}
}

// Q6_KPairs writes the weight of Q6_K rows W [N, K] as the bf16 GEMM takes it (Q8_0Pairs's
// layout), a super-block at a time, through blockPairs's tiles.
func Q6_KPairs(dst []uint32, w []byte, K, N int, parallel func(n int, fn func(lo, hi int))) {
	blockPairs(dst, w, K, N, BlockQ6_K, BlockBytesQ6_K, q4KPairsTile, func(d []uint32, stride int, w []byte, at int) {
		if !q6KBlockPairs(d, stride, w[at:at+BlockBytesQ6_K]) {
			q6KBlockPairsScalar(d, stride, w[at:at+BlockBytesQ6_K])
		}
	}, parallel)
}

// q6KBlockPairsScalar writes the super-block x as bf16 pairs in plain Go, word j at dst[j·stride].
func q6KBlockPairsScalar(dst []uint32, stride int, x []byte) {
	var f [BlockQ6_K]float32
	q6KBlockFloatsScalar(&f, x)
	_ = dst[(BlockQ6_K/2-1)*stride]
	for j := range BlockQ6_K / 2 {
		dst[j*stride] = uint32(num.BF16Of(f[2*j])) | uint32(num.BF16Of(f[2*j+1]))<<16
	}
}

// DequantizeQ6_K writes the weights of Q6_K blocks into dst (256 per block), as ggml's
// dequantize_row_q6_K: x = d·sc·(q − 32).
func DequantizeQ6_K(dst []float32, blocks []byte) {
	for blk := range len(dst) / BlockQ6_K {
		out := (*[BlockQ6_K]float32)(dst[blk*BlockQ6_K:])
		o := blocks[blk*BlockBytesQ6_K : (blk+1)*BlockBytesQ6_K]
		if !q6KBlockFloats(out, o) {
			q6KBlockFloatsScalar(out, o)
		}
	}
}

// q6KBlockFloatsScalar is one super-block of DequantizeQ6_K in plain Go; each weight is
// (d·sc)·(q − 32), both products rounded (the explicit conversion keeps Go from fusing them).
func q6KBlockFloatsScalar(y *[BlockQ6_K]float32, o []byte) {
	ql, qh, sc := o[0:128], o[128:192], o[192:208]
	d := F16ToF32(uint16(o[208]) | uint16(o[209])<<8)
	for half := range 2 {
		ql, qh, sc, y := ql[64*half:], qh[32*half:], sc[8*half:], y[128*half:]
		for l := range 32 {
			is := l / 16
			q1 := int((ql[l]&0xf)|((qh[l]>>0)&3)<<4) - 32
			q2 := int((ql[l+32]&0xf)|((qh[l]>>2)&3)<<4) - 32
			q3 := int((ql[l]>>4)|((qh[l]>>4)&3)<<4) - 32
			q4 := int((ql[l+32]>>4)|((qh[l]>>6)&3)<<4) - 32
			y[l] = float32(d*float32(int8(sc[is]))) * float32(q1)
			y[l+32] = float32(d*float32(int8(sc[is+2]))) * float32(q2)
			y[l+64] = float32(d*float32(int8(sc[is+4]))) * float32(q3)
			y[l+96] = float32(d*float32(int8(sc[is+6]))) * float32(q4)
		}
	}
}
