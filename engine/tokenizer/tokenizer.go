// Package tokenizer implements Hugging Face byte-level BPE tokenizers (tokenizer.json), the kind
// used by Llama 3, Qwen2 and Qwen3, giving the same ids as the reference implementation.
package tokenizer

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"

	"github.com/dlclark/regexp2"
	"golang.org/x/text/unicode/norm"
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

// Tokenizer encodes text to ids and back.
type Tokenizer struct {
	vocab   map[string]int
	inverse []string
	ranks   map[[2]string]int
	added   []AddedToken // longest content first, for matching
	addedID map[int]string
	split   *regexp2.Regexp
	nfc     bool
	// ignoreMerges (Llama 3): a pre-token that is itself in the vocabulary is one token, without BPE.
	ignoreMerges bool

	cacheMu sync.Mutex
	cache   map[string][]int
}

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

// Load reads a tokenizer.json.
func Load(path string) (*Tokenizer, error) {
	b, err := os.ReadFile(path)
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
		return nil, fmt.Errorf("model type %q: only byte-level BPE is supported", f.Model.Type)
	}
	t := &Tokenizer{vocab: f.Model.Vocab, ranks: map[[2]string]int{}, addedID: map[int]string{}, cache: map[string][]int{}}
	merges, err := parseMerges(f.Model.Merges)
	if err != nil {
		return nil, err
	}
	for i, m := range merges {
		if _, dup := t.ranks[m]; !dup {
			t.ranks[m] = i
		}
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
	t.inverse = make([]string, maxID+1)
	for s, id := range t.vocab {
		t.inverse[id] = s
	}
	pattern, useByteLevelRegex, err := splitPattern(f.PreTokenizer)
	if err != nil {
		return nil, err
	}
	if pattern == "" && useByteLevelRegex {
		pattern = gpt2Pattern
	}
	if pattern != "" {
		t.split, err = regexp2.Compile(pattern, regexp2.Unicode)
		if err != nil {
			return nil, fmt.Errorf("pre-tokenizer pattern: %w", err)
		}
	}
	t.nfc = strings.Contains(string(f.Normalizer), `"NFC"`)
	t.ignoreMerges = f.Model.IgnoreMerges
	return t, nil
}

func parseMerges(raw json.RawMessage) ([][2]string, error) {
	if len(raw) == 0 {
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

// splitPattern finds the Split regex (and whether a ByteLevel step splits by itself).
func splitPattern(raw json.RawMessage) (string, bool, error) {
	type pre struct {
		Type          string          `json:"type"`
		Pattern       json.RawMessage `json:"pattern"`
		UseRegex      *bool           `json:"use_regex"`
		Pretokenizers []pre           `json:"pretokenizers"`
	}
	if len(raw) == 0 || string(raw) == "null" {
		return "", false, nil
	}
	var p pre
	if err := json.Unmarshal(raw, &p); err != nil {
		return "", false, err
	}
	steps := []pre{p}
	if p.Type == "Sequence" {
		steps = p.Pretokenizers
	}
	pattern, byteRegex := "", false
	for _, s := range steps {
		switch s.Type {
		case "Split":
			var pat struct {
				Regex  string `json:"Regex"`
				String string `json:"String"`
			}
			if err := json.Unmarshal(s.Pattern, &pat); err != nil {
				return "", false, err
			}
			pattern = pat.Regex
			if pattern == "" {
				pattern = regexp2.Escape(pat.String)
			}
		case "ByteLevel":
			byteRegex = s.UseRegex == nil || *s.UseRegex
		case "Digits", "Punctuation", "Whitespace":
			return "", false, fmt.Errorf("pre-tokenizer %s is not supported", s.Type)
		}
	}
	return pattern, byteRegex, nil
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

// Encode tokenizes text; added tokens in the text are recognised.
func (t *Tokenizer) Encode(text string) []int {
	var ids []int
	for len(text) > 0 {
		pos, tok := -1, AddedToken{}
		for _, a := range t.added {
			if i := strings.Index(text, a.Content); i >= 0 && (pos < 0 || i < pos) {
				pos, tok = i, a
			}
		}
		if pos < 0 {
			ids = append(ids, t.encodePlain(text)...)
			break
		}
		ids = append(ids, t.encodePlain(text[:pos])...)
		ids = append(ids, tok.ID)
		text = text[pos+len(tok.Content):]
	}
	return ids
}

func (t *Tokenizer) encodePlain(text string) []int {
	if text == "" {
		return nil
	}
	if t.nfc {
		text = norm.NFC.String(text)
	}
	var ids []int
	for _, piece := range t.pieces(text) {
		ids = append(ids, t.bpe(piece)...)
	}
	return ids
}

// pieces applies the pre-tokenizer split; text between matches is kept as its own piece.
func (t *Tokenizer) pieces(text string) []string {
	if t.split == nil {
		return []string{text}
	}
	runes := []rune(text)
	var out []string
	last := 0
	m, _ := t.split.FindRunesMatch(runes)
	for m != nil {
		if m.Index > last {
			out = append(out, string(runes[last:m.Index]))
		}
		out = append(out, string(runes[m.Index:m.Index+m.Length]))
		last = m.Index + m.Length
		m, _ = t.split.FindNextMatch(m)
	}
	if last < len(runes) {
		out = append(out, string(runes[last:]))
	}
	return out
}

// bpe merges the byte-level symbols of one piece by merge rank.
func (t *Tokenizer) bpe(piece string) []int {
	t.cacheMu.Lock()
	if ids, ok := t.cache[piece]; ok {
		t.cacheMu.Unlock()
		return ids
	}
	t.cacheMu.Unlock()
	syms := make([]string, 0, len(piece))
	for _, b := range []byte(piece) {
		syms = append(syms, string(byteToRune[b]))
	}
	if t.ignoreMerges {
		if id, ok := t.vocab[strings.Join(syms, "")]; ok {
			return []int{id}
		}
	}
	for len(syms) > 1 {
		best, bestRank := -1, int(^uint(0)>>1)
		for i := 0; i+1 < len(syms); i++ {
			if r, ok := t.ranks[[2]string{syms[i], syms[i+1]}]; ok && r < bestRank {
				best, bestRank = i, r
			}
		}
		if best < 0 {
			break
		}
		a, b := syms[best], syms[best+1]
		merged := syms[:0:0]
		for i := 0; i < len(syms); i++ {
			if i+1 < len(syms) && syms[i] == a && syms[i+1] == b {
				merged = append(merged, a+b)
				i++
			} else {
				merged = append(merged, syms[i])
			}
		}
		syms = merged
	}
	ids := make([]int, 0, len(syms))
	for _, s := range syms {
		if id, ok := t.vocab[s]; ok {
			ids = append(ids, id)
			continue
		}
		for _, r := range s { // unknown merged symbol: fall back to single bytes
			if id, ok := t.vocab[string(r)]; ok {
				ids = append(ids, id)
			}
		}
	}
	t.cacheMu.Lock()
	if len(t.cache) < 100000 {
		t.cache[piece] = ids
	}
	t.cacheMu.Unlock()
	return ids
}

// Decode turns ids back into text; ids outside the vocabulary are skipped.
func (t *Tokenizer) Decode(ids []int) string {
	var sb strings.Builder
	var buf []byte
	flush := func() {
		sb.Write(buf)
		buf = buf[:0]
	}
	for _, id := range ids {
		if s, ok := t.addedID[id]; ok {
			flush()
			sb.WriteString(s)
			continue
		}
		if id < 0 || id >= len(t.inverse) {
			continue
		}
		for _, r := range t.inverse[id] {
			if b, ok := runeToByte[r]; ok {
				buf = append(buf, b)
			}
		}
	}
	flush()
	return sb.String()
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
