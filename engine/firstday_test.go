package engine

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"
)

// config.json's "architectures" says which head a checkpoint has: a sequence classifier or a
// token classifier of a supported family is not a causal LM, and loading it as one would serve
// garbage. Only the families' own classes load; anything else is an error naming the class and
// what is supported (issue 22).
func TestArchitecturesMustBeSupported(t *testing.T) {
	base := `{"architectures":[%q],"model_type":%q,"vocab_size":512,"hidden_size":64,"intermediate_size":128,` +
		`"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"rope_theta":10000}`
	finish := func(class, modelType string) error {
		var c Config
		js := fmt.Sprintf(base, class, modelType)
		if strings.Contains(modelType, "moe") { // a mixture of experts' sizes
			js = strings.TrimSuffix(js, "}") + `,"num_experts":4,"num_experts_per_tok":2,"moe_intermediate_size":32}`
		}
		if err := parseConfig([]byte(js), &c); err != nil {
			t.Fatal(err)
		}
		return c.finish()
	}
	for _, bad := range []struct{ class, modelType string }{
		{"Qwen3ForSequenceClassification", "qwen3"}, {"LlamaForTokenClassification", "llama"},
		{"Qwen2ForQuestionAnswering", "qwen2"}, {"MistralForCausalLM", "mistral"}, {"BertModel", "llama"},
	} {
		err := finish(bad.class, bad.modelType)
		if err == nil || !strings.Contains(err.Error(), bad.class) || !strings.Contains(err.Error(), "Qwen3ForCausalLM") {
			t.Errorf("%s (%s): %v, want an error naming it and the supported classes", bad.class, bad.modelType, err)
		}
	}
	for _, f := range families {
		if _, ok := f.(*qwen3VLFamily); ok {
			continue // needs a vision config; its class is checked by the VL tests
		}
		if err := finish(f.desc().hfClass, f.desc().modelType); err != nil {
			t.Errorf("%s: %v", f.desc().hfClass, err)
		}
	}
	// No "architectures" at all: model_type decides, as before.
	var c Config
	_ = json.Unmarshal([]byte(`{"model_type":"qwen3","vocab_size":512,"hidden_size":64,"intermediate_size":128,`+
		`"num_hidden_layers":2,"num_attention_heads":4,"rope_theta":10000}`), &c)
	if err := c.finish(); err != nil {
		t.Errorf("config without architectures: %v", err)
	}
}

// A saved adapter's adapter_config.json names its base model as the user knows it (the served
// name, e.g. Qwen/Qwen3-8B), not the server's local directory, which means nothing to PEFT or
// vLLM elsewhere; without a name the directory is all there is (issue 22).
func TestSavedAdapterNamesTheServedModel(t *testing.T) {
	dir := t.TempDir()
	if err := InitTiny(dir, ArchQwen3, "tiny", 1); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, want string }{{"Qwen/Qwen3-8B", "Qwen/Qwen3-8B"}, {"", dir}} {
		e, err := Load(dir, Options{Name: tc.name})
		if err != nil {
			t.Fatal(err)
		}
		for _, eng := range []*Engine{e, e.Fork()} {
			if _, err := eng.CreateAdapter("a", LoraConfig{Rank: 2, TrainAttn: true}); err != nil {
				t.Fatal(err)
			}
			out := t.TempDir()
			if err := eng.SaveAdapter(t.Context(), "a", out, false); err != nil {
				t.Fatal(err)
			}
			b, err := os.ReadFile(filepath.Join(out, AdapterConfigFile))
			if err != nil {
				t.Fatal(err)
			}
			var pc struct {
				Base string `json:"base_model_name_or_path"`
			}
			if err := json.Unmarshal(b, &pc); err != nil || pc.Base != tc.want {
				t.Errorf("name %q: base_model_name_or_path %q (%v), want %q", tc.name, pc.Base, err, tc.want)
			}
		}
	}
}

// Every preset's generated tokenizer covers its whole vocabulary: a random model samples any id
// in [0, vocab), and an id without a token decodes to nothing, so chats with the small and 1b
// presets answered "" (their tokenizers had 492 of 8,192 and 32,768 ids). Every id decodes to
// text, and text made of all of them encodes and decodes back to itself (issue 22).
func TestPresetTokenizersCoverTheirVocab(t *testing.T) {
	for name, p := range Presets {
		if !p.FillVocab {
			continue // tiny: see Preset.FillVocab
		}
		_, tok, err := tinyTokenizer(p, SpecialTokens)
		if err != nil {
			t.Fatal(err)
		}
		var text strings.Builder
		for id := range p.Vocab {
			s := tok.Decode([]int{id})
			if s == "" {
				t.Errorf("%s: id %d of %d decodes to nothing", name, id, p.Vocab)
				break
			}
			if utf8.ValidString(s) && !strings.ContainsRune(s, utf8.RuneError) { // not a piece of a character
				text.WriteString(s)
			}
		}
		if got := tok.Decode(tok.Encode(text.String())); got != text.String() {
			t.Errorf("%s: the text of all tokens does not survive encode and decode", name)
		}
	}
}

// Loading a model says what it loads (directory, bytes on disk), how far it has read while it
// reads (by bytes, at most every loadProgressEvery), and the total with the time taken, through
// Options.Logger; without one it is silent (issue 22).
func TestModelLoadReportsProgress(t *testing.T) {
	dir := t.TempDir()
	if err := InitTiny(dir, ArchQwen3, "tiny", 1); err != nil {
		t.Fatal(err)
	}
	oldEvery, oldChunk := loadProgressEvery, loadChunk
	loadProgressEvery, loadChunk = 0, 64<<10 // a line for every 64 KiB read
	defer func() { loadProgressEvery, loadChunk = oldEvery, oldChunk }()
	var buf bytes.Buffer
	if _, err := Load(dir, Options{Logger: slog.New(slog.NewJSONHandler(&buf, nil))}); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(filepath.Join(dir, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	var recs []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(l), &rec); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		recs = append(recs, rec)
	}
	if len(recs) < 4 {
		t.Fatalf("%d lines, want a start, progress and an end: %s", len(recs), buf.String())
	}
	first, last := recs[0], recs[len(recs)-1]
	if first["dir"] != dir || first["bytes"] != float64(st.Size()) {
		t.Errorf("first line %v, want the directory and its %d bytes", first, st.Size())
	}
	prev := 0.0
	for _, rec := range recs[1 : len(recs)-1] {
		read, _ := rec["read_bytes"].(float64)
		if read <= prev || read > float64(st.Size()) {
			t.Errorf("progress %v after %v bytes", rec, prev)
		}
		prev = read
	}
	if last["bytes"] != float64(st.Size()) || last["tensors"] == nil || last["tensors"] == float64(0) || last["seconds"] == nil {
		t.Errorf("last line %v, want the bytes, tensors and seconds", last)
	}
	// Without a logger, nothing (and nothing breaks).
	if _, err := Load(dir, Options{}); err != nil {
		t.Fatal(err)
	}
}

// Generating a model says what it makes (preset, parameters), how far it has got for a big
// preset (tensors drawn, at most every loadProgressEvery), and the total with the time taken
// (issue 22).
func TestInitTinyReportsProgress(t *testing.T) {
	old := loadProgressEvery
	loadProgressEvery = 0 // every tensor counts as a while
	defer func() { loadProgressEvery = old }()
	var buf bytes.Buffer
	dir := t.TempDir()
	if err := InitTinyLogged(dir, ArchQwen3, "tiny", 1, slog.New(slog.NewJSONHandler(&buf, nil))); err != nil {
		t.Fatal(err)
	}
	var msgs []string
	var last map[string]any
	for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		if err := json.Unmarshal([]byte(l), &last); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		msgs = append(msgs, last["msg"].(string))
	}
	st, err := os.Stat(filepath.Join(dir, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	joined := strings.Join(msgs, "|")
	if !strings.HasPrefix(joined, "generating model|") || !strings.Contains(joined, "generating model: drawing weights") ||
		last["msg"] != "model generated" || last["bytes"] != float64(st.Size()) || last["seconds"] == nil {
		t.Errorf("lines %q, last %v", msgs, last)
	}
}
