package engine

import (
	"slices"
	"testing"

	"github.com/skein-ai/skein/engine/internal/quant"
)

// use_more_bits picks llama.cpp's layers: the first and last eighths and every third layer
// between, counted from the first eighth's end (lists written out by hand from llama-quant.cpp's
// rule for 8, 28 and 32 layers: the 32 is Llama-3-8B's Q4_K_M).
func TestUseMoreBitsLayers(t *testing.T) {
	for n, want := range map[int][]int{
		2:  {1},
		8:  {0, 3, 6, 7},
		28: {0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 24, 25, 26, 27},
		32: {0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31},
	} {
		var got []int
		for i := range n {
			if useMoreBits(i, n) {
				got = append(got, i)
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("%d layers: %v, want %v", n, got, want)
		}
	}
}

// Under q4_k_m each projection takes llama.cpp's Q4_K_M type: the head Q6_K (Q8_0 when its rows
// are not whole Q6_K blocks), v and down Q6_K on use_more_bits layers, everything else Q4_K;
// norms and the embedding are not quantized.
func TestQ4KMFormats(t *testing.T) {
	c := &Config{Arch: ArchLlama, NumHiddenLayers: 8, HiddenSize: 512, IntermediateSize: 1536, NumAttentionHeads: 8,
		NumKeyValueHeads: 2, HeadDim: 64, VocabSize: 1024}
	opts := Options{Precision: PrecisionQ4_K_M}
	for name, want := range map[string]*quant.Format{
		"lm_head.weight":                         quant.Q6_K,
		"model.layers.0.self_attn.v_proj.weight": quant.Q6_K,
		"model.layers.0.mlp.down_proj.weight":    quant.Q6_K,
		"model.layers.3.self_attn.v_proj.weight": quant.Q6_K,
		"model.layers.7.mlp.down_proj.weight":    quant.Q6_K,
		"model.layers.1.self_attn.v_proj.weight": quant.Q4_K,
		"model.layers.2.mlp.down_proj.weight":    quant.Q4_K,
		"model.layers.0.self_attn.q_proj.weight": quant.Q4_K,
		"model.layers.7.mlp.up_proj.weight":      quant.Q4_K,
		"model.layers.3.self_attn.o_proj.weight": quant.Q4_K,
		"model.layers.0.input_layernorm.weight":  nil,
		"model.embed_tokens.weight":              nil,
		"model.layers.6.mlp.gate_proj.weight":    quant.Q4_K,
		"model.layers.6.self_attn.k_proj.weight": quant.Q4_K,
		"model.layers.6.self_attn.v_proj.weight": quant.Q6_K,
		"model.layers.5.self_attn.v_proj.weight": quant.Q4_K,
		"model.layers.4.mlp.down_proj.weight":    quant.Q4_K,
	} {
		if got := weightFormat(opts, c, name); got != want {
			t.Errorf("%s: %v, want %v", name, got, want)
		}
	}
	c.HiddenSize = 384 // rows of 1.5 Q6_K blocks: llama.cpp writes the head in Q8_0
	if got := weightFormat(opts, c, "lm_head.weight"); got != quant.Q8_0 {
		t.Errorf("head with rows of 384: %v, want Q8_0", got)
	}
	if got := weightFormat(Options{Precision: PrecisionQ4_K}, c, "model.layers.0.self_attn.v_proj.weight"); got != quant.Q4_K {
		t.Errorf("q4_k: v_proj %v, want Q4_K", got)
	}
}

// The embedding's format: the precision's own; under q4_k_m Q4_K, or the head's type when the
// embedding is the head (tied), as llama.cpp quantizes token_embd of a model without output.weight.
func TestEmbeddingFormat(t *testing.T) {
	for _, c := range []struct {
		prec   string
		tied   bool
		hidden int
		want   *quant.Format
	}{
		{PrecisionF32, true, 256, nil}, {PrecisionBF16, false, 256, nil},
		{PrecisionQ8_0, true, 256, quant.Q8_0}, {PrecisionQ4_K, true, 256, quant.Q4_K}, {PrecisionQ6_K, false, 256, quant.Q6_K},
		{PrecisionQ4_K_M, false, 256, quant.Q4_K}, {PrecisionQ4_K_M, true, 256, quant.Q6_K}, {PrecisionQ4_K_M, true, 96, quant.Q8_0},
	} {
		cfg := &Config{HiddenSize: c.hidden, TieWordEmbeddings: c.tied}
		if got := embeddingFormat(Options{Precision: c.prec}, cfg); got != c.want {
			t.Errorf("%s tied=%v hidden %d: %v, want %v", c.prec, c.tied, c.hidden, got, c.want)
		}
	}
}
