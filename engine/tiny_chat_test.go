package engine

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/skein-ai/skein/engine/tokenizer"
)

// A generated model ships a tokenizer_config.json whose chat template and end-of-turn token are
// ChatML's, in the model's own vocabulary.
func TestInitTinyWritesAChatTemplate(t *testing.T) {
	dir := t.TempDir()
	if err := InitTiny(dir, ArchQwen3, "tiny", 1); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "tokenizer_config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		ChatTemplate string `json:"chat_template"`
		EOSToken     string `json:"eos_token"`
	}
	if err := json.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.Load(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := tok.TokenID(cfg.EOSToken); !ok || !strings.Contains(cfg.ChatTemplate, "<|im_start|>") {
		t.Fatalf("tokenizer_config.json: eos_token %q (in vocabulary: %v), template %q", cfg.EOSToken, ok, cfg.ChatTemplate)
	}
}

// A generated model from before chat templates gets one; a model's own tokenizer_config.json is
// never replaced.
func TestAddTinyChatTemplate(t *testing.T) {
	dir := t.TempDir()
	if err := AddTinyChatTemplate(dir); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "tokenizer_config.json"))
	if err != nil || !strings.Contains(string(b), "<|im_start|>") {
		t.Fatalf("added %q: %v", b, err)
	}
	own := []byte(`{"chat_template": "mine"}`)
	if err := os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), own, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := AddTinyChatTemplate(dir); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "tokenizer_config.json")); string(b) != string(own) {
		t.Fatalf("replaced with %q", b)
	}
}
