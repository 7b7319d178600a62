package gguf

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/skein-ai/skein/engine/tokenizer"
)

// A GGUF file carries its tokenizer as metadata (tokenizer.ggml.*): the tokens by id, their types,
// BPE merges (model gpt2) or SentencePiece scores (model llama), and only a name for the
// pre-tokenizer (tokenizer.ggml.pre), whose regex lives in llama.cpp's code. skein rebuilds the
// equivalent tokenizer.json from it and hands that to its own tokenizer, so a GGUF model and a
// Hugging Face directory tokenize through one implementation; tokenizer.chat_template becomes a
// tokenizer_config.json for the OpenAI endpoints.

// Token types of tokenizer.ggml.token_type (ggml's llama_token_type).
const (
	TokenNormal      = 1
	TokenUnknown     = 2
	TokenControl     = 3
	TokenUserDefined = 4
	TokenUnused      = 5
	TokenByte        = 6
)

// llama3Pattern is Llama 3's pre-tokenizer split (llama.cpp's "llama-bpe").
const llama3Pattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`

// bpePre is a byte-level BPE pre-tokenizer llama.cpp names: its split regex ("" : ByteLevel's own
// GPT-2 split), whether its tokenizer.json has an NFC normalizer, and ignore_merges.
type bpePre struct {
	pattern      string
	nfc          bool
	ignoreMerges bool
}

// bpePres are the tokenizer.ggml.pre names skein reads, with the tokenizer.json steps they stand
// for (llama.cpp's llama-vocab.cpp; the Hugging Face files of Qwen2/Qwen3 and Llama 3).
var bpePres = map[string]bpePre{
	"qwen2":     {pattern: tokenizer.QwenPattern, nfc: true},
	"llama-bpe": {pattern: llama3Pattern, ignoreMerges: true},
	"llama3":    {pattern: llama3Pattern, ignoreMerges: true},
	"gpt2":      {},
	"default":   {},
}

// ggufMaxVocab bounds a GGUF vocabulary (tokenizer.MaxVocab bounds ids; real ones are ≤ 256k).
const ggufMaxVocab = 1 << 20

// ggufMaxToken bounds one token's bytes (real ones are at most a few dozen): making merges from
// scores looks up every split of a piece, work that grows with the square of its length.
const ggufMaxToken = 1024

// TokenizerJSON rebuilds tokenizer.json and tokenizer_config.json from a GGUF's metadata
// (nil, nil when the file has no tokenizer).
func TokenizerJSON(f *File) (tokJSON, cfgJSON []byte, err error) {
	model, ok, err := f.String("tokenizer.ggml.model")
	if err != nil || !ok {
		return nil, nil, err
	}
	tokens, ok, err := f.Strings("tokenizer.ggml.tokens")
	if err != nil {
		return nil, nil, err
	}
	if !ok || len(tokens) == 0 {
		return nil, nil, fmt.Errorf("tokenizer.ggml.tokens missing")
	}
	if len(tokens) > ggufMaxVocab {
		return nil, nil, fmt.Errorf("tokenizer.ggml.tokens: %d tokens, over %d", len(tokens), ggufMaxVocab)
	}
	types, err := ggufTokenTypes(f, len(tokens))
	if err != nil {
		return nil, nil, err
	}
	special := func(key string) (int, bool, error) {
		v, ok, err := f.Int("tokenizer.ggml." + key)
		if err != nil || !ok {
			return 0, false, err
		}
		if v < 0 || v >= int64(len(tokens)) {
			return 0, false, fmt.Errorf("tokenizer.ggml.%s %d is not a token id (0 to %d)", key, v, len(tokens)-1)
		}
		return int(v), true, nil
	}
	bos, hasBOS, err := special("bos_token_id")
	if err != nil {
		return nil, nil, err
	}
	eos, hasEOS, err := special("eos_token_id")
	if err != nil {
		return nil, nil, err
	}
	addBOS, _, err := f.Bool("tokenizer.ggml.add_bos_token")
	if err != nil {
		return nil, nil, err
	}
	tf := tokenizer.File{Version: "1.0", Model: tokenizer.ModelRec{Type: "BPE", Vocab: map[string]int{}}}
	seen := map[string]bool{}
	for id, s := range tokens {
		if len(s) > ggufMaxToken {
			return nil, nil, fmt.Errorf("tokenizer.ggml.tokens[%d] is %d bytes, over %d", id, len(s), ggufMaxToken)
		}
		if s == "" {
			continue // an empty piece can never be produced nor matched
		}
		if seen[s] {
			continue // a duplicate string: the first id keeps it, as llama.cpp's text→id map does
		}
		seen[s] = true
		tf.Model.Vocab[s] = id
		switch types[id] {
		case TokenControl, TokenUserDefined, TokenUnknown:
			tf.AddedTokens = append(tf.AddedTokens, tokenizer.AddedTokenRec{ID: id, Content: s,
				Special: types[id] != TokenUserDefined})
		}
	}
	switch model {
	case "gpt2":
		err = gpt2Pipeline(f, &tf)
	case "llama":
		err = llamaPipeline(f, &tf, tokens, types, special)
	default:
		err = fmt.Errorf("tokenizer.ggml.model %q (skein reads gpt2 and llama)", model)
	}
	if err != nil {
		return nil, nil, err
	}
	if addBOS && hasBOS {
		tf.PostProcessor, _ = json.Marshal(map[string]any{"type": "TemplateProcessing",
			"single":         []any{map[string]any{"SpecialToken": map[string]any{"id": tokens[bos], "type_id": 0}}, map[string]any{"Sequence": map[string]any{"id": "A", "type_id": 0}}},
			"pair":           []any{},
			"special_tokens": map[string]any{tokens[bos]: map[string]any{"id": tokens[bos], "ids": []int{bos}, "tokens": []string{tokens[bos]}}}})
	}
	tokJSON, err = json.Marshal(tf)
	if err != nil {
		return nil, nil, err
	}
	cfg := map[string]any{"add_bos_token": addBOS}
	if hasBOS {
		cfg["bos_token"] = tokens[bos]
	}
	if hasEOS {
		cfg["eos_token"] = tokens[eos]
	}
	if tmpl, ok, err := f.String("tokenizer.chat_template"); err != nil {
		return nil, nil, err
	} else if ok {
		cfg["chat_template"] = tmpl
	}
	cfgJSON, err = json.Marshal(cfg)
	return tokJSON, cfgJSON, err
}

// ggufTokenTypes is tokenizer.ggml.token_type, one per token (all normal when the key is absent).
func ggufTokenTypes(f *File, n int) ([]int64, error) {
	tt, ok, err := f.Ints("tokenizer.ggml.token_type")
	if err != nil {
		return nil, err
	}
	if !ok {
		types := make([]int64, n)
		for i := range types {
			types[i] = TokenNormal
		}
		return types, nil
	}
	if len(tt) != n {
		return nil, fmt.Errorf("tokenizer.ggml.token_type has %d entries for %d tokens", len(tt), n)
	}
	return tt, nil
}

// gpt2Pipeline fills a byte-level BPE tokenizer's merges and pre-tokenizer from a GGUF's
// tokenizer.ggml.merges and tokenizer.ggml.pre.
func gpt2Pipeline(f *File, tf *tokenizer.File) error {
	merges, ok, err := f.Strings("tokenizer.ggml.merges")
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("tokenizer.ggml.merges missing (a gpt2 tokenizer merges pairs)")
	}
	mb, _ := json.Marshal(merges)
	tf.Model.Merges = mb
	preName, _, err := f.String("tokenizer.ggml.pre")
	if err != nil {
		return err
	}
	if preName == "" {
		preName = "default"
	}
	pre, ok := bpePres[preName]
	if !ok {
		names := make([]string, 0, len(bpePres))
		for n := range bpePres {
			names = append(names, n)
		}
		sort.Strings(names)
		return fmt.Errorf("tokenizer.ggml.pre %q is not one skein knows (%s): put the model's tokenizer.json beside it", preName, strings.Join(names, ", "))
	}
	tf.Model.IgnoreMerges = pre.ignoreMerges
	byteLevel := map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": pre.pattern == ""}
	if pre.pattern != "" {
		tf.PreTokenizer, _ = json.Marshal(map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Split", "pattern": map[string]string{"Regex": pre.pattern}, "behavior": "Isolated", "invert": false},
			byteLevel}})
	} else {
		tf.PreTokenizer, _ = json.Marshal(byteLevel)
	}
	if pre.nfc {
		tf.Normalizer = json.RawMessage(`{"type":"NFC"}`)
	}
	tf.Decoder, _ = json.Marshal(byteLevel)
	return nil
}

// llamaPipeline fills a SentencePiece tokenizer's merges (from the scores), byte fallback,
// normaliser and decoder from a GGUF's metadata.
func llamaPipeline(f *File, tf *tokenizer.File, tokens []string, types []int64, special func(string) (int, bool, error)) error {
	scores, ok, err := f.Float32s("tokenizer.ggml.scores")
	if err != nil {
		return err
	}
	if !ok || len(scores) != len(tokens) {
		return fmt.Errorf("tokenizer.ggml.scores must give one score per token (a llama tokenizer merges by score)")
	}
	merges, err := mergesFromScores(tokens, scores, types)
	if err != nil {
		return err
	}
	mb, _ := json.Marshal(merges)
	tf.Model.Merges = mb
	tf.Model.ByteFallback = true
	tf.Model.FuseUnk = true
	if unk, ok, err := special("unknown_token_id"); err != nil {
		return err
	} else if ok {
		tf.Model.UnkToken = tokens[unk]
	}
	prefix, ok, err := f.Bool("tokenizer.ggml.add_space_prefix")
	if err != nil {
		return err
	}
	steps := []any{}
	if prefix || !ok {
		steps = append(steps, map[string]any{"type": "Prepend", "prepend": "▁"})
	}
	steps = append(steps, map[string]any{"type": "Replace", "pattern": map[string]string{"String": " "}, "content": "▁"})
	tf.Normalizer, _ = json.Marshal(map[string]any{"type": "Sequence", "normalizers": steps})
	dec := []any{
		map[string]any{"type": "Replace", "pattern": map[string]string{"String": "▁"}, "content": " "},
		map[string]any{"type": "ByteFallback"}, map[string]any{"type": "Fuse"},
	}
	if prefix || !ok {
		dec = append(dec, map[string]any{"type": "Strip", "content": " ", "start": 1, "stop": 0})
	}
	tf.Decoder, _ = json.Marshal(map[string]any{"type": "Sequence", "decoders": dec})
	return nil
}

// mergesFromScores makes BPE merges of a SentencePiece vocabulary as transformers'
// SentencePieceExtractor does: every split of a piece into two pieces of the vocabulary is a
// merge, ranked by the merged piece's score (highest first; ties by the pieces' ids). llama.cpp's
// SPM tokenizer merges the adjacent pair whose joined piece scores highest, which this ranking
// reproduces. Only normal and user-defined pieces take part (control and byte tokens never
// come out of a merge).
//
// The merges are bounded by the vocabulary: at most ggufMergesPerToken per token (plus
// ggufMergesSlack) and ggufMergeBytesPerByte bytes per byte of the vocabulary (plus
// ggufMergeBytesSlack), counted as they are found. Real vocabularies make about two merges a
// piece (Llama 2: 61,249 for 32,000 pieces); a hostile one of nested pieces makes one per split
// of every piece (a, aa, …, a×1024: 523,776 merges, 358 MB of strings from a 0.68 MB file).
func mergesFromScores(tokens []string, scores []float32, types []int64) ([]string, error) {
	vocabBytes := 0
	for _, s := range tokens {
		vocabBytes += len(s)
	}
	maxMerges := ggufMergesPerToken*len(tokens) + ggufMergesSlack
	maxBytes := ggufMergeBytesPerByte*vocabBytes + ggufMergeBytesSlack
	count, bytes := 0, 0
	ids := map[string]int{}
	for id, s := range tokens {
		if t := types[id]; t != TokenNormal && t != TokenUserDefined {
			continue
		}
		if _, dup := ids[s]; !dup {
			ids[s] = id
		}
	}
	type mergeRec struct {
		l, r   string
		score  float32
		li, ri int
	}
	var all []mergeRec
	for id, piece := range tokens {
		if _, ok := ids[piece]; !ok || ids[piece] != id {
			continue
		}
		var local []mergeRec
		for i := range piece {
			if i == 0 || !utf8.RuneStart(piece[i]) {
				continue
			}
			l, r := piece[:i], piece[i:]
			li, okL := ids[l]
			ri, okR := ids[r]
			if okL && okR {
				local = append(local, mergeRec{l, r, scores[id], li, ri})
				count, bytes = count+1, bytes+len(piece)+1
				if count > maxMerges || bytes > maxBytes {
					return nil, fmt.Errorf("tokenizer.ggml.scores: the vocabulary of %d pieces (%d bytes) makes more merges than a vocabulary may: at most %d merges (%d per piece + %d) of at most %d bytes (%d per vocabulary byte + %d)",
						len(tokens), vocabBytes, maxMerges, ggufMergesPerToken, ggufMergesSlack, maxBytes, ggufMergeBytesPerByte, ggufMergeBytesSlack)
				}
			}
		}
		sort.Slice(local, func(a, b int) bool {
			if local[a].li != local[b].li {
				return local[a].li < local[b].li
			}
			return local[a].ri < local[b].ri
		})
		all = append(all, local...)
	}
	sort.SliceStable(all, func(a, b int) bool { return all[a].score > all[b].score })
	out := make([]string, len(all))
	for i, m := range all {
		out[i] = m.l + " " + m.r
	}
	return out, nil
}

// Bounds on the merges made from a SentencePiece vocabulary (mergesFromScores).
const (
	ggufMergesPerToken    = 16
	ggufMergesSlack       = 1024
	ggufMergeBytesPerByte = 32
	ggufMergeBytesSlack   = 1 << 20
)

// WriteTokenizer writes a byte-level BPE tokenizer.json (and its tokenizer_config.json's
// chat template and special tokens) as GGUF tokenizer metadata: the inverse of
// TokenizerJSON for the pre-tokenizers bpePres names.
func WriteTokenizer(w *Writer, tokJSON, cfgJSON []byte, vocabSize int) error {
	var tf tokenizer.File
	if err := json.Unmarshal(tokJSON, &tf); err != nil {
		return fmt.Errorf("tokenizer.json: %w", err)
	}
	if tf.Model.Type != "BPE" || tf.Model.ByteFallback {
		return fmt.Errorf("tokenizer.json: only byte-level BPE tokenizers are written to GGUF")
	}
	pre, err := bpePreName(tf)
	if err != nil {
		return err
	}
	n := vocabSize
	for _, id := range tf.Model.Vocab {
		n = max(n, id+1)
	}
	for _, a := range tf.AddedTokens {
		n = max(n, a.ID+1)
	}
	if n > ggufMaxVocab {
		return fmt.Errorf("tokenizer.json: %d ids, over %d", n, ggufMaxVocab)
	}
	tokens := make([]string, n)
	types := make([]int32, n)
	for s, id := range tf.Model.Vocab {
		tokens[id], types[id] = s, TokenNormal
	}
	for _, a := range tf.AddedTokens {
		tokens[a.ID], types[a.ID] = a.Content, TokenUserDefined
		if a.Special {
			types[a.ID] = TokenControl
		}
	}
	for id := range tokens {
		if types[id] == 0 { // ids the model has and the tokenizer does not: padding, as converters write them
			tokens[id], types[id] = fmt.Sprintf("[PAD%d]", id), TokenUnused
		}
	}
	var merges []string
	if len(tf.Model.Merges) > 0 {
		var pairs [][2]string
		if err := json.Unmarshal(tf.Model.Merges, &merges); err != nil {
			if err := json.Unmarshal(tf.Model.Merges, &pairs); err != nil {
				return fmt.Errorf("tokenizer.json merges: %w", err)
			}
			merges = make([]string, len(pairs))
			for i, p := range pairs {
				merges[i] = p[0] + " " + p[1]
			}
		}
	}
	w.Set("tokenizer.ggml.model", "gpt2")
	w.Set("tokenizer.ggml.pre", pre)
	w.Set("tokenizer.ggml.tokens", tokens)
	w.Set("tokenizer.ggml.token_type", types)
	w.Set("tokenizer.ggml.merges", merges)
	var cfg struct {
		ChatTemplate json.RawMessage `json:"chat_template"`
		EOS          json.RawMessage `json:"eos_token"`
		BOS          json.RawMessage `json:"bos_token"`
	}
	if len(cfgJSON) > 0 {
		if err := json.Unmarshal(cfgJSON, &cfg); err != nil {
			return fmt.Errorf("tokenizer_config.json: %w", err)
		}
	}
	idOf := func(raw json.RawMessage) (uint32, bool) {
		var s string
		if json.Unmarshal(raw, &s) != nil || s == "" {
			return 0, false
		}
		for id, t := range tokens {
			if t == s {
				return uint32(id), true
			}
		}
		return 0, false
	}
	if id, ok := idOf(cfg.EOS); ok {
		w.Set("tokenizer.ggml.eos_token_id", id)
	}
	if id, ok := idOf(cfg.BOS); ok {
		w.Set("tokenizer.ggml.bos_token_id", id)
	}
	w.Set("tokenizer.ggml.add_bos_token", false)
	var tmpl string
	if json.Unmarshal(cfg.ChatTemplate, &tmpl) == nil && tmpl != "" {
		w.Set("tokenizer.chat_template", tmpl)
	}
	return nil
}

// bpePreName is the tokenizer.ggml.pre name of a tokenizer.json's pre-tokenizer.
func bpePreName(tf tokenizer.File) (string, error) {
	var pre struct {
		Type          string `json:"type"`
		Pretokenizers []struct {
			Type    string            `json:"type"`
			Pattern map[string]string `json:"pattern"`
		} `json:"pretokenizers"`
	}
	if err := json.Unmarshal(tf.PreTokenizer, &pre); err != nil {
		return "", fmt.Errorf("tokenizer.json pre_tokenizer: %w", err)
	}
	if pre.Type == "ByteLevel" {
		return "gpt2", nil
	}
	if pre.Type == "Sequence" && len(pre.Pretokenizers) == 2 && pre.Pretokenizers[0].Type == "Split" && pre.Pretokenizers[1].Type == "ByteLevel" {
		switch pre.Pretokenizers[0].Pattern["Regex"] {
		case tokenizer.QwenPattern:
			return "qwen2", nil
		case llama3Pattern:
			return "llama-bpe", nil
		}
	}
	return "", fmt.Errorf("tokenizer.json: a pre-tokenizer llama.cpp has no name for")
}
