package engine

import (
	"strconv"
	"strings"

	"github.com/skein-ai/skein/engine/internal/quant"
)

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
	if qf == nil || !isLinearWeight(name) {
		return nil
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
	moreBits := strings.HasSuffix(name, ".self_attn.v_proj.weight") || strings.HasSuffix(name, ".mlp.down_proj.weight") ||
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
