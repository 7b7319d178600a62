package engine

import (
	"fmt"
	"strings"

	"github.com/skein-ai/skein/engine/internal/quant"
	"github.com/skein-ai/skein/safetensors"
)

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
