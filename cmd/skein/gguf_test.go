package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/skein-ai/skein/engine"
	"github.com/skein-ai/skein/engine/gguf"
)

// skein model to-gguf writes a model directory as a GGUF that skein serves (named without
// .gguf), and skein model export-gguf turns a saved adapter into a llama.cpp LoRA adapter for
// it, taking the base as the directory or as the GGUF.
func TestModelToGGUFAndExportGGUF(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "llm")
	if err := engine.InitTiny(dir, engine.ArchLlama, "tiny", 1); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "llm-q8.gguf")
	if _, err := captureOutput(t, "model", "to-gguf", dir, file, "--type", "q8_0"); err != nil {
		t.Fatal(err)
	}
	e, name, err := loadModel(file, "", engine.Options{Precision: engine.PrecisionQ8_0})
	if err != nil {
		t.Fatal(err)
	}
	if name != "llm-q8" || e.Config.Arch != engine.ArchLlama {
		t.Fatalf("served as %q, arch %s", name, e.Config.Arch)
	}
	if _, err := e.CreateAdapter("a", engine.LoraConfig{Rank: 2, TrainAttn: true, TrainUnembed: true}); err != nil {
		t.Fatal(err)
	}
	ck := t.TempDir()
	if err := e.SaveAdapter(context.Background(), "a", ck, false); err != nil {
		t.Fatal(err)
	}
	for _, base := range []string{dir, file} {
		out := filepath.Join(t.TempDir(), "adapter.gguf")
		if _, err := captureOutput(t, "model", "export-gguf", ck, out, "--base", base); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		f, err := gguf.Parse(b)
		if err != nil {
			t.Fatal(err)
		}
		if v, _ := f.Value("general.type"); v != "adapter" {
			t.Fatalf("general.type %v", v)
		}
		if _, ok := f.Tensor("output.weight.lora_b"); !ok {
			t.Fatal("no head LoRA (the llama base is untied)")
		}
	}
	if _, err := captureOutput(t, "model", "export-gguf", ck, "x.gguf"); err == nil || !strings.Contains(err.Error(), "--base") {
		t.Fatalf("export-gguf without --base: %v", err)
	}
	if _, err := captureOutput(t, "model", "to-gguf", dir, "x.gguf", "--type", "q5_1"); err == nil {
		t.Fatal("an unknown --type was accepted")
	}
}

// An Ollama manifest as --model serves its GGUF blob under Ollama's name; a manifest without a
// model layer, or with a digest that is not a sha256, is an error naming the file.
func TestOllamaManifestModels(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tiny")
	if err := engine.InitTiny(dir, engine.ArchQwen3, "tiny", 1); err != nil {
		t.Fatal(err)
	}
	models := filepath.Join(t.TempDir(), "models")
	digest := strings.Repeat("ab", 32)
	if err := os.MkdirAll(filepath.Join(models, "blobs"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := engine.WriteGGUF(dir, filepath.Join(models, "blobs", "sha256-"+digest), gguf.F16, "tiny"); err != nil {
		t.Fatal(err)
	}
	manifest := func(ns, model, tag, body string) string {
		p := filepath.Join(models, "manifests", "registry.ollama.ai", ns, model, tag)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := `{"schemaVersion":2,"layers":[{"mediaType":"application/vnd.ollama.image.template","digest":"sha256:` + strings.Repeat("0", 64) +
		`"},{"mediaType":"application/vnd.ollama.image.model","digest":"sha256:` + digest + `","size":1}]}`
	for _, c := range []struct{ ns, want string }{{"library", "tiny-qwen:latest"}, {"someone", "someone/tiny-qwen:latest"}} {
		e, name, err := loadModel(manifest(c.ns, "tiny-qwen", "latest", good), "", engine.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if name != c.want || e.Config.Arch != engine.ArchQwen3 {
			t.Fatalf("served as %q (%s), want %q", name, e.Config.Arch, c.want)
		}
	}
	for _, body := range []string{`{"layers":[]}`, `{"layers":[{"mediaType":"application/vnd.ollama.image.model","digest":"sha256:../../etc"}]}`, `not json`} {
		if _, _, err := resolveModel(manifest("library", "bad", "x", body)); err == nil || !strings.Contains(err.Error(), "manifest") {
			t.Errorf("%s: %v", body, err)
		}
	}
}
