//go:build unix

package engine

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// loadWithin loads dir, failing the test if Load has not returned after a while (a FIFO used to
// block it for ever).
func loadWithin(t *testing.T, dir string) error {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		_, err := Load(dir, Options{})
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-time.After(20 * time.Second):
		t.Fatalf("loading %s never returned", dir)
		return nil
	}
}

// A model directory's small files are read only if they are regular files within a size bound;
// a link to /dev/zero, a FIFO or an oversized file is an error naming the file, never an
// out-of-memory crash or a blocked start-up (issue 40, item 13).
func TestModelFilesAreRegularAndBounded(t *testing.T) {
	base := t.TempDir()
	if err := InitTiny(base, ArchQwen3, "tiny", 1); err != nil {
		t.Fatal(err)
	}
	variant := func(t *testing.T, file string, make func(path string)) string {
		t.Helper()
		dir := filepath.Join(t.TempDir(), "m")
		if err := os.CopyFS(dir, os.DirFS(base)); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, file)
		if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		make(path)
		return dir
	}
	cfg, err := os.ReadFile(filepath.Join(base, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	padded := func(b []byte, n int) func(string) {
		return func(path string) {
			if err := os.WriteFile(path, append(append([]byte{}, b...), strings.Repeat(" ", n)...), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	fifo := func(path string) {
		if err := syscall.Mkfifo(path, 0o600); err != nil {
			t.Skip("no FIFOs here:", err)
		}
	}
	zero := func(path string) {
		if err := os.Symlink("/dev/zero", path); err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct {
		name, file string
		make       func(string)
		want       string
	}{
		{"oversized config.json", "config.json", padded(cfg, maxConfigBytes), "bytes"},
		{"config.json a FIFO", "config.json", fifo, "not a regular file"},
		{"tokenizer.json a FIFO", "tokenizer.json", fifo, "not a regular file"},
		{"model.safetensors.index.json a FIFO", "model.safetensors.index.json", fifo, "not a regular file"},
		{"model.safetensors a FIFO", "model.safetensors", fifo, "not a regular file"},
	}
	if os.Getenv("SKEIN_TEST_OLD_CODE") == "" { // before the fix these take every byte of memory
		cases = append(cases,
			struct {
				name, file string
				make       func(string)
				want       string
			}{"config.json linked to /dev/zero", "config.json", zero, "not a regular file"},
			struct {
				name, file string
				make       func(string)
				want       string
			}{"tokenizer.json linked to /dev/zero", "tokenizer.json", zero, "not a regular file"})
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := loadWithin(t, variant(t, tc.file, tc.make))
			if err == nil || !strings.Contains(err.Error(), tc.file) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("%v; want an error naming %s (%s)", err, tc.file, tc.want)
			}
		})
	}
}
