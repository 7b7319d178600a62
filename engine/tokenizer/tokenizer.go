// Package tokenizer implements Hugging Face BPE tokenizers (tokenizer.json): the byte-level kind
// used by Llama 3, Qwen2/Qwen3 and DeepSeek, and the SentencePiece-style kind of Llama 2, Mistral
// and Gemma (Prepend/Replace/NFKC normalizers, Metaspace, byte_fallback, TemplateProcessing),
// giving the same ids and text as the reference implementation.
package tokenizer

import (
	"container/heap"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"sync"

	"github.com/skein-ai/skein/internal/filebound"
)

// QwenPattern is the pre-tokenizer split used by Qwen2/Qwen3 (and, with \p{N}{1,3}, Llama 3).
const QwenPattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`

// gpt2Pattern is ByteLevel's built-in split (use_regex: true).
const gpt2Pattern = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`

// MaxVocab bounds the ids a tokenizer.json may use (the largest real vocabularies have ~256k):
// the inverse table is sized by the largest id, so a hostile file must not choose it freely.
const MaxVocab = 1 << 24

// AddedToken is a token matched verbatim before BPE (special tokens such as <|im_start|>).
type AddedToken struct {
	ID      int    `json:"id"`
	Content string `json:"content"`
	Special bool   `json:"special"`
}

// Tokenizer encodes text to ids and back, following tokenizer.json's pipeline: added tokens,
// normalizer, pre-tokenizer, BPE model (with byte_fallback and unk), post-processor, decoder.
type Tokenizer struct {
	vocab   map[string]int
	inverse []string
	merges  map[[2]int32]merge
	added   []AddedToken // longest content first, for matching
	// addedByFirst lists added tokens by their first byte, longest first: one pass over the text
	// finds the leftmost, longest one (Gemma has 6415 added tokens).
	addedByFirst [256][]AddedToken
	addedID      map[int]string
	// ignoreMerges (Llama 3): a pre-token that is itself in the vocabulary is one token, without BPE.
	ignoreMerges bool
	byteFallback bool
	byteIDs      [256]int32 // <0xNN> tokens for byte_fallback; -1 where absent
	unkID        int        // -1: no unk token
	fuseUnk      bool

	normalizer normalizer
	preTok     preTokenizer
	post       postProcessor
	decoder    decoder

	cacheMu sync.Mutex
	cache   map[string][]int
}

type merge struct{ rank, id int32 }

// File mirrors the parts of tokenizer.json that we read and write.
type File struct {
	Version       string          `json:"version"`
	Truncation    any             `json:"truncation"`
	Padding       any             `json:"padding"`
	AddedTokens   []AddedTokenRec `json:"added_tokens"`
	Normalizer    json.RawMessage `json:"normalizer"`
	PreTokenizer  json.RawMessage `json:"pre_tokenizer"`
	PostProcessor json.RawMessage `json:"post_processor"`
	Decoder       json.RawMessage `json:"decoder"`
	Model         ModelRec        `json:"model"`
}

// AddedTokenRec is an added_tokens entry as stored.
type AddedTokenRec struct {
	ID         int    `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
	Special    bool   `json:"special"`
}

// ModelRec is the BPE model section.
type ModelRec struct {
	Type                    string          `json:"type"`
	Dropout                 any             `json:"dropout"`
	UnkToken                any             `json:"unk_token"`
	ContinuingSubwordPrefix string          `json:"continuing_subword_prefix"`
	EndOfWordSuffix         string          `json:"end_of_word_suffix"`
	FuseUnk                 bool            `json:"fuse_unk"`
	ByteFallback            bool            `json:"byte_fallback"`
	IgnoreMerges            bool            `json:"ignore_merges"`
	Vocab                   map[string]int  `json:"vocab"`
	Merges                  json.RawMessage `json:"merges"`
}

// MaxFileBytes bounds a tokenizer.json read by Load (Gemma 3's, of 262,144 pieces, is 33 MB).
const MaxFileBytes = 64 << 20

// Load reads a tokenizer.json: a regular file of at most MaxFileBytes.
func Load(path string) (*Tokenizer, error) {
	b, err := filebound.Read(path, MaxFileBytes)
	if err != nil {
		return nil, err
	}
	t, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("tokenizer %s: %w", path, err)
	}
	return t, nil
}

// Parse builds a tokenizer from tokenizer.json bytes.
func Parse(b []byte) (*Tokenizer, error) {
	var f File
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, err
	}
	if f.Model.Type != "BPE" {
		return nil, fmt.Errorf("model type %q (only BPE): %w", f.Model.Type, ErrUnsupported)
	}
	if f.Model.ContinuingSubwordPrefix != "" || f.Model.EndOfWordSuffix != "" {
		return nil, fmt.Errorf("BPE continuing_subword_prefix/end_of_word_suffix: %w", ErrUnsupported)
	}
	t := &Tokenizer{vocab: f.Model.Vocab, addedID: map[int]string{}, cache: map[string][]int{}, unkID: -1}
	if t.vocab == nil {
		t.vocab = map[string]int{}
	}
	maxID := -1
	for s, id := range t.vocab {
		if id < 0 || id >= MaxVocab {
			return nil, fmt.Errorf("vocab entry %q has id %d, outside [0, %d)", s, id, MaxVocab)
		}
		maxID = max(maxID, id)
	}
	for _, a := range f.AddedTokens {
		if a.ID < 0 || a.ID >= MaxVocab {
			return nil, fmt.Errorf("added token %q has id %d, outside [0, %d)", a.Content, a.ID, MaxVocab)
		}
		if a.Content == "" { // would match everywhere and never consume text
			return nil, fmt.Errorf("added token %d has empty content", a.ID)
		}
		maxID = max(maxID, a.ID)
		t.added = append(t.added, AddedToken{ID: a.ID, Content: a.Content, Special: a.Special})
		t.addedID[a.ID] = a.Content
	}
	sort.SliceStable(t.added, func(i, j int) bool { return len(t.added[i].Content) > len(t.added[j].Content) })
	for _, a := range t.added {
		t.addedByFirst[a.Content[0]] = append(t.addedByFirst[a.Content[0]], a)
	}
	// Real ids are dense; a sparse one would make the id → token table far larger than the file.
	if limit := 2*(len(t.vocab)+len(f.AddedTokens)) + 1024; maxID >= limit {
		return nil, fmt.Errorf("token id %d: ids of %d tokens must stay below %d", maxID, len(t.vocab)+len(f.AddedTokens), limit)
	}
	t.inverse = make([]string, maxID+1)
	for s, id := range t.vocab {
		t.inverse[id] = s
	}
	merges, err := parseMerges(f.Model.Merges)
	if err != nil {
		return nil, err
	}
	t.merges = make(map[[2]int32]merge, len(merges))
	for i, m := range merges {
		a, okA := t.vocab[m[0]]
		b, okB := t.vocab[m[1]]
		ab, okAB := t.vocab[m[0]+m[1]]
		if !okA || !okB || !okAB {
			continue // a merge whose tokens are not all in the vocabulary can never apply
		}
		key := [2]int32{int32(a), int32(b)}
		if _, dup := t.merges[key]; !dup {
			t.merges[key] = merge{rank: int32(i), id: int32(ab)}
		}
	}
	t.ignoreMerges = f.Model.IgnoreMerges
	t.byteFallback = f.Model.ByteFallback
	for b := range 256 {
		t.byteIDs[b] = -1
		if id, ok := t.vocab[fmt.Sprintf("<0x%02X>", b)]; ok {
			t.byteIDs[b] = int32(id)
		}
	}
	if unk, ok := f.Model.UnkToken.(string); ok && unk != "" {
		id, ok := t.vocab[unk]
		if !ok {
			return nil, fmt.Errorf("unk_token %q is not in the vocabulary", unk)
		}
		t.unkID = id
	}
	t.fuseUnk = f.Model.FuseUnk
	if t.normalizer, err = parseNormalizer(f.Normalizer, 0); err != nil {
		return nil, fmt.Errorf("normalizer: %w", err)
	}
	if t.preTok, err = parsePreTokenizer(f.PreTokenizer, 0); err != nil {
		return nil, fmt.Errorf("pre_tokenizer: %w", err)
	}
	if t.post, err = parsePostProcessor(f.PostProcessor, 0); err != nil {
		return nil, fmt.Errorf("post_processor: %w", err)
	}
	if t.decoder, err = parseDecoder(f.Decoder, 0); err != nil {
		return nil, fmt.Errorf("decoder: %w", err)
	}
	return t, nil
}

func parseMerges(raw json.RawMessage) ([][2]string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var asStrings []string
	if err := json.Unmarshal(raw, &asStrings); err == nil {
		out := make([][2]string, 0, len(asStrings))
		for _, s := range asStrings {
			a, b, ok := strings.Cut(s, " ")
			if !ok {
				return nil, fmt.Errorf("bad merge %q", s)
			}
			out = append(out, [2]string{a, b})
		}
		return out, nil
	}
	var asPairs [][2]string
	if err := json.Unmarshal(raw, &asPairs); err != nil {
		return nil, fmt.Errorf("merges: %w", err)
	}
	return asPairs, nil
}

// VocabSize is one more than the largest id.
func (t *Tokenizer) VocabSize() int { return len(t.inverse) }

// TokenID returns the id of an exact token string (vocab or added).
func (t *Tokenizer) TokenID(s string) (int, bool) {
	for _, a := range t.added {
		if a.Content == s {
			return a.ID, true
		}
	}
	id, ok := t.vocab[s]
	return id, ok
}

// TokenString is the vocabulary (or added-token) string of id, "" for an unknown id.
func (t *Tokenizer) TokenString(id int) string {
	if s, ok := t.addedID[id]; ok {
		return s
	}
	if id < 0 || id >= len(t.inverse) {
		return ""
	}
	return t.inverse[id]
}

// Encode tokenizes text without the post-processor's special tokens (Hugging Face's
// add_special_tokens=False); added tokens written in the text are recognised.
func (t *Tokenizer) Encode(text string) []int {
	var ids []int
	first := true
	for len(text) > 0 {
		pos, tok := t.nextAdded(text)
		if pos < 0 {
			ids = append(ids, t.encodeSection(text, first)...)
			break
		}
		if pos > 0 {
			ids = append(ids, t.encodeSection(text[:pos], first)...)
		}
		ids = append(ids, tok.ID)
		text = text[pos+len(tok.Content):]
		first = false
	}
	return ids
}

// nextAdded finds the leftmost added token in text, the longest where several start there.
func (t *Tokenizer) nextAdded(text string) (int, AddedToken) {
	for i := 0; i < len(text); i++ {
		for _, a := range t.addedByFirst[text[i]] {
			if strings.HasPrefix(text[i:], a.Content) {
				return i, a
			}
		}
	}
	return -1, AddedToken{}
}

// EncodeWithSpecialTokens is Encode plus the post-processor's tokens (Hugging Face's default
// add_special_tokens=True), e.g. the BOS that Llama-family TemplateProcessing puts first.
func (t *Tokenizer) EncodeWithSpecialTokens(text string) []int {
	ids := t.Encode(text)
	out := make([]int, 0, len(t.post.prefix)+len(ids)+len(t.post.suffix))
	out = append(out, t.post.prefix...)
	out = append(out, ids...)
	return append(out, t.post.suffix...)
}

// encodeSection runs one stretch of text between added tokens through the pipeline; first says
// whether it starts the input (Metaspace's prepend_scheme "first").
func (t *Tokenizer) encodeSection(text string, first bool) []int {
	if t.normalizer != nil {
		text = t.normalizer.normalize(text)
	}
	if text == "" {
		return nil
	}
	pieces := []piece{{text: text, first: first}}
	if t.preTok != nil {
		pieces = t.preTok.split(pieces)
	}
	var ids []int
	for _, p := range pieces {
		ids = append(ids, t.bpe(p.text)...)
	}
	return ids
}

// maxCachedPiece keeps the cache to short pieces: without a splitting pre-tokenizer (Llama 2's
// pipeline) a piece is the whole input.
const maxCachedPiece = 256

// bpe applies the model to one pre-token: its characters are the first symbols (a character
// missing from the vocabulary becomes its <0xNN> byte tokens under byte_fallback, else unk), then
// merges apply lowest rank first, leftmost first among equals, as Hugging Face's BPE does.
func (t *Tokenizer) bpe(piece string) []int {
	if piece == "" {
		return nil
	}
	cacheable := len(piece) <= maxCachedPiece
	if cacheable {
		t.cacheMu.Lock()
		ids, ok := t.cache[piece]
		t.cacheMu.Unlock()
		if ok {
			return ids
		}
	}
	if t.ignoreMerges {
		if id, ok := t.vocab[piece]; ok {
			return []int{id}
		}
	}
	syms := make([]int32, 0, len(piece))
	unk, unkPending := int32(0), false
	for _, r := range piece {
		if id, ok := t.vocab[string(r)]; ok {
			if unkPending {
				syms = append(syms, unk)
				unkPending = false
			}
			syms = append(syms, int32(id))
			continue
		}
		if t.byteFallback && t.appendBytes(&syms, string(r)) {
			continue // a pending unk stays pending here, exactly as in Hugging Face's BPE
		}
		if t.unkID >= 0 {
			if unkPending && !t.fuseUnk {
				syms = append(syms, unk)
			}
			unk, unkPending = int32(t.unkID), true
		}
	}
	if unkPending {
		syms = append(syms, unk)
	}
	syms = t.mergeAll(syms)
	ids := make([]int, len(syms))
	for i, s := range syms {
		ids[i] = int(s)
	}
	if cacheable {
		t.cacheMu.Lock()
		if len(t.cache) < 100000 {
			t.cache[piece] = ids
		}
		t.cacheMu.Unlock()
	}
	return ids
}

// appendBytes adds the <0xNN> tokens of s, if the vocabulary has all of them.
func (t *Tokenizer) appendBytes(syms *[]int32, s string) bool {
	for i := 0; i < len(s); i++ {
		if t.byteIDs[s[i]] < 0 {
			return false
		}
	}
	for i := 0; i < len(s); i++ {
		*syms = append(*syms, t.byteIDs[s[i]])
	}
	return true
}

// mergeAll merges adjacent symbols by rank with a heap over a linked list: O(n log n), so a long
// piece (Llama 2 does not split its input) costs no more than its length calls for.
func (t *Tokenizer) mergeAll(syms []int32) []int32 {
	if len(syms) < 2 || len(t.merges) == 0 {
		return syms
	}
	n := len(syms)
	prev, next := make([]int, n), make([]int, n)
	alive := make([]bool, n)
	for i := range n {
		prev[i], next[i], alive[i] = i-1, i+1, true
	}
	next[n-1] = -1
	h := &mergeHeap{}
	for i := 0; i+1 < n; i++ {
		if m, ok := t.merges[[2]int32{syms[i], syms[i+1]}]; ok {
			heap.Push(h, candidate{pos: i, rank: m.rank, id: m.id})
		}
	}
	for h.Len() > 0 {
		c := heap.Pop(h).(candidate)
		if !alive[c.pos] || next[c.pos] < 0 {
			continue
		}
		right := next[c.pos]
		if m, ok := t.merges[[2]int32{syms[c.pos], syms[right]}]; !ok || m.id != c.id {
			continue // stale: a neighbour changed since this candidate was queued
		}
		syms[c.pos] = c.id
		alive[right] = false
		next[c.pos] = next[right]
		if next[right] >= 0 {
			prev[next[right]] = c.pos
		}
		if p := prev[c.pos]; p >= 0 {
			if m, ok := t.merges[[2]int32{syms[p], syms[c.pos]}]; ok {
				heap.Push(h, candidate{pos: p, rank: m.rank, id: m.id})
			}
		}
		if nx := next[c.pos]; nx >= 0 {
			if m, ok := t.merges[[2]int32{syms[c.pos], syms[nx]}]; ok {
				heap.Push(h, candidate{pos: c.pos, rank: m.rank, id: m.id})
			}
		}
	}
	out := syms[:0]
	for i := 0; i >= 0; i = next[i] {
		out = append(out, syms[i])
	}
	return out
}

type candidate struct {
	pos      int
	rank, id int32
}

type mergeHeap []candidate

func (h mergeHeap) Len() int { return len(h) }
func (h mergeHeap) Less(i, j int) bool {
	if h[i].rank != h[j].rank {
		return h[i].rank < h[j].rank
	}
	return h[i].pos < h[j].pos
}
func (h mergeHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *mergeHeap) Push(x any)   { *h = append(*h, x.(candidate)) }
func (h *mergeHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// Decode turns ids back into text through the decoder; ids outside the vocabulary are skipped.
// Special tokens are kept (Hugging Face's skip_special_tokens=False).
func (t *Tokenizer) Decode(ids []int) string {
	tokens := make([]string, 0, len(ids))
	for _, id := range ids {
		if s, ok := t.addedID[id]; ok {
			tokens = append(tokens, s)
			continue
		}
		if id < 0 || id >= len(t.inverse) {
			continue
		}
		tokens = append(tokens, t.inverse[id])
	}
	if t.decoder == nil {
		return strings.Join(tokens, " ")
	}
	return strings.Join(t.decoder.decode(tokens), "")
}

// byteToRune is GPT-2's reversible byte → printable-unicode map used by ByteLevel.
var byteToRune, runeToByte = func() ([256]rune, map[rune]byte) {
	var fwd [256]rune
	inv := map[rune]byte{}
	n := 0
	for b := range 256 {
		if (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF) {
			fwd[b] = rune(b)
		} else {
			fwd[b] = rune(256 + n)
			n++
		}
		inv[fwd[b]] = byte(b)
	}
	return fwd, inv
}()

// ByteSymbol is the vocab string for a single byte.
func ByteSymbol(b byte) string { return string(byteToRune[b]) }
