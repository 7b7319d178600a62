//go:build !unix

package engine

import (
	"io"

	"github.com/skein-ai/skein/internal/filebound"
)

// mapReadOnly reads the whole file where memory maps are not available (a regular file only).
func mapReadOnly(path string) ([]byte, func(), error) {
	f, fi, err := filebound.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, fi.Size()))
	return b, func() {}, err
}
