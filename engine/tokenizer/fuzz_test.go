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

// Any tokenizer.json that parses encodes and decodes any text without panicking, and Encode's ids
// are ids of the vocabulary. Sizes are bounded so that one input stays cheap.
func FuzzEncode(f *testing.F) {
	sp := `{"normalizer":{"type":"Sequence","normalizers":[{"type":"NFKC"},{"type":"Prepend","prepend":"▁"},{"type":"Replace","pattern":{"String":" "},"content":"▁"}]},
	"pre_tokenizer":{"type":"Metaspace","replacement":"▁","prepend_scheme":"first","split":true},
	"post_processor":{"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"<s>"}},{"Sequence":{"id":"A"}}],"special_tokens":{"<s>":{"ids":[1]}}},
	"decoder":{"type":"Sequence","decoders":[{"type":"Replace","pattern":{"String":"▁"},"content":" "},{"type":"ByteFallback"},{"type":"Fuse"},{"type":"Strip","content":" ","start":1,"stop":0}]},
	"added_tokens":[{"id":1,"content":"<s>","special":true}],
	"model":{"type":"BPE","byte_fallback":true,"unk_token":"<unk>","fuse_unk":true,"vocab":{"<unk>":0,"<s>":1,"<0xC3>":2,"<0xA9>":3,"▁":4,"a":5,"b":6,"▁a":7,"ab":8},"merges":["▁ a","a b"]}}`
	bl := `{"pre_tokenizer":{"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":"\\p{N}{1,3}"},"behavior":"Isolated"},{"type":"Split","pattern":{"String":"-"},"behavior":"MergedWithNext","invert":true},{"type":"ByteLevel","add_prefix_space":true}]},
	"decoder":{"type":"ByteLevel"},"model":{"type":"BPE","vocab":{"a":0,"b":1,"Ġ":2,"Ġa":3},"merges":[["Ġ","a"]]}}`
	f.Add([]byte(sp), "a b  é ab<s>a")
	f.Add([]byte(bl), "a-b 123456 -a")
	f.Add([]byte(`{"model":{"type":"BPE","vocab":{"a":0},"merges":[]}}`), "")
	f.Fuzz(func(t *testing.T, doc []byte, text string) {
		if len(doc) > 1<<14 || len(text) > 1<<10 {
			t.Skip()
		}
		tok, err := tokenizer.Parse(doc)
		if err != nil {
			return
		}
		ids := tok.Encode(text)
		for _, id := range ids {
			if id < 0 || id >= tok.VocabSize() {
				t.Fatalf("id %d outside the vocabulary of %d", id, tok.VocabSize())
			}
		}
		tok.Decode(ids)
		tok.Decode(tok.EncodeWithSpecialTokens(text))
		tok.Decode([]int{-1, 1 << 40, 0})
	})
}
