//go:build !unix

package engine

import "os"

// mapFile reads the whole file where memory maps are not available.
func mapFile(path string) ([]byte, func(), error) {
	b, err := os.ReadFile(path)
	return b, func() {}, err
}
