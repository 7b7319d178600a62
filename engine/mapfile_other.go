//go:build !unix

package engine

import "os"

// mapReadOnly reads the whole file where memory maps are not available.
func mapReadOnly(path string) ([]byte, func(), error) {
	b, err := os.ReadFile(path)
	return b, func() {}, err
}
