package engine

import (
	"fmt"

	"github.com/skein-ai/skein/engine/internal/num"
	"github.com/skein-ai/skein/engine/internal/quant"
	"github.com/skein-ai/skein/safetensors"
)

// Base weights may be kept in bfloat16 (Options.Precision "bf16"): the projections and the
// embedding, which are nearly all of a model, at half the memory of float32; norms and biases stay
// in the pass's dtype. On a path with the bf16 unit the weights are kept as pairs of rows and
// their products run in bf16 with float32 sums (linear.go; internal/kernels: gemm_bf16.go,
// pairs.go). Elsewhere a product of many rows widens its weight into a step buffer just before
// the matmul and gives it back right after (a pass holds at most one widened weight besides
// merged LoRA weights): widening is exact, so such a product is a float32 engine's over the same
// bf16-rounded weights, bit for bit; few-row products read the bits directly (bf16.go there).

// Precisions of base weights.
const (
	PrecisionF32  = "f32"
	PrecisionBF16 = "bf16"
	PrecisionQ8_0 = "q8_0" // projections in GGUF's Q8_0 blocks (linear.go, internal/quant)
	PrecisionQ4_K = "q4_k" // projections in GGUF's Q4_K blocks
	PrecisionQ6_K = "q6_k" // projections in GGUF's Q6_K blocks
)

// quantFormat is the block format of a precision's projections (nil: not a quantized one); a
// mix's (q4_k_m) is its most common one, weightFormat gives each weight's.
func quantFormat(precision string) *quant.Format {
	switch precision {
	case PrecisionQ8_0:
		return quant.Q8_0
	case PrecisionQ4_K, PrecisionQ4_K_M:
		return quant.Q4_K
	case PrecisionQ6_K:
		return quant.Q6_K
	}
	return nil
}

// keepsBF16 reports the weights a bf16 engine keeps in bf16.
func keepsBF16(name string) bool { return isLinearWeight(name) || name == "model.embed_tokens.weight" }

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
		out[i] = num.BF16Of(v)
	}
	return out, nil
}
