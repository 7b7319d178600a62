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
