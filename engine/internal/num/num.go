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

// FMA32 is a·b + c rounded once to float32, as VFMADD does: the product is exact in float64, the
// sum is rounded to odd in float64 (53 ≥ 2·24+2 bits, so rounding that to float32 is rounding the
// exact value once; Go's float32(math.FMA(…)) would round twice).
func FMA32(a, b, c float32) float32 {
	p := float64(float64(a) * float64(b)) // exact: 48 bits
	cf := float64(c)
	s := p + cf
	bb := s - p
	e := (p - (s - bb)) + (cf - bb) // the addition's exact error (TwoSum)
	if e != 0 {
		bits := math.Float64bits(s)
		if bits&1 == 0 { // step to the odd neighbour on the exact value's side
			if (e > 0) == (s > 0) {
				bits++
			} else {
				bits--
			}
			s = math.Float64frombits(bits)
		}
	}
	return float32(s)
}
