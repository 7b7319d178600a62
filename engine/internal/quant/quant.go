// Package quant holds the block formats of frozen base weights below 16 bits, byte for byte as
// GGUF stores them (llama.cpp's ggml), so that a weight quantized here and one read from a GGUF
// file are the same blocks and go through the same kernels. Slices in, slices out: no model
// types.
//
// Q8_0: blocks of 32 weights along a row (the input dimension), each 34 bytes: an IEEE half
// scale d, then 32 int8 q; the weight is d·q. It holds a weight in 8.5 bits.
package quant

import (
	"errors"
	"fmt"
	"math"

	"github.com/skein-ai/skein/engine/internal/num"
)

// Q8_0 block geometry.
const (
	BlockQ8_0      = 32 // weights per block
	BlockBytesQ8_0 = 34 // bytes per block: f16 d, 32 × int8
)

// ErrRowLength: a row whose length is not a whole number of blocks.
var ErrRowLength = errors.New("quant: row length is not a multiple of the block size")

// QuantizeQ8_0 quantizes rows of n weights (n a multiple of 32) as ggml's reference quantizer
// (quantize_row_q8_0_ref) does: per block d = max|x|/127, q = round(x/d) half away from zero,
// computed with the float32 reciprocal of d, and d stored rounded to half precision.
func QuantizeQ8_0(x []float32, n int) ([]byte, error) {
	if n <= 0 || n%BlockQ8_0 != 0 || len(x)%n != 0 {
		return nil, fmt.Errorf("%w: %d weights in rows of %d (blocks of %d)", ErrRowLength, len(x), n, BlockQ8_0)
	}
	// 16 spare bytes past the end: the vector kernel loads a block's last quarter as 16 bytes.
	n8 := len(x) / BlockQ8_0 * BlockBytesQ8_0
	out := make([]byte, n8, n8+16)
	for b := range len(x) / BlockQ8_0 {
		blk := x[b*BlockQ8_0 : (b+1)*BlockQ8_0]
		var amax float32
		for _, v := range blk {
			amax = max(amax, float32(math.Abs(float64(v))))
		}
		d := amax / 127
		var id float32
		if d != 0 {
			id = 1 / d
		}
		o := out[b*BlockBytesQ8_0 : (b+1)*BlockBytesQ8_0]
		h := F32ToF16(d)
		o[0], o[1] = byte(h), byte(h>>8)
		for j, v := range blk {
			o[2+j] = byte(int8(math.Round(float64(v * id))))
		}
	}
	return out, nil
}

// DequantizeQ8_0 writes the weights of Q8_0 blocks into dst (len(dst) = 32 per block).
func DequantizeQ8_0(dst []float32, blocks []byte) {
	for b := range len(dst) / BlockQ8_0 {
		o := blocks[b*BlockBytesQ8_0 : (b+1)*BlockBytesQ8_0]
		d := F16ToF32(uint16(o[0]) | uint16(o[1])<<8)
		row := dst[b*BlockQ8_0 : (b+1)*BlockQ8_0]
		for j := range row {
			row[j] = d * float32(int8(o[2+j]))
		}
	}
}

// F32ToF16 rounds a float32 to the nearest IEEE half (ties to even), as ggml's
// GGML_FP32_TO_FP16 does: overflow gives ±Inf, NaN stays NaN, small values become subnormal
// halves or zero.
func F32ToF16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int(b>>23) & 0xff
	mant := b & 0x7fffff
	switch {
	case exp == 0xff: // Inf or NaN
		if mant != 0 {
			return sign | 0x7e00
		}
		return sign | 0x7c00
	case exp > 142: // ≥ 2^16: beyond the largest half
		return sign | 0x7c00
	case exp >= 113: // a normal half: round 23 mantissa bits to 10
		h := uint32(exp-112)<<10 | mant>>13
		rest := mant & 0x1fff
		if rest > 0x1000 || (rest == 0x1000 && h&1 == 1) {
			h++ // may carry into the exponent, up to Inf: still correct
		}
		return sign | uint16(h)
	case exp >= 90: // a subnormal half (or rounds up to the smallest normal)
		m := mant | 0x800000     // the implicit bit
		shift := uint(126 - exp) // 14 … 36: value = m·2^(exp−150), in units of 2^−24
		h := m >> shift
		rest := m & (1<<shift - 1)
		half := uint32(1) << (shift - 1)
		if rest > half || (rest == half && h&1 == 1) {
			h++
		}
		return sign | uint16(h)
	default: // below half the smallest subnormal: zero
		return sign
	}
}

// F16ToF32 widens an IEEE half exactly.
func F16ToF32(h uint16) float32 { return math.Float32frombits(f16Bits(h)) }

// f16Bits is F16ToF32's float32 as its bits, in integer instructions only and inlined: the vector
// kernels broadcast a block's scale from a general register (VMOVD), since any scalar float
// instruction or call between their vector operations runs while the upper halves are dirty
// (see vexcheck). Zero and the subnormals come from a table.
func f16Bits(h uint16) uint32 {
	m := uint32(h & 0x7fff)
	switch {
	case m < 0x400:
		return f16Subnormals[h>>15][m]
	case m < 0x7c00: // exponent e in 1…30: e−15+127 in float32's field
		return uint32(h&0x8000)<<16 | (m+(112<<10))<<13
	default: // infinities and NaNs, the payload kept
		return uint32(h&0x8000)<<16 | 0x7f800000 | (m&0x3ff)<<13
	}
}

// f16Subnormals holds the float32 bits of ±m·2⁻²⁴ for m < 1024 (exact: float32 has the range).
var f16Subnormals = func() (t [2][1024]uint32) {
	for m := range 1024 {
		t[0][m] = math.Float32bits(float32(m) * 0x1p-24)
		t[1][m] = t[0][m] | 1<<31
	}
	return t
}()

// Q8_0Product sets y [R, N] = x [R, K] · Wᵀ for W [N, K] held as Q8_0 rows (K a multiple of 32):
// for each output, per block, the block's 32 weights are widened once and dotted with every row,
// the sum scaled by the block's d. For few rows (decode steps), where reading the weight is the
// cost and 8.5 bits a weight read beats 16 or 32. Outputs are split across the cores; each sums
// its blocks in order, so results do not depend on the number of cores.
func Q8_0Product(y, x []float32, w []byte, R, K, N int, parallel func(n int, fn func(lo, hi int))) {
	if R == 0 || N == 0 {
		return
	}
	nb := K / BlockQ8_0
	_, _, _ = y[R*N-1], x[R*K-1], w[N*nb*BlockBytesQ8_0-1]
	parallel(N, func(lo, hi int) { q8Outputs(y, x, w, R, K, N, lo, hi) })
}

// maxSIMDRows bounds the rows the vector kernel takes at once (an accumulator each).
const maxSIMDRows = 16

// q8OutputsScalar is q8Outputs in plain Go: other machines' kernel, and the reference.
func q8OutputsScalar(y, x []float32, w []byte, R, K, N, lo, hi int) {
	nb := K / BlockQ8_0
	var wb [BlockQ8_0]float32
	acc := make([]float32, R)
	for o := lo; o < hi; o++ {
		clear(acc)
		row := w[o*nb*BlockBytesQ8_0 : (o+1)*nb*BlockBytesQ8_0]
		for b := range nb {
			blk := row[b*BlockBytesQ8_0 : (b+1)*BlockBytesQ8_0]
			d := F16ToF32(uint16(blk[0]) | uint16(blk[1])<<8)
			for j := range wb {
				wb[j] = float32(int8(blk[2+j]))
			}
			for r := range R {
				xr := x[r*K+b*BlockQ8_0 : r*K+(b+1)*BlockQ8_0]
				var s0, s1, s2, s3 float32
				for j := 0; j < BlockQ8_0; j += 4 {
					s0 += xr[j] * wb[j]
					s1 += xr[j+1] * wb[j+1]
					s2 += xr[j+2] * wb[j+2]
					s3 += xr[j+3] * wb[j+3]
				}
				acc[r] += d * ((s0 + s1) + (s2 + s3))
			}
		}
		for r := range R {
			y[r*N+o] = acc[r]
		}
	}
}

// Q8_0Pairs writes the weight of Q8_0 rows W [N, K] as the bf16 GEMM takes it: Wᵀ [K, N] rounded
// to bf16 and kept as pairs of rows (kernels.PackPairs's layout; K is even, a whole number of
// blocks), dst of K/2·N words. Rounding the dequantized weights d·q to bf16 changes them by at most
// 2⁻⁹ relative, below Q8_0's own step; it lets training over a Q8_0 base run at the bf16 GEMM's
// speed, with float32 sums.
func Q8_0Pairs(dst []uint32, w []byte, K, N int, parallel func(n int, fn func(lo, hi int))) {
	blockPairs(dst, w, K, N, BlockQ8_0, BlockBytesQ8_0, q8PairsTile, q8BlockPairs, parallel)
}

// blockPairs writes rows W [N, K] held in blocks as the bf16 GEMM's pairs (dst of K/2·N words),
// kernel writing the block/2 words of the block at byte at of w, word j at d[j·stride]. Outputs
// go in tiles of tileOut: the kernels write a tile by columns, each pair row's words of the tile
// side by side, and each block's rows are then copied into dst as runs (not one word a line N
// words apart: Q8_0 in tiles of 16, one cache line a row, cost a page walk a line on a 1b
// shape's weights, four times the widening itself; and not word by word out of a tile kept by
// outputs, which cost Q4_K twice its kernel).
func blockPairs(dst []uint32, w []byte, K, N, block, blockBytes, tileOut int, kernel func(d []uint32, stride int, w []byte, at int), parallel func(n int, fn func(lo, hi int))) {
	nb := K / block
	_, _ = dst[K/2*N-1], w[N*nb*blockBytes-1]
	words := block / 2
	parallel((N+tileOut-1)/tileOut, func(lo, hi int) {
		tile := make([]uint32, tileOut*words)
		for t := lo; t < hi; t++ {
			o0, o1 := t*tileOut, min((t+1)*tileOut, N)
			for b := range nb {
				for o := o0; o < o1; o++ {
					kernel(tile[o-o0:], tileOut, w, (o*nb+b)*blockBytes)
				}
				p0 := b * words
				for j := range words {
					copy(dst[(p0+j)*N+o0:(p0+j)*N+o1], tile[j*tileOut:])
				}
			}
		}
	})
}

// q8BlockPairsScalar writes the block of w at byte at as 16 words of bf16 pairs: d·q rounded,
// element 2j in the low half of word j (at dst[j·stride]), 2j+1 in the high half.
func q8BlockPairsScalar(dst []uint32, stride int, w []byte, at int) {
	blk := w[at : at+BlockBytesQ8_0]
	d := F16ToF32(uint16(blk[0]) | uint16(blk[1])<<8)
	for j := 0; j < BlockQ8_0; j += 2 {
		dst[j/2*stride] = uint32(num.BF16Of(d*float32(int8(blk[2+j])))) | uint32(num.BF16Of(d*float32(int8(blk[3+j]))))<<16
	}
}

// q8PairsTile is the outputs Q8_0Pairs widens side by side: a tile holds 4 KB of words
// (measured on the 1b shape's FFN weight: 16 outputs 45 ms a widening, 64 and 256 36 ms).
const q8PairsTile = 64
