package engine

import (
	"fmt"
	"math"

	"github.com/skein-ai/skein/safetensors"
)

// Base weights may be kept in bfloat16 (Options.Precision "bf16"): the projections and the
// embedding, which are nearly all of a model, at half the memory of float32. A product of many
// rows widens its weight into a step buffer of the pass's dtype just before the matmul and gives
// it back right after, so a pass holds at most one widened weight at a time besides merged LoRA
// weights; norms and biases stay in the pass's dtype. Widening is exact, so such a product is a
// float32 engine's over the same bf16-rounded weights, bit for bit. Few-row products read the
// bf16 bits directly instead (bf16_kernels.go).

// Precisions of base weights.
const (
	PrecisionF32  = "f32"
	PrecisionBF16 = "bf16"
)

// keepsBF16 reports the weights a bf16 engine keeps in bf16.
func keepsBF16(name string) bool { return isLinearWeight(name) || name == "model.embed_tokens.weight" }

// bf16Of rounds f to bfloat16 (to nearest, ties to even; NaN stays NaN).
func bf16Of(f float32) uint16 {
	b := math.Float32bits(f)
	if f != f {
		return uint16(b>>16) | 0x40
	}
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}

// bf16Weight reads one weight as bfloat16 bits in its file layout: bf16 tensors as stored,
// others rounded (one tensor's float32 copy at a time).
func bf16Weight(t safetensors.Tensor) ([]uint16, error) {
	if t.DType == "BF16" {
		if len(t.Data)%2 != 0 {
			return nil, fmt.Errorf("bf16 data of odd length %d", len(t.Data))
		}
		out := make([]uint16, len(t.Data)/2)
		for i := range out {
			out[i] = uint16(t.Data[2*i]) | uint16(t.Data[2*i+1])<<8
		}
		return out, nil
	}
	f, err := t.Float32()
	if err != nil {
		return nil, err
	}
	out := make([]uint16, len(f))
	for i, v := range f {
		out[i] = bf16Of(v)
	}
	return out, nil
}

// transposeBF16 transposes a [rows, cols] matrix of bf16 bits.
func transposeBF16(v []uint16, rows, cols int) []uint16 {
	out := make([]uint16, len(v))
	for i := range rows {
		for j := range cols {
			out[j*rows+i] = v[i*cols+j]
		}
	}
	return out
}

// widenBF16 writes dst[i] = src[i] as a float, split across the cores for big weights.
func widenBF16[E float](dst []E, src []uint16) {
	const chunk = 1 << 14
	parallelRows((len(src)+chunk-1)/chunk, func(lo, hi int) {
		lo, hi = lo*chunk, min(hi*chunk, len(src))
		if d, ok := any(dst).([]float32); ok {
			widenBF16To32(d[lo:hi], src[lo:hi])
			return
		}
		for i, b := range src[lo:hi] {
			dst[lo+i] = E(math.Float32frombits(uint32(b) << 16))
		}
	})
}

func widenBF16Scalar(dst []float32, src []uint16) {
	for i, b := range src {
		dst[i] = math.Float32frombits(uint32(b) << 16)
	}
}

// weight returns a module's weight in the pass's dtype and a function that gives back the
// widened copy when the weight is kept in bf16 (a no-op otherwise). Use it right before the
// product and call done right after.
func (s *pass[E]) weight(lin *linear[E]) (w mat[E], done func()) {
	if lin.w16 == nil {
		return lin.w, func() {}
	}
	w = s.ar.alloc(lin.w.dims...)
	widenBF16(w.v, lin.w16)
	return w, func() { s.ar.releaseOne(w) }
}
