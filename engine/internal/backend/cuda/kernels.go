package cuda

import (
	"embed"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// The kernels' CUDA C sources: one .cu file per group of ops, all including common.cuh (handed
// to NVRTC from memory: the sources need no CUDA headers, which NVRTC 11.8 does not ship).
//
//go:embed kernels/*.cu kernels/*.cuh
var kernelFS embed.FS

// Source is one kernel file.
type Source struct {
	Name string // "rmsnorm.cu"
	Text string
}

// Sources is every kernel file, by name.
func Sources() []Source {
	names, _ := fs.Glob(kernelFS, "kernels/*.cu")
	sort.Strings(names)
	out := make([]Source, 0, len(names))
	for _, n := range names {
		b, _ := kernelFS.ReadFile(n)
		out = append(out, Source{path.Base(n), string(b)})
	}
	return out
}

// Headers is what the kernel files may #include.
func Headers() []Header {
	names, _ := fs.Glob(kernelFS, "kernels/*.cuh")
	sort.Strings(names)
	var out []Header
	for _, n := range names {
		b, _ := kernelFS.ReadFile(n)
		out = append(out, Header{path.Base(n), string(b)})
	}
	return out
}

var entryRE = regexp.MustCompile(`extern\s+"C"\s+__global__\s+void\s+(\w+)\s*\(`)

// Entries is the names of a source's kernels (its extern "C" __global__ functions), in order.
func (s Source) Entries() []string {
	var out []string
	for _, m := range entryRE.FindAllStringSubmatch(s.Text, -1) {
		out = append(out, m[1])
	}
	return out
}

// CompileSource compiles one kernel file for o (through cache when not nil).
func CompileSource(n *NVRTC, cache *Cache, s Source, o CompileOptions) (*Compiled, error) {
	if cache != nil {
		return cache.Compile(n, s.Name, s.Text, Headers(), o)
	}
	return n.Compile(s.Name, s.Text, Headers(), o)
}

// Resources is ptxas's report of one kernel for one architecture.
type Resources struct {
	Kernel      string
	Arch        string // "sm_90"
	Registers   int
	SpillStores int // bytes
	SpillLoads  int // bytes
	StackFrame  int // bytes
	SharedMem   int // bytes of static shared memory
}

func (r Resources) String() string {
	return fmt.Sprintf("%s %s: %d registers, %d B spill stores, %d B spill loads, %d B stack, %d B smem",
		r.Kernel, r.Arch, r.Registers, r.SpillStores, r.SpillLoads, r.StackFrame, r.SharedMem)
}

var (
	ptxasEntryRE = regexp.MustCompile(`Compiling entry function '([^']+)' for '(\w+)'`)
	ptxasPropsRE = regexp.MustCompile(`Function properties for (\S+)`)
	ptxasFrameRE = regexp.MustCompile(`(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads`)
	ptxasUsedRE  = regexp.MustCompile(`Used (\d+) registers`)
	ptxasSmemRE  = regexp.MustCompile(`(\d+) bytes smem`)
)

// ParsePtxasLog reads ptxas's -v report (NVRTC's log with --ptxas-options=-v): one Resources a
// kernel compiled, in the log's order.
func ParsePtxasLog(log string) []Resources {
	var out []Resources
	idx := map[string]int{}
	cur := -1
	get := func(kernel, arch string) int {
		if i, ok := idx[kernel]; ok {
			if arch != "" {
				out[i].Arch = arch
			}
			return i
		}
		idx[kernel] = len(out)
		out = append(out, Resources{Kernel: kernel, Arch: arch})
		return len(out) - 1
	}
	atoi := func(s string) int { v, _ := strconv.Atoi(s); return v }
	for _, line := range strings.Split(log, "\n") {
		if m := ptxasEntryRE.FindStringSubmatch(line); m != nil {
			cur = get(m[1], m[2])
			continue
		}
		if m := ptxasPropsRE.FindStringSubmatch(line); m != nil {
			cur = get(m[1], "")
			continue
		}
		if cur < 0 {
			continue
		}
		if m := ptxasFrameRE.FindStringSubmatch(line); m != nil {
			out[cur].StackFrame, out[cur].SpillStores, out[cur].SpillLoads = atoi(m[1]), atoi(m[2]), atoi(m[3])
		}
		if m := ptxasUsedRE.FindStringSubmatch(line); m != nil {
			out[cur].Registers = atoi(m[1])
			if s := ptxasSmemRE.FindStringSubmatch(line); s != nil {
				out[cur].SharedMem = atoi(s[1])
			}
		}
	}
	return out
}
