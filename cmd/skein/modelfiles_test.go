//go:build unix

package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/skein-ai/skein/engine"
)

// within runs f, failing the test if it has not returned after a while (a FIFO used to block).
func within(t *testing.T, what string, f func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		return err
	case <-time.After(20 * time.Second):
		t.Fatalf("%s never returned", what)
		return nil
	}
}

// A cache entry's refs/main, and the files of an adapter given to export-gguf, are read only if
// they are regular files within a bound: a link to /dev/zero, a FIFO or an oversized refs/main
// is an error naming the file, never an out-of-memory crash or a blocked start (issue 40, item 13).
func TestModelFilesOfTheCLIAreRegularAndBounded(t *testing.T) {
	old := os.Getenv("SKEIN_TEST_OLD_CODE") != "" // before the fix the /dev/zero cases take every byte of memory
	entry, _ := hfCache(t, "Org/Model")
	ref := filepath.Join(entry, "refs", "main")
	set := func(make func(string) error) {
		t.Helper()
		if err := os.Remove(ref); err != nil {
			t.Fatal(err)
		}
		if err := make(ref); err != nil {
			t.Fatal(err)
		}
	}
	cases := map[string]func(string) error{
		"fifo": func(p string) error { return syscall.Mkfifo(p, 0o600) },
		"oversized": func(p string) error {
			return os.WriteFile(p, []byte("0123456789abcdef0123456789abcdef01234567"+strings.Repeat("\n", 8<<10)), 0o644)
		},
	}
	if !old {
		cases["/dev/zero"] = func(p string) error { return os.Symlink("/dev/zero", p) }
	}
	for name, make := range cases {
		set(make)
		err := within(t, "resolveModel with refs/main "+name, func() error { _, _, err := resolveModel(entry); return err })
		if err == nil || !strings.Contains(err.Error(), "refs/main") {
			t.Errorf("refs/main %s: %v; want an error naming it", name, err)
		}
	}

	base := t.TempDir()
	if err := engine.InitTiny(base, engine.ArchQwen3, "tiny", 1); err != nil {
		t.Fatal(err)
	}
	e, err := engine.Load(base, engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.CreateAdapter("a", engine.LoraConfig{Rank: 2, TrainAttn: true}); err != nil {
		t.Fatal(err)
	}
	ck := t.TempDir()
	if err := e.SaveAdapter(context.Background(), "a", ck, false); err != nil {
		t.Fatal(err)
	}
	files := []string{engine.AdapterConfigFile, engine.AdapterWeightsFile}
	for _, file := range files {
		kinds := map[string]func(string) error{"fifo": func(p string) error { return syscall.Mkfifo(p, 0o600) }}
		if !old {
			kinds["/dev/zero"] = func(p string) error { return os.Symlink("/dev/zero", p) }
		}
		for kind, make := range kinds {
			dir := filepath.Join(t.TempDir(), "ck")
			if err := os.CopyFS(dir, os.DirFS(ck)); err != nil {
				t.Fatal(err)
			}
			p := filepath.Join(dir, file)
			if err := os.Remove(p); err != nil {
				t.Fatal(err)
			}
			if err := make(p); err != nil {
				t.Fatal(err)
			}
			out := filepath.Join(t.TempDir(), "a.gguf")
			err := within(t, "export-gguf with "+file+" a "+kind, func() error {
				_, err := captureOutput(t, "model", "export-gguf", dir, out, "--base", base)
				return err
			})
			if err == nil || !strings.Contains(err.Error(), file) {
				t.Errorf("export-gguf with %s a %s: %v; want an error naming it", file, kind, err)
			}
		}
	}
}

// Links inside a Hugging Face cache entry or an Ollama models directory must stay inside it:
// a snapshot's files link to ../../blobs/ (followed), a link to anywhere else is an error
// naming it; an Ollama blob that links out of the models directory is an error too (issue 40,
// item 14).
func TestModelCachesKeepTheirLinksInside(t *testing.T) {
	outside := t.TempDir()
	entry, snapshot := hfCache(t, "Org/Linked")
	blobs := filepath.Join(entry, "blobs")
	if err := os.MkdirAll(blobs, 0o755); err != nil {
		t.Fatal(err)
	}
	// As huggingface_hub lays it out: the file in blobs/, a relative link in the snapshot.
	if err := os.Rename(filepath.Join(snapshot, "config.json"), filepath.Join(blobs, "cfg")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join("..", "..", "blobs", "cfg"), filepath.Join(snapshot, "config.json")); err != nil {
		t.Fatal(err)
	}
	for _, given := range []string{entry, snapshot} {
		if dir, _, err := resolveModel(given); err != nil || dir != snapshot {
			t.Fatalf("%s with its files linked into blobs/: %s %v", given, dir, err)
		}
	}
	if err := os.Rename(filepath.Join(snapshot, "tokenizer.json"), filepath.Join(outside, "tokenizer.json")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(outside, "tokenizer.json"), filepath.Join(snapshot, "tokenizer.json")); err != nil {
		t.Fatal(err)
	}
	for _, given := range []string{entry, snapshot} {
		if _, _, err := resolveModel(given); err == nil || !strings.Contains(err.Error(), "tokenizer.json") || !strings.Contains(err.Error(), "outside") {
			t.Errorf("%s with tokenizer.json linked out of the cache entry: %v; want an error naming it", given, err)
		}
	}

	models := filepath.Join(t.TempDir(), "models")
	digest := strings.Repeat("cd", 32)
	manifest := filepath.Join(models, "manifests", "registry.ollama.ai", "library", "m", "latest")
	if err := os.MkdirAll(filepath.Dir(manifest), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(models, "blobs"), 0o755); err != nil {
		t.Fatal(err)
	}
	body := `{"layers":[{"mediaType":"application/vnd.ollama.image.model","digest":"sha256:` + digest + `"}]}`
	if err := os.WriteFile(manifest, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	blob := filepath.Join(models, "blobs", "sha256-"+digest)
	if err := os.WriteFile(filepath.Join(outside, "x.gguf"), []byte("GGUF"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(outside, "x.gguf"), blob); err != nil {
		t.Fatal(err)
	}
	if _, _, err := resolveModel(manifest); err == nil || !strings.Contains(err.Error(), "sha256-"+digest) || !strings.Contains(err.Error(), "outside") {
		t.Errorf("an Ollama blob linked out of the models directory: %v; want an error naming it", err)
	}
	// A blob inside (a link within the models directory included) is fine.
	if err := os.Remove(blob); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(models, "blobs", "real"), []byte("GGUF"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("real", blob); err != nil {
		t.Fatal(err)
	}
	if got, _, err := resolveModel(manifest); err != nil || got != blob {
		t.Errorf("an Ollama blob linked inside the models directory: %s %v", got, err)
	}
}
