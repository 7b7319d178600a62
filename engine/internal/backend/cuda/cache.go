package cuda

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Cache keeps compiled kernels on disk, keyed by what decides the output: the source (and its
// headers), the options (so the architecture) and the NVRTC version. A compile costs 0.1-0.2 s
// a file; a hit costs a file read.
//
// Layout: Dir/nvrtc-<version>/sm_<arch>/<name>-<sha256 prefix>.{cubin,ptx} with a .log beside it
// (the compiler's log, so ptxas's report survives a hit). Writes go through a temporary file
// renamed into place, so concurrent processes never read a partial entry.
type Cache struct {
	Dir string
}

// DefaultCache is $SKEIN_CUDA_CACHE, else skein/cuda-kernels under the user's cache folder
// (~/.cache on Linux); nil when neither can be had (compiles then go uncached).
func DefaultCache() *Cache {
	if d := os.Getenv("SKEIN_CUDA_CACHE"); d != "" {
		return &Cache{Dir: d}
	}
	d, err := os.UserCacheDir()
	if err != nil {
		return nil
	}
	return &Cache{Dir: filepath.Join(d, "skein", "cuda-kernels")}
}

// key is the entry's path without its extension.
func (c *Cache) key(n *NVRTC, name, src string, headers []Header, o CompileOptions) string {
	h := sha256.New()
	fmt.Fprintf(h, "nvrtc %s\x00name %s\x00opts %s\x00src %d\x00%s", n.Version(), name, strings.Join(o.flags(), " "), len(src), src)
	for _, hd := range headers {
		fmt.Fprintf(h, "\x00header %s %d\x00%s", hd.Name, len(hd.Source), hd.Source)
	}
	sum := hex.EncodeToString(h.Sum(nil))[:24]
	base := strings.TrimSuffix(filepath.Base(name), filepath.Ext(name))
	return filepath.Join(c.Dir, "nvrtc-"+n.Version(), fmt.Sprintf("sm_%d", o.Arch), base+"-"+sum)
}

// Compile is n.Compile through the cache: an entry when there is one, else a compile stored.
// A cache that cannot be written is not an error (the compile is returned all the same).
func (c *Cache) Compile(n *NVRTC, name, src string, headers []Header, o CompileOptions) (*Compiled, error) {
	k := c.key(n, name, src, headers, o)
	ext := ".cubin"
	if o.PTX {
		ext = ".ptx"
	}
	if b, err := os.ReadFile(k + ext); err == nil && len(b) > 0 {
		lg, _ := os.ReadFile(k + ".log")
		return &Compiled{Binary: b, PTX: o.PTX, Log: string(lg), Options: o.flags(), NVRTC: n.Version(), Cached: true}, nil
	}
	comp, err := n.Compile(name, src, headers, o)
	if err != nil {
		return comp, err
	}
	if os.MkdirAll(filepath.Dir(k), 0o755) == nil {
		// The log first: an entry's binary present means its log is too.
		if writeAtomic(k+".log", []byte(comp.Log)) == nil {
			_ = writeAtomic(k+ext, comp.Binary)
		}
	}
	return comp, nil
}

func writeAtomic(path string, b []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), ".tmp-*")
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
	}
	return err
}
