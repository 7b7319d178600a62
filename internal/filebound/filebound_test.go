//go:build unix

package filebound

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// Only regular files are read, each within its bound; anything else is an error naming the file.
func TestReadIsBounded(t *testing.T) {
	dir := t.TempDir()
	ok := filepath.Join(dir, "ok.json")
	if err := os.WriteFile(ok, []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := Read(ok, 2); err != nil || string(b) != "{}" {
		t.Fatalf("a file within its bound: %q %v", b, err)
	}
	if _, err := Read(ok, 1); err == nil || !strings.Contains(err.Error(), ok) || !strings.Contains(err.Error(), "1 bytes") {
		t.Fatalf("a file over its bound: %v", err)
	}
	zero := filepath.Join(dir, "zero")
	if err := os.Symlink("/dev/zero", zero); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Skip("no FIFOs here:", err)
	}
	for _, p := range []string{zero, fifo, dir} {
		if _, err := Read(p, 1<<20); err == nil || !strings.Contains(err.Error(), p) || !strings.Contains(err.Error(), "not a regular file") {
			t.Errorf("%s: %v; want an error naming it", p, err)
		}
	}
}
