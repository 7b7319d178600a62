package engine

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/skein-ai/skein/engine/internal/num"
	"github.com/skein-ai/skein/engine/internal/quant"
	"github.com/skein-ai/skein/safetensors"
)

// Every precision's weight handling in one place: the --precision names, which weights each keeps
// in bf16 or in which block format (quantFormat, weightFormat and llama.cpp's Q4_K_M mix), and
// how an embedding is kept under a quantized base. The loader (model.go) applies these rules;
// the CPU backend keeps and multiplies the weights they give (backend/cpu, NewWeight).

// --- f32 and bf16, and the quantized precisions' formats

// Base weights may be kept in bfloat16 (Options.Precision "bf16"): the projections and the
// embedding, which are nearly all of a model, at half the memory of float32; norms and biases stay
// in the pass's dtype. On a path with the bf16 unit the CPU backend keeps the weights as pairs of
// rows and their products run in bf16 with float32 sums (backend/cpu product.go; internal/kernels
// gemm_bf16.go, pairs.go). Elsewhere a product of many rows widens its weight into a step buffer
// just before the matmul and gives it back right after (a pass holds at most one widened weight
// besides merged LoRA weights): widening is exact, so such a product is a float32 engine's over
// the same bf16-rounded weights, bit for bit; few-row products read the bits directly.

// Precisions of base weights.
const (
	PrecisionF32  = "f32"
	PrecisionBF16 = "bf16"
	PrecisionQ8_0 = "q8_0" // projections in GGUF's Q8_0 blocks (internal/quant; products in backend/cpu)
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

// --- Q4_K_M: llama.cpp's mix of Q4_K and Q6_K

// PrecisionQ4_K_M is llama.cpp's Q4_K_M mix (llama-quant.cpp, llama_tensor_get_type_impl for
// LLAMA_FTYPE_MOSTLY_Q4_K_M): projections in Q4_K but the output head in Q6_K, and attn_v and
// ffn_down in Q6_K on the layers use_more_bits picks (the first and last eighths and every third
// layer between). The mix Ollama's default model files are in.
const PrecisionQ4_K_M = "q4_k_m"

// weightFormat is the block format the engine keeps weight name (an HF name) in under precision:
// nil for a weight that is not quantized (norms, biases, the embedding, every weight of a float
// precision). Options.weightFormats (tests) overrides it.
func weightFormat(opts Options, c *Config, name string) *quant.Format {
	qf := quantFormat(opts.Precision)
	if qf == nil || !isLinearWeight(name) || isRouterWeight(name) {
		return nil // routers stay as they are, as llama.cpp keeps ffn_gate_inp: a rounding would move tokens between experts
	}
	if opts.weightFormats != nil {
		return opts.weightFormats(name)
	}
	if opts.Precision == PrecisionQ4_K_M {
		return q4KMFormat(c, name)
	}
	return qf
}

// q4KMFormat is llama.cpp's Q4_K_M type for a projection: Q6_K for the head (Q8_0 when its rows
// are not whole Q6_K blocks, as llama.cpp falls back), Q6_K for attn_v and ffn_down where
// useMoreBits, else Q4_K. llama.cpp counts attn_v-like tensors (attn_v, a fused attn_qkv) in
// file order and ffn_down by layer; in skein's models every layer has one of each, so both
// counters are the layer index and the totals the layer count. A Gated DeltaNet layer's fused
// in_proj_qkv is llama.cpp's attn_qkv, one tensor: its three parts (split at load) take its type.
func q4KMFormat(c *Config, name string) *quant.Format {
	if name == "lm_head.weight" {
		if c.HiddenSize%quant.BlockQ6_K != 0 {
			return quant.Q8_0
		}
		return quant.Q6_K
	}
	layer, ok := layerOf(c, name)
	// Every down_proj: the dense MLP's, each expert's and the shared expert's (llama.cpp gives
	// every ffn_down* tensor more bits by the layer its name gives).
	moreBits := strings.HasSuffix(name, ".self_attn.v_proj.weight") || strings.HasSuffix(name, "down_proj.weight") ||
		strings.Contains(name, ".linear_attn.in_proj_q.") || strings.Contains(name, ".linear_attn.in_proj_k.") ||
		strings.Contains(name, ".linear_attn.in_proj_v.")
	if ok && moreBits && useMoreBits(layer, c.NumHiddenLayers) {
		if shape := c.expectedShape(name); len(shape) == 2 && shape[1]%quant.BlockQ6_K != 0 {
			return quant.Q8_0 // llama.cpp's fallback for a row that is not whole Q6_K blocks
		}
		return quant.Q6_K
	}
	return quant.Q4_K
}

// useMoreBits is llama.cpp's use_more_bits: layer i of n gets more bits when it is in the first
// or last eighth, or every third layer from the first eighth on (integer division as in C).
func useMoreBits(i, n int) bool {
	return i < n/8 || i >= 7*n/8 || (i-n/8)%3 == 2
}

// layerOf is the layer index of a layer's weight name.
func layerOf(c *Config, name string) (int, bool) {
	rest, ok := strings.CutPrefix(name, c.lm()+"layers.")
	if !ok {
		return 0, false
	}
	i := strings.IndexByte(rest, '.')
	if i < 0 {
		return 0, false
	}
	l, err := strconv.Atoi(rest[:i])
	return l, err == nil && l >= 0 && l < c.NumHiddenLayers
}

// --- a quantized base's embedding

// The embedding of a quantized base is kept in the base's format, as llama.cpp's Q4_K_M files
// keep token_embd: rows of D dequantized as tokens are looked up (pass.embed), and a tied head
// multiplies by the same blocks. For an 8B shape's 128k × 4096 embedding that is 0.30 GB in
// Q4_K rather than 1.05 in bf16.

// embeddingBlocks is the embedding name of host in qf's blocks, and the format they are in: a
// GGUF tensor of that type as it is (bit for bit what quantizing its float32 rows here gives,
// GGUF being ggml's blocks), or of any engine format when mixed (a Q4_K_M file's types are
// kept); a GGUF tensor of another type dequantized and quantized again; anything else quantized
// from its float32 rows.
func embeddingBlocks(qf *quant.Format, host map[string]safetensors.Tensor, name string, mixed bool) ([]byte, *quant.Format, error) {
	t := host[name]
	if typ, ok := strings.CutPrefix(t.DType, ggufDType); ok {
		if kept := keptGGUFFormat(typ, qf, mixed); kept != nil {
			out := make([]byte, len(t.Data), len(t.Data)+16) // Q8_0's kernel loads 16 bytes past a block's last quarter
			copy(out, t.Data)
			return out, kept, nil
		}
		if _, _, err := ggufHostTensor(host, name, nil, false); err != nil { // dequantized in place, into float32
			return nil, nil, err
		}
		t = host[name]
	}
	blocks, err := quantizeHost(qf, t)
	if err != nil {
		return nil, nil, fmt.Errorf("engine: weight %s %v for %s (rows must be whole blocks of %d): %w", name, t.Shape, qf.Name, qf.Block, err)
	}
	return blocks, qf, nil
}

// embeddingFormat is the format a quantized base keeps its embedding in (nil: not quantized):
// the precision's own, Q4_K for q4_k_m as llama.cpp's Q4_K_M files keep token_embd, except that
// a tied embedding is also the head, and under q4_k_m takes the head's type, as llama.cpp
// quantizes token_embd of a model without output.weight by the output's rule.
func embeddingFormat(opts Options, c *Config) *quant.Format {
	qf := quantFormat(opts.Precision)
	if qf != nil && opts.Precision == PrecisionQ4_K_M && c.TieWordEmbeddings {
		return q4KMFormat(c, "lm_head.weight")
	}
	return qf
}
