package engine

import (
	"strings"
	"testing"

	"github.com/skein-ai/skein/engine/gguf"
)

// sentencePieceGGUF is a llama-tokenizer GGUF (metadata only) of these pieces, after <unk>, <s>
// and </s>, each scoring minus its index.
func sentencePieceGGUF(t *testing.T, pieces []string) *gguf.File {
	t.Helper()
	tokens := append([]string{"<unk>", "<s>", "</s>"}, pieces...)
	scores, types := make([]float32, len(tokens)), make([]int32, len(tokens))
	for i := range tokens {
		scores[i], types[i] = float32(-i), gguf.TokenNormal
	}
	types[0], types[1], types[2] = gguf.TokenUnknown, gguf.TokenControl, gguf.TokenControl
	w := gguf.NewWriter()
	w.Set("tokenizer.ggml.model", "llama")
	w.Set("tokenizer.ggml.tokens", tokens)
	w.Set("tokenizer.ggml.scores", scores)
	w.Set("tokenizer.ggml.token_type", types)
	w.Set("tokenizer.ggml.bos_token_id", uint32(1))
	w.Set("tokenizer.ggml.eos_token_id", uint32(2))
	w.Set("tokenizer.ggml.unknown_token_id", uint32(0))
	var buf strings.Builder
	if err := w.Write(&buf); err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Parse([]byte(buf.String()))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// The merges made from a SentencePiece vocabulary's scores are bounded by the vocabulary: pieces
// a, aa, …, a×n make n²/2 merges of n³/6 bytes (a 0.68 MB GGUF of n = 1024 took 2.5 GB), and a
// file past the bound is refused naming it (issue 40, item 7). An ordinary vocabulary is not.
func TestGGUFSentencePieceMergesAreBounded(t *testing.T) {
	var runs []string
	for n := 1; n <= 512; n++ {
		runs = append(runs, strings.Repeat("a", n))
	}
	_, _, err := gguf.TokenizerJSON(sentencePieceGGUF(t, runs))
	if err == nil || !strings.Contains(err.Error(), "merges") || !strings.Contains(err.Error(), "at most") {
		t.Fatalf("a vocabulary of runs of one letter: %v; want an error naming the bound on merges", err)
	}
	words := strings.Fields("▁the ▁quick ▁brown ▁fox ▁jumps ▁over ▁lazy ▁dog")
	pieces := map[string]bool{}
	for _, w := range words {
		for i := range w {
			for j := i + 1; j <= len(w); j++ {
				pieces[w[i:j]] = true
			}
		}
	}
	var vocab []string
	for p := range pieces {
		vocab = append(vocab, p)
	}
	if _, _, err := gguf.TokenizerJSON(sentencePieceGGUF(t, vocab)); err != nil {
		t.Fatalf("an ordinary vocabulary: %v", err)
	}
}
