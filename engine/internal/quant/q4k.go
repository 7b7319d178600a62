package quant

import (
	"fmt"
	"math"

	"github.com/skein-ai/skein/engine/internal/num"
)

// Q4_K: super-blocks of 256 weights along a row, each 144 bytes: f16 d, f16 dmin, 12 bytes
// packing eight 6-bit scales and eight 6-bit mins (one each per sub-block of 32), then 128 bytes
// of nibbles. Weight = d·sc_j·q − dmin·m_j. The quantizer is ggml's reference
// (quantize_row_q4_K_ref: per sub-block a weighted least-squares search over 21 scales,
// make_qkx2_quants), written here operation for operation in float32, so the blocks are
// ggml's bit for bit (no fused multiply-adds: each product is rounded by an explicit
// conversion, as C without FMA contraction rounds it).
const (
	BlockQ4_K      = 256
	BlockBytesQ4_K = 144
)

// nearestInt rounds half to even through the float32 adder, as ggml's nearest_int does (valid
// for |f| ≤ 4194303).
func nearestInt(f float32) int {
	v := f + 12582912
	return int(int32(math.Float32bits(v)&0x007fffff) - 0x00400000)
}

// makeQKX2 is ggml's make_qkx2_quants (use_mad false): levels L in [0, nmax] and the scale and
// (negated) min of one sub-block, from weighted least squares over nstep+1 trial scales.
func makeQKX2(nmax int, x, weights []float32, L, Laux []uint8, rmin, rdelta float32, nstep int) (scale, theMin float32) {
	n := len(x)
	mn, mx := x[0], x[0]
	sumW := weights[0]
	sumX := float32(sumW * x[0])
	for i := 1; i < n; i++ {
		mn, mx = min(mn, x[i]), max(mx, x[i])
		w := weights[i]
		sumW += w
		sumX += float32(w * x[i])
	}
	if mn > 0 {
		mn = 0
	}
	if mx == mn {
		clear(L[:n])
		return 0, -mn
	}
	iscale := float32(nmax) / (mx - mn)
	scale = 1 / iscale
	var bestError float32
	for i := range n {
		l := nearestInt(float32(iscale * (x[i] - mn)))
		L[i] = uint8(max(0, min(nmax, l)))
		diff := float32(float32(scale*float32(L[i]))+mn) - x[i]
		diff = float32(diff * diff)
		bestError += float32(weights[i] * diff)
	}
	if nstep < 1 {
		return scale, -mn
	}
	for is := 0; is <= nstep; is++ {
		iscale = float32(float32(rmin+float32(rdelta*float32(is)))+float32(nmax)) / (mx - mn)
		var sumL, sumL2, sumXL float32
		for i := range n {
			l := nearestInt(float32(iscale * (x[i] - mn)))
			l = max(0, min(nmax, l))
			Laux[i] = uint8(l)
			w := weights[i]
			fl := float32(l)
			sumL += float32(w * fl)
			sumL2 += float32(float32(w*fl) * fl)
			sumXL += float32(float32(w*fl) * x[i])
		}
		D := float32(sumW*sumL2) - float32(sumL*sumL)
		if D > 0 {
			thisScale := (float32(sumW*sumXL) - float32(sumX*sumL)) / D
			thisMin := (float32(sumL2*sumX) - float32(sumL*sumXL)) / D
			if thisMin > 0 {
				thisMin = 0
				thisScale = sumXL / sumL2
			}
			var curError float32
			for i := range n {
				diff := float32(float32(thisScale*float32(Laux[i]))+thisMin) - x[i]
				diff = float32(diff * diff)
				curError += float32(weights[i] * diff)
			}
			if curError < bestError {
				copy(L[:n], Laux[:n])
				bestError = curError
				scale, mn = thisScale, thisMin
			}
		}
	}
	return scale, -mn
}

// scaleMinK4 unpacks sub-block j's 6-bit scale and min (ggml's get_scale_min_k4).
func scaleMinK4(j int, q []byte) (sc, m uint8) {
	if j < 4 {
		return q[j] & 63, q[j+4] & 63
	}
	return (q[j+4] & 0xf) | ((q[j-4] >> 6) << 4), (q[j+4] >> 4) | ((q[j] >> 6) << 4)
}

// QuantizeQ4_K quantizes rows of n weights (n a multiple of 256) as ggml's
// quantize_row_q4_K_ref does.
func QuantizeQ4_K(x []float32, n int) ([]byte, error) {
	if n <= 0 || n%BlockQ4_K != 0 || len(x)%n != 0 {
		return nil, fmt.Errorf("%w: %d weights in rows of %d (blocks of %d)", ErrRowLength, len(x), n, BlockQ4_K)
	}
	nb := len(x) / BlockQ4_K
	out := make([]byte, nb*BlockBytesQ4_K, nb*BlockBytesQ4_K+16)
	var L [BlockQ4_K]uint8
	var Laux [32]uint8
	var weights [32]float32
	var mins, scales [8]float32
	for i := range nb {
		xb := x[i*BlockQ4_K : (i+1)*BlockQ4_K]
		y := out[i*BlockBytesQ4_K : (i+1)*BlockBytesQ4_K]
		var maxScale, maxMin float32
		for j := range 8 {
			xs := xb[32*j : 32*j+32]
			var sumX2 float32
			for _, v := range xs {
				sumX2 += float32(v * v)
			}
			avX := float32(math.Sqrt(float64(sumX2 / 32)))
			for l, v := range xs {
				weights[l] = avX + float32(math.Abs(float64(v)))
			}
			scales[j], mins[j] = makeQKX2(15, xs, weights[:], L[32*j:32*j+32], Laux[:], -1, 0.1, 20)
			maxScale = max(maxScale, scales[j])
			maxMin = max(maxMin, mins[j])
		}
		var invScale, invMin float32
		if maxScale > 0 {
			invScale = 63 / maxScale
		}
		if maxMin > 0 {
			invMin = 63 / maxMin
		}
		sc := y[4:16]
		for j := range 8 {
			ls := min(63, uint8(nearestInt(float32(invScale*scales[j]))))
			lm := min(63, uint8(nearestInt(float32(invMin*mins[j]))))
			if j < 4 {
				sc[j], sc[j+4] = ls, lm
			} else {
				sc[j+4] = (ls & 0xf) | ((lm & 0xf) << 4)
				sc[j-4] |= (ls >> 4) << 6
				sc[j] |= (lm >> 4) << 6
			}
		}
		hd, hm := F32ToF16(maxScale/63), F32ToF16(maxMin/63)
		y[0], y[1], y[2], y[3] = byte(hd), byte(hd>>8), byte(hm), byte(hm>>8)
		d0, m0 := F16ToF32(hd), F16ToF32(hm)
		for j := range 8 {
			s, m := scaleMinK4(j, sc)
			d := float32(d0 * float32(s))
			if d == 0 {
				continue
			}
			dm := float32(m0 * float32(m))
			for ii := range 32 {
				l := nearestInt((xb[32*j+ii] + dm) / d)
				L[32*j+ii] = uint8(max(0, min(15, l)))
			}
		}
		q := y[16:]
		for j := 0; j < BlockQ4_K; j += 64 {
			for l := range 32 {
				q[l] = L[j+l] | L[j+l+32]<<4
			}
			q = q[32:]
		}
	}
	return out, nil
}

// DequantizeQ4_K writes the weights of Q4_K blocks into dst (256 per block): each weight
// (d·sc)·q − dmin·m, every product rounded to float32 apart (the explicit conversion keeps Go
// from fusing it: the vector kernel, q4KBlockFloats, rounds the same way).
func DequantizeQ4_K(dst []float32, blocks []byte) {
	for i := range len(dst) / BlockQ4_K {
		y := blocks[i*BlockBytesQ4_K : (i+1)*BlockBytesQ4_K]
		out := (*[BlockQ4_K]float32)(dst[i*BlockQ4_K:])
		if !q4KBlockFloats(out, y) {
			q4KBlockFloatsScalar(out, y)
		}
	}
}

// q4KBlockFloatsScalar is one super-block of DequantizeQ4_K in plain Go.
func q4KBlockFloatsScalar(out *[BlockQ4_K]float32, y []byte) {
	d := F16ToF32(uint16(y[0]) | uint16(y[1])<<8)
	mn := F16ToF32(uint16(y[2]) | uint16(y[3])<<8)
	sc, q := y[4:16], y[16:]
	for j := 0; j < 8; j += 2 {
		s1, m1 := scaleMinK4(j, sc)
		s2, m2 := scaleMinK4(j+1, sc)
		d1, mm1 := d*float32(s1), mn*float32(m1)
		d2, mm2 := d*float32(s2), mn*float32(m2)
		for l := range 32 {
			out[32*j+l] = float32(d1*float32(q[l]&0xf)) - mm1
			out[32*j+32+l] = float32(d2*float32(q[l]>>4)) - mm2
		}
		q = q[32:]
	}
}

// Q4_KPairs writes the weight of Q4_K rows W [N, K] as the bf16 GEMM takes it (Q8_0Pairs's
// layout: Wᵀ [K, N] rounded to bf16, pairs of rows), a super-block at a time.
func Q4_KPairs(dst []uint32, w []byte, K, N int, parallel func(n int, fn func(lo, hi int))) {
	blockPairs(dst, w, K, N, BlockQ4_K, BlockBytesQ4_K, q4KPairsTile, func(d []uint32, stride int, w []byte, at int) {
		if !q4KBlockPairs(d, stride, w[at:at+BlockBytesQ4_K]) {
			q4KBlockPairsScalar(d, stride, w[at:at+BlockBytesQ4_K])
		}
	}, parallel)
}

// q4KPairsTile is the outputs Q4_KPairs widens side by side: a tile holds 16 KB of words.
const q4KPairsTile = 32

// q4KBlockPairsScalar is one super-block of Q4_KPairs in plain Go: the weights dequantized, each
// rounded to bf16, element 2j in the low half of word j (at dst[j·stride]) and 2j+1 in the high
// half.
func q4KBlockPairsScalar(dst []uint32, stride int, y []byte) {
	var f [BlockQ4_K]float32
	q4KBlockFloatsScalar(&f, y)
	for j := range BlockQ4_K / 2 {
		dst[j*stride] = uint32(num.BF16Of(f[2*j])) | uint32(num.BF16Of(f[2*j+1]))<<16
	}
}
