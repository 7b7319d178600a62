package engine

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/skein-ai/skein/internal/filebound"
	"github.com/skein-ai/skein/safetensors"
)

// Loading a big model takes minutes, and a person waits on it: Load says what it loads, how
// far it has read, and what it took (through Options.Logger; nothing without one).
var (
	// loadProgressEvery is the least time between two progress lines, so a fast load prints
	// only its start and end. A variable so that tests can move it.
	loadProgressEvery = 5 * time.Second
	// loadChunk is how much is read at once between progress checks.
	loadChunk = 64 << 20
	// mapFrom is the size from which a weight file is mapped rather than read (hostmem_linux.go).
	// A variable so that tests can take the mapped path with tiny models.
	mapFrom int64 = 1 << 30
)

// loadProgress counts the bytes read of a load's weight files and logs them now and then.
type loadProgress struct {
	log         *slog.Logger
	total, read int64
	start, last time.Time
}

func newLoadProgress(log *slog.Logger, dir string, paths []string) *loadProgress {
	p := &loadProgress{log: log, start: time.Now()}
	for _, path := range paths {
		if st, err := os.Stat(path); err == nil {
			p.total += st.Size()
		}
	}
	p.last = p.start
	p.logf("loading model", "dir", dir, "files", len(paths), "bytes", p.total, "size", sizeString(p.total))
	return p
}

func (p *loadProgress) logf(msg string, args ...any) {
	if p.log != nil {
		p.log.Log(context.Background(), slog.LevelInfo, msg, args...)
	}
}

func (p *loadProgress) add(n int) {
	p.read += int64(n)
	if now := time.Now(); p.log != nil && now.Sub(p.last) >= loadProgressEvery && p.read < p.total {
		p.last = now
		p.logf("loading model: reading weights", "read_bytes", p.read, "of", p.total,
			"percent", fmt.Sprintf("%.0f", 100*float64(p.read)/float64(max(p.total, 1))),
			"seconds", now.Sub(p.start).Seconds())
	}
}

func (p *loadProgress) done(dir string, tensors int) {
	p.logf("model loaded", "dir", dir, "bytes", p.read, "size", sizeString(p.read), "tensors", tensors,
		"seconds", time.Since(p.start).Seconds())
}

// readWeightsFile reads a safetensors file in loadChunk pieces, counting them into p.
func readWeightsFile(path string, p *loadProgress) (*safetensors.File, error) {
	f, st, err := filebound.Open(path) // a regular file: a FIFO or a device would never end
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if st.Size() >= mapFrom {
		if b, ok := mapFile(path); ok {
			p.add(len(b))
			sf, err := safetensors.Parse(b)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", path, err)
			}
			return sf, nil
		}
	}
	b := make([]byte, st.Size())
	for off := 0; off < len(b); {
		n, err := f.Read(b[off:min(off+loadChunk, len(b))])
		off += n
		p.add(n)
		if err == io.EOF && off < len(b) {
			return nil, fmt.Errorf("%s: shorter than its size", path)
		}
		if err != nil && err != io.EOF {
			return nil, err
		}
	}
	sf, err := safetensors.Parse(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return sf, nil
}

// sizeString is n bytes for a person: 2.4 GB, 312.0 MB, 5.1 kB.
func sizeString(n int64) string {
	switch {
	case n >= 1e9:
		return fmt.Sprintf("%.1f GB", float64(n)/1e9)
	case n >= 1e6:
		return fmt.Sprintf("%.1f MB", float64(n)/1e6)
	case n >= 1e3:
		return fmt.Sprintf("%.1f kB", float64(n)/1e3)
	}
	return fmt.Sprintf("%d B", n)
}
