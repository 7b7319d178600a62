package tokenizer_test

import (
	"testing"

	"github.com/skein-ai/skein/engine/tokenizer"
)

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
