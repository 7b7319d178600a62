//go:build !linux

package engine

// mapFile maps nothing here: weight files are read (hostmem_linux.go maps them).
func mapFile(string) ([]byte, bool) { return nil, false }

// releaseHost does nothing where files are read.
func releaseHost([]byte) {}
