// Package num holds number formats every part of the engine shares: bfloat16's rounding and
// widening. Pure Go, no machine dependence: the kernels, the loaders and the file writers agree
// on them bit for bit.
package num

import "math"

// BF16To32 widens bfloat16 bits to a float32 (exact).
func BF16To32(b uint16) float32 { return math.Float32frombits(uint32(b) << 16) }

// BF16Of rounds f to bfloat16 (to nearest, ties to even; NaN stays NaN).
func BF16Of(f float32) uint16 {
	b := math.Float32bits(f)
	if f != f {
		return uint16(b>>16) | 0x40
	}
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}

// TransposeBF16 transposes a [rows, cols] matrix of bf16 bits.
func TransposeBF16(v []uint16, rows, cols int) []uint16 {
	out := make([]uint16, len(v))
	for i := range rows {
		for j := range cols {
			out[j*rows+i] = v[i*cols+j]
		}
	}
	return out
}
