package tokenizer_test

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/skein-ai/skein/engine/tokenizer"
)

// build makes a tokenizer from a vocabulary (every listed string, plus its single characters)
// and tokenizer.json sections given as JSON text.
func build(t *testing.T, words []string, sections map[string]string, model map[string]any) (*tokenizer.Tokenizer, map[string]int) {
	t.Helper()
	vocab := map[string]int{}
	add := func(s string) {
		if _, ok := vocab[s]; !ok {
			vocab[s] = len(vocab)
		}
	}
	for _, w := range words {
		for _, r := range w {
			add(string(r))
		}
		add(w)
	}
	m := map[string]any{"type": "BPE", "vocab": vocab, "merges": []string{}, "ignore_merges": true}
	for k, v := range model {
		m[k] = v
	}
	doc := map[string]any{"model": m, "added_tokens": []any{}}
	for k, v := range sections {
		doc[k] = json.RawMessage(v)
	}
	b, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	return tok, vocab
}

func ids(vocab map[string]int, pieces ...string) []int {
	out := make([]int, len(pieces))
	for i, p := range pieces {
		out[i] = vocab[p]
	}
	return out
}

// Split's behaviours on the example of the tokenizers documentation ("the-final--countdown"
// split on "-"). transformers.js implements only removed/isolated/invert, so these come from the
// documented Hugging Face semantics; with ignore_merges every expected piece is one token.
func TestSplitBehaviors(t *testing.T) {
	words := []string{"the", "-", "final", "countdown", "the-", "final-", "-final", "-countdown", "--"}
	cases := []struct {
		behavior string
		invert   bool
		want     []string
	}{
		{"Removed", false, []string{"the", "final", "countdown"}},
		{"Isolated", false, []string{"the", "-", "final", "-", "-", "countdown"}},
		{"MergedWithPrevious", false, []string{"the-", "final-", "-", "countdown"}},
		{"MergedWithNext", false, []string{"the", "-final", "-", "-countdown"}},
		{"Contiguous", false, []string{"the", "-", "final", "--", "countdown"}},
		// inverted, the words are the matches and each "-" a piece between them
		{"MergedWithPrevious", true, []string{"the", "-final", "-", "-countdown"}},
		{"Removed", true, []string{"-", "-", "-"}},
	}
	for _, c := range cases {
		pre := `{"type":"Split","pattern":{"String":"-"},"behavior":"` + c.behavior + `","invert":` + map[bool]string{true: "true", false: "false"}[c.invert] + `}`
		tok, vocab := build(t, words, map[string]string{"pre_tokenizer": pre}, nil)
		if got, want := tok.Encode("the-final--countdown"), ids(vocab, c.want...); !reflect.DeepEqual(got, want) {
			t.Errorf("%s invert=%v: got %v, want %v (%q)", c.behavior, c.invert, got, want, c.want)
		}
	}
}

// An empty match (a lookahead) splits the text where it matches.
func TestSplitOnEmptyMatch(t *testing.T) {
	tok, vocab := build(t, []string{"a", "-b", "a-b", "-c"}, map[string]string{
		"pre_tokenizer": `{"type":"Split","pattern":{"Regex":"(?=-)"},"behavior":"Isolated","invert":false}`}, nil)
	if got, want := tok.Encode("a-b-c"), ids(vocab, "a", "-b", "-c"); !reflect.DeepEqual(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}

// Metaspace with split (its default) cuts before each ▁, as the tokenizers unit test shows:
// "Hey   friend!" is ▁Hey ▁ ▁ ▁friend!; prepend_scheme first prepends only at the input's start.
func TestMetaspaceSplitAndPrepend(t *testing.T) {
	words := []string{"▁Hey", "▁", "▁friend!", "Hey", "<s>"}
	tok, vocab := build(t, words, map[string]string{
		"pre_tokenizer": `{"type":"Metaspace","replacement":"▁","prepend_scheme":"always","split":true}`}, nil)
	if got, want := tok.Encode("Hey   friend!"), ids(vocab, "▁Hey", "▁", "▁", "▁friend!"); !reflect.DeepEqual(got, want) {
		t.Errorf("split: got %v, want %v", got, want)
	}
	first, vocab := build(t, words, map[string]string{
		"pre_tokenizer": `{"type":"Metaspace","replacement":"▁","prepend_scheme":"first","split":false}`}, nil)
	if got, want := first.Encode("Hey"), ids(vocab, "▁Hey"); !reflect.DeepEqual(got, want) {
		t.Errorf("first, at start: got %v, want %v", got, want)
	}
	never, vocab := build(t, words, map[string]string{
		"pre_tokenizer": `{"type":"Metaspace","replacement":"▁","add_prefix_space":false}`}, nil)
	if got, want := never.Encode("Hey"), ids(vocab, "Hey"); !reflect.DeepEqual(got, want) {
		t.Errorf("add_prefix_space false: got %v, want %v", got, want)
	}
}

// Hugging Face's Metaspace decoder drops every ▁ of the first token (unless the scheme is never)
// and turns the others into spaces.
func TestMetaspaceDecoderFirstToken(t *testing.T) {
	words := []string{"▁▁Hey", "▁friend!"}
	tok, vocab := build(t, words, map[string]string{
		"decoder": `{"type":"Metaspace","replacement":"▁","prepend_scheme":"always","split":true}`}, nil)
	if got := tok.Decode(ids(vocab, "▁▁Hey", "▁friend!")); got != "Hey friend!" {
		t.Errorf("always: %q", got)
	}
	never, vocab := build(t, words, map[string]string{
		"decoder": `{"type":"Metaspace","replacement":"▁","prepend_scheme":"never","split":true}`}, nil)
	if got := never.Decode(ids(vocab, "▁▁Hey", "▁friend!")); got != "  Hey friend!" {
		t.Errorf("never: %q", got)
	}
}

// A character missing from the vocabulary becomes its <0xNN> tokens under byte_fallback, or one
// unk (fused over a run with fuse_unk) without; ByteFallback decoding spells the bytes again and
// writes U+FFFD per token for bytes that are not UTF-8.
func TestByteFallbackAndUnk(t *testing.T) {
	words := []string{"<unk>", "a"}
	for b := 0; b < 256; b++ {
		words = append(words, "<0x"+strings.ToUpper(hex2(b))+">")
	}
	dec := `{"type":"Sequence","decoders":[{"type":"ByteFallback"},{"type":"Fuse"}]}`
	tok, vocab := build(t, words, map[string]string{"decoder": dec},
		map[string]any{"byte_fallback": true, "unk_token": "<unk>", "ignore_merges": false})
	want := ids(vocab, "a", "<0xC3>", "<0xA9>", "a")
	if got := tok.Encode("aéa"); !reflect.DeepEqual(got, want) {
		t.Errorf("byte_fallback: got %v, want %v", got, want)
	}
	if got := tok.Decode(want); got != "aéa" {
		t.Errorf("decode: %q", got)
	}
	if got := tok.Decode(ids(vocab, "a", "<0xC3>", "a")); got != "a\uFFFDa" {
		t.Errorf("decode of a lone lead byte: %q", got)
	}
	unk, vocab := build(t, []string{"<unk>", "a"}, nil, map[string]any{"unk_token": "<unk>", "fuse_unk": true, "ignore_merges": false})
	if got, want := unk.Encode("aéüa"), ids(vocab, "a", "<unk>", "a"); !reflect.DeepEqual(got, want) {
		t.Errorf("fuse_unk: got %v, want %v", got, want)
	}
}

func hex2(b int) string {
	const digits = "0123456789abcdef"
	return string([]byte{digits[b>>4], digits[b&15]})
}

// TemplateProcessing puts the BOS before the text only when special tokens are asked for.
func TestTemplateProcessingAddsBOS(t *testing.T) {
	tok, vocab := build(t, []string{"<s>", "</s>", "hi"}, map[string]string{"post_processor": `{"type":"TemplateProcessing",
		"single":[{"SpecialToken":{"id":"<s>","type_id":0}},{"Sequence":{"id":"A","type_id":0}},{"SpecialToken":{"id":"</s>","type_id":0}}],
		"special_tokens":{"<s>":{"id":"<s>","ids":[0],"tokens":["<s>"]},"</s>":{"id":"</s>","ids":[7],"tokens":["</s>"]}}}`}, nil)
	if got := tok.Encode("hi"); !reflect.DeepEqual(got, ids(vocab, "hi")) {
		t.Errorf("without special tokens: %v", got)
	}
	if got, want := tok.EncodeWithSpecialTokens("hi"), []int{0, vocab["hi"], 7}; !reflect.DeepEqual(got, want) {
		t.Errorf("with special tokens: got %v, want %v", got, want)
	}
}

// A tokenizer.json is checked before it sizes anything, and a pipeline step we do not implement
// is refused rather than silently skipped (which would give other ids than Hugging Face).
func TestParseRejects(t *testing.T) {
	for name, doc := range map[string]string{
		"negative id":      `{"model":{"type":"BPE","vocab":{"a":-1},"merges":[]}}`,
		"huge id":          `{"model":{"type":"BPE","vocab":{"a":1099511627776},"merges":[]}}`,
		"sparse id":        `{"model":{"type":"BPE","vocab":{"a":16000000},"merges":[]}}`,
		"huge added id":    `{"added_tokens":[{"id":1099511627776,"content":"<x>"}],"model":{"type":"BPE","vocab":{},"merges":[]}}`,
		"unknown normal":   `{"normalizer":{"type":"Precompiled"},"model":{"type":"BPE","vocab":{"a":0},"merges":[]}}`,
		"unknown pre-tok":  `{"pre_tokenizer":{"type":"UnicodeScripts"},"model":{"type":"BPE","vocab":{"a":0},"merges":[]}}`,
		"unknown behavior": `{"pre_tokenizer":{"type":"Split","pattern":{"String":" "},"behavior":"Sideways"},"model":{"type":"BPE","vocab":{"a":0},"merges":[]}}`,
		"unknown decoder":  `{"decoder":{"type":"CTC"},"model":{"type":"BPE","vocab":{"a":0},"merges":[]}}`,
		"bad template id":  `{"post_processor":{"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"x"}}],"special_tokens":{"x":{"ids":[-5]}}},"model":{"type":"BPE","vocab":{"a":0},"merges":[]}}`,
		"deep nesting":     `{"normalizer":` + strings.Repeat(`{"type":"Sequence","normalizers":[`, 20) + strings.Repeat(`]}`, 20) + `,"model":{"type":"BPE","vocab":{"a":0},"merges":[]}}`,
	} {
		_, err := tokenizer.Parse([]byte(doc))
		if err == nil {
			t.Errorf("%s: accepted", name)
		}
		if strings.HasPrefix(name, "unknown") && !errors.Is(err, tokenizer.ErrUnsupported) {
			t.Errorf("%s: %v does not wrap ErrUnsupported", name, err)
		}
	}
}
