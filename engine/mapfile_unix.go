//go:build unix

package engine

import (
	"fmt"
	"syscall"

	"github.com/skein-ai/skein/internal/filebound"
)

// mapReadOnly maps a file read-only (and is unmapped by release, unlike hostmem's mapFile for weight files): a GGUF's tensors are copied out of it one at a time, so the
// file's pages stay page cache (dropped under pressure) rather than a second copy of the model in
// the heap. release unmaps it; nothing may hold its bytes afterwards.
func mapReadOnly(path string) ([]byte, func(), error) {
	f, fi, err := filebound.Open(path) // a regular file: a FIFO would block, a device never end
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	if fi.Size() == 0 {
		return nil, func() {}, nil
	}
	if fi.Size() != int64(int(fi.Size())) {
		return nil, nil, fmt.Errorf("%s is too large to map", path)
	}
	b, err := syscall.Mmap(int(f.Fd()), 0, int(fi.Size()), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return nil, nil, fmt.Errorf("mapping %s: %w", path, err)
	}
	return b, func() { _ = syscall.Munmap(b) }, nil
}
