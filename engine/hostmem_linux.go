package engine

import (
	"os"
	"sync"
	"syscall"
	"unsafe"
)

// Weight files of big models are mapped, not read: a read file's bytes are one allocation that
// lives until the last tensor aliasing it has been converted, so loading held the file and the
// converted model at once (32 GB for an 8B model in bf16). Mapped, each tensor's pages are given
// back (releaseHost) as soon as loadModel has converted it: the load holds the model and about
// one tensor.

// mappings are the weight files mapped so far (never unmapped: a tensor still aliasing one after
// the load, if any, reads the file again).
var mappings struct {
	sync.Mutex
	spans [][2]uintptr
}

// mapFile maps path read-only; ok is false where it cannot (the caller reads it instead).
func mapFile(path string) (b []byte, ok bool) {
	f, err := os.Open(path)
	if err != nil {
		return nil, false
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil || st.Size() == 0 || int64(int(st.Size())) != st.Size() {
		return nil, false
	}
	b, err = syscall.Mmap(int(f.Fd()), 0, int(st.Size()), syscall.PROT_READ, syscall.MAP_PRIVATE)
	if err != nil {
		return nil, false
	}
	start := uintptr(unsafe.Pointer(&b[0]))
	mappings.Lock()
	mappings.spans = append(mappings.spans, [2]uintptr{start, start + uintptr(len(b))})
	mappings.Unlock()
	return b, true
}

// releaseHost gives back the pages wholly inside b, when b lies in a mapped weight file (heap
// bytes are left alone). Reading b afterwards still works: the pages come back from the file.
func releaseHost(b []byte) {
	if len(b) == 0 {
		return
	}
	lo := uintptr(unsafe.Pointer(&b[0]))
	hi := lo + uintptr(len(b))
	mappings.Lock()
	inside := false
	for _, s := range mappings.spans {
		if lo >= s[0] && hi <= s[1] {
			inside = true
			break
		}
	}
	mappings.Unlock()
	if !inside {
		return
	}
	page := uintptr(os.Getpagesize())
	a, z := (lo+page-1)/page*page, hi/page*page
	if z <= a {
		return
	}
	_ = syscall.Madvise(b[a-lo:z-lo], syscall.MADV_DONTNEED)
}
