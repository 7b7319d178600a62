package tokenizer_test

import (
	"testing"

	"github.com/skein-ai/skein/engine/tokenizer"
)

// Ids that would index out of range or size a giant inverse table, and an empty added token
// (which made Encode loop forever), are load errors.
func TestParseRejectsHostileTokenizers(t *testing.T) {
	cases := map[string]string{
		"negative vocab id":   `{"model":{"type":"BPE","vocab":{"a":-1}}}`,
		"huge vocab id":       `{"model":{"type":"BPE","vocab":{"a":4611686018427387904}}}`,
		"negative added id":   `{"model":{"type":"BPE","vocab":{"a":0}},"added_tokens":[{"id":-5,"content":"<x>"}]}`,
		"huge added id":       `{"model":{"type":"BPE","vocab":{"a":0}},"added_tokens":[{"id":4611686018427387904,"content":"<x>"}]}`,
		"empty added content": `{"model":{"type":"BPE","vocab":{"a":0}},"added_tokens":[{"id":1,"content":""}]}`,
	}
	for name, js := range cases {
		func() {
			defer func() {
				if v := recover(); v != nil {
					t.Errorf("%s: panic: %v", name, v)
				}
			}()
			if _, err := tokenizer.Parse([]byte(js)); err == nil {
				t.Errorf("%s: accepted", name)
			}
		}()
	}
}

// Parse never panics or allocates past its input's bounds, and a tokenizer it accepts encodes
// and decodes without panicking or looping.
func FuzzParse(f *testing.F) {
	tiny, err := tokenizer.Train("hello world, hello tokenizer 123", 300, []string{"<|im_start|>"})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(tiny)
	f.Add([]byte(`{"model":{"type":"BPE","vocab":{"a":0,"b":1,"ab":2},"merges":[["a","b"]]},"added_tokens":[{"id":3,"content":"<s>"}]}`))
	f.Add([]byte(`{"model":{"type":"BPE","vocab":{"a":0},"merges":["a b"]},"pre_tokenizer":{"type":"Split","pattern":{"String":" "}}}`))
	f.Add([]byte(`{"model":{"type":"BPE","vocab":{"a":0}},"pre_tokenizer":{"type":"ByteLevel"},"normalizer":{"type":"NFC"}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		tok, err := tokenizer.Parse(b)
		if err != nil {
			return
		}
		if tok.VocabSize() > tokenizer.MaxVocab {
			t.Fatalf("vocabulary of %d ids", tok.VocabSize())
		}
		ids := tok.Encode("hello <s> ab wörld 123\n\t<|im_start|>")
		_ = tok.Decode(append(ids, -1, 1<<40))
	})
}
