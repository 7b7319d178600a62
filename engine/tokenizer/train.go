package tokenizer

import (
	"encoding/json"
	"sort"
	"strings"

	"github.com/dlclark/regexp2"
)

// Train learns a byte-level BPE tokenizer from text, deterministically: 256 byte symbols, then
// merges of the most frequent adjacent pair (ties broken by the pair's strings) until the vocab
// holds vocabSize entries or no pair occurs twice, then the special tokens. It returns the
// tokenizer.json bytes, in the layout Hugging Face writes for Qwen2.
func Train(text string, vocabSize int, specials []string) ([]byte, error) {
	return train(text, vocabSize, specials, false)
}

// TrainFull is Train, then generated words (see fillVocab) until the vocab, special tokens
// included, holds exactly vocabSize ids: every id of a model of that vocab is text.
func TrainFull(text string, vocabSize int, specials []string) ([]byte, error) {
	return train(text, vocabSize, specials, true)
}

func train(text string, vocabSize int, specials []string, fill bool) ([]byte, error) {
	re := regexp2.MustCompile(QwenPattern, regexp2.Unicode)
	words := map[string]int{}
	runes := []rune(text)
	m, _ := re.FindRunesMatch(runes)
	for m != nil {
		words[string(runes[m.Index:m.Index+m.Length])]++
		m, _ = re.FindNextMatch(m)
	}
	type word struct {
		syms  []string
		count int
	}
	keys := make([]string, 0, len(words))
	for k := range words {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	ws := make([]word, 0, len(keys))
	for _, k := range keys {
		w := word{count: words[k]}
		for _, b := range []byte(k) {
			w.syms = append(w.syms, ByteSymbol(b))
		}
		ws = append(ws, w)
	}
	vocab := map[string]int{}
	for b := range 256 {
		vocab[ByteSymbol(byte(b))] = b
	}
	var merges []string
	for len(vocab) < vocabSize-len(specials) {
		pairs := map[[2]string]int{}
		for _, w := range ws {
			for i := 0; i+1 < len(w.syms); i++ {
				pairs[[2]string{w.syms[i], w.syms[i+1]}] += w.count
			}
		}
		var best [2]string
		bestN := 1
		for p, n := range pairs {
			if n > bestN || (n == bestN && bestN > 1 && (p[0] < best[0] || (p[0] == best[0] && p[1] < best[1]))) {
				best, bestN = p, n
			}
		}
		if bestN < 2 {
			break
		}
		merged := best[0] + best[1]
		if _, ok := vocab[merged]; ok {
			// Already a symbol by another route; still a valid merge rule, no new id.
		} else {
			vocab[merged] = len(vocab)
		}
		merges = append(merges, best[0]+" "+best[1])
		for wi := range ws {
			s := ws[wi].syms
			out := s[:0:0]
			for i := 0; i < len(s); i++ {
				if i+1 < len(s) && s[i] == best[0] && s[i+1] == best[1] {
					out = append(out, merged)
					i++
				} else {
					out = append(out, s[i])
				}
			}
			ws[wi].syms = out
		}
	}
	if fill {
		merges = fillVocab(vocab, merges, vocabSize-len(specials))
	}
	f := File{Version: "1.0", Model: ModelRec{Type: "BPE", Vocab: vocab,
		ContinuingSubwordPrefix: "", EndOfWordSuffix: ""}}
	mb, _ := json.Marshal(merges)
	f.Model.Merges = mb
	next := len(vocab)
	for _, s := range specials {
		f.AddedTokens = append(f.AddedTokens, AddedTokenRec{ID: next, Content: s, Special: true})
		next++
	}
	f.Normalizer = json.RawMessage(`{"type":"NFC"}`)
	pre, _ := json.Marshal(map[string]any{"type": "Sequence", "pretokenizers": []any{
		map[string]any{"type": "Split", "pattern": map[string]string{"Regex": QwenPattern}, "behavior": "Isolated", "invert": false},
		map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
	}})
	f.PreTokenizer = pre
	f.PostProcessor = json.RawMessage(`{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":false,"use_regex":false}`)
	f.Decoder = json.RawMessage(`{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":false,"use_regex":false}`)
	return json.MarshalIndent(f, "", "  ")
}

// fillVocab fills vocab up to size with generated words once the text has no pair left that
// occurs twice (a short text trains a few hundred merges; a generated model's vocab is thousands
// of ids, and a random model samples any of them, so an id without a token would decode to
// nothing). Each word is a merge of two pieces already there: a word (with or without its
// leading space) and a lowercase piece, so it is one pre-token (" ?\p{L}+") that BPE reaches
// by its merges, which rank after the pieces'. Deterministic: pieces in id order, rounds
// of longer words until the vocab is full.
func fillVocab(vocab map[string]int, merges []string, size int) []string {
	bySym := make([]string, len(vocab))
	for s, id := range vocab {
		if id < len(bySym) {
			bySym[id] = s
		}
	}
	space := ByteSymbol(' ')
	letters := func(s string) bool {
		for _, r := range s {
			if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
				return false
			}
		}
		return s != ""
	}
	var heads, tails []string
	for _, s := range bySym {
		if letters(strings.TrimPrefix(s, space)) {
			heads = append(heads, s)
		}
		if letters(s) && strings.ToLower(s) == s {
			tails = append(tails, s)
		}
	}
	for len(vocab) < size && len(tails) > 0 {
		var grown []string
		for _, h := range heads {
			for _, tl := range tails {
				if len(vocab) >= size {
					return merges
				}
				w := h + tl
				if _, ok := vocab[w]; ok {
					continue
				}
				vocab[w] = len(vocab)
				merges = append(merges, h+" "+tl)
				grown = append(grown, w)
			}
		}
		if len(grown) == 0 {
			break
		}
		heads = grown // the next round lengthens this round's words
	}
	return merges
}
