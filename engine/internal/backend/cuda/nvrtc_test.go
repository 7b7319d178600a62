package cuda

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// RegisterBudget is the most registers a thread any kernel here may use: 64 lets a block of
// 1,024 threads (the row kernels' largest) launch on sm_80 and sm_90 (65,536 registers an SM)
// and keeps at least half the SM's threads resident. No kernel may spill.
const RegisterBudget = 64

// testArchs are the GPUs the kernels are compile-checked for: A100 (sm_80) and H100/H200 (sm_90).
var testArchs = []int{80, 90}

func nvrtcOrSkip(t *testing.T) *NVRTC {
	t.Helper()
	n, err := LoadNVRTC()
	if err != nil {
		t.Skipf("skipped: no NVRTC on this machine (scripts/cuda-ci-libs.sh installs Debian's, and prints the folder for SKEIN_CUDA_LIBS): %v", err)
	}
	return n
}

// TestKernelsCompile compiles every kernel file for sm_80 and sm_90 with ptxas's report, logs
// each kernel's registers, spills, stack and shared memory, and fails on a spill or more than
// RegisterBudget registers.
func TestKernelsCompile(t *testing.T) {
	n := nvrtcOrSkip(t)
	t.Logf("NVRTC %s at %s; archs %v; register budget %d, spills 0", n.Version(), n.Path, n.Archs(), RegisterBudget)
	srcs := Sources()
	if len(srcs) == 0 {
		t.Fatal("no kernel sources embedded")
	}
	for _, arch := range testArchs {
		for _, s := range srcs {
			c, err := n.Compile(s.Name, s.Text, Headers(), CompileOptions{Arch: arch, Verbose: true})
			if err != nil {
				t.Errorf("sm_%d %s: %v", arch, s.Name, err)
				continue
			}
			if !bytes.HasPrefix(c.Binary, []byte("\x7fELF")) {
				t.Errorf("sm_%d %s: the cubin is no ELF file (%d bytes)", arch, s.Name, len(c.Binary))
			}
			if strings.Contains(c.Log, "warning") {
				t.Errorf("sm_%d %s: compiler warnings:\n%s", arch, s.Name, c.Log)
			}
			res := ParsePtxasLog(c.Log)
			got := map[string]Resources{}
			for _, r := range res {
				got[r.Kernel] = r
			}
			for _, e := range s.Entries() {
				r, ok := got[e]
				if !ok {
					t.Errorf("sm_%d %s: no ptxas report for kernel %s; log:\n%s", arch, s.Name, e, c.Log)
					continue
				}
				if r.Arch != fmt.Sprintf("sm_%d", arch) {
					t.Errorf("%s: compiled for %s, want sm_%d", e, r.Arch, arch)
				}
				t.Logf("%-10s %v", s.Name, r)
				if r.SpillStores > 0 || r.SpillLoads > 0 {
					t.Errorf("%s sm_%d spills: %v", e, arch, r)
				}
				if r.Registers > RegisterBudget {
					t.Errorf("%s sm_%d uses %d registers, over the budget of %d", e, arch, r.Registers, RegisterBudget)
				}
				if r.Registers == 0 {
					t.Errorf("%s sm_%d: no register count read from the log:\n%s", e, arch, c.Log)
				}
			}
			if len(res) != len(s.Entries()) {
				t.Errorf("sm_%d %s: ptxas reports %d kernels, the source has %d (%v)", arch, s.Name, len(res), len(s.Entries()), s.Entries())
			}
		}
	}
}

// TestCompilePTX: compute_90 PTX for one file, with its kernels' entries.
func TestCompilePTX(t *testing.T) {
	n := nvrtcOrSkip(t)
	s := Sources()[0]
	c, err := n.Compile(s.Name, s.Text, Headers(), CompileOptions{Arch: 90, PTX: true, Verbose: true})
	if err != nil {
		t.Fatal(err)
	}
	ptx := string(c.Binary)
	if !strings.Contains(ptx, ".target sm_90") {
		t.Errorf("PTX lacks .target sm_90:\n%.400s", ptx)
	}
	for _, e := range s.Entries() {
		if !strings.Contains(ptx, ".entry "+e) {
			t.Errorf("PTX lacks .entry %s", e)
		}
	}
	if strings.Contains(strings.Join(c.Options, " "), "ptxas") {
		t.Errorf("PTX compiled with ptxas options: %v", c.Options)
	}
}

// TestCompileError: a source that does not compile is an error carrying the compiler's log.
func TestCompileError(t *testing.T) {
	n := nvrtcOrSkip(t)
	_, err := n.Compile("broken.cu", `extern "C" __global__ void k(float* x) { x[0] = undeclared; }`, nil, CompileOptions{Arch: 80})
	if err == nil {
		t.Fatal("a broken source compiled")
	}
	if !strings.Contains(err.Error(), "undeclared") || !strings.Contains(err.Error(), "broken.cu") {
		t.Errorf("the error lacks the log: %v", err)
	}
	if _, err := n.Compile("x.cu", `extern "C" __global__ void k() {}`, nil, CompileOptions{Arch: 1}); err == nil {
		t.Error("compiled for sm_1")
	}
}

// TestCache: a second compile of the same file and options is read from the cache (same
// cubin, same log); another architecture is another entry; the entries live under
// nvrtc-<version>/sm_<arch>.
func TestCache(t *testing.T) {
	n := nvrtcOrSkip(t)
	c := &Cache{Dir: t.TempDir()}
	s := Sources()[0]
	o := CompileOptions{Arch: 80, Verbose: true}
	first, err := CompileSource(n, c, s, o)
	if err != nil {
		t.Fatal(err)
	}
	if first.Cached {
		t.Fatal("first compile came from an empty cache")
	}
	again, err := CompileSource(n, c, s, o)
	if err != nil {
		t.Fatal(err)
	}
	if !again.Cached || !bytes.Equal(again.Binary, first.Binary) || again.Log != first.Log {
		t.Errorf("second compile: cached %v, same cubin %v, same log %v", again.Cached, bytes.Equal(again.Binary, first.Binary), again.Log == first.Log)
	}
	other, err := CompileSource(n, c, s, CompileOptions{Arch: 90, Verbose: true})
	if err != nil {
		t.Fatal(err)
	}
	if other.Cached {
		t.Error("sm_90 read sm_80's entry")
	}
	for _, arch := range []string{"sm_80", "sm_90"} {
		m, _ := filepath.Glob(filepath.Join(c.Dir, "nvrtc-"+n.Version(), arch, strings.TrimSuffix(s.Name, ".cu")+"-*.cubin"))
		if len(m) != 1 {
			t.Errorf("%s: %d cache entries, want 1", arch, len(m))
		}
	}
	// Another source text is another entry.
	changed := s
	changed.Text += "\n// changed\n"
	ch, err := CompileSource(n, c, changed, o)
	if err != nil {
		t.Fatal(err)
	}
	if ch.Cached {
		t.Error("a changed source hit the cache")
	}
	if d := DefaultCache(); d != nil {
		t.Logf("default cache: %s", d.Dir)
		if os.Getenv("SKEIN_CUDA_CACHE") == "" && !strings.HasSuffix(d.Dir, filepath.Join("skein", "cuda-kernels")) {
			t.Errorf("default cache %s", d.Dir)
		}
	}
}

// TestParsePtxasLog reads a report as NVRTC 11.8 writes it (no NVRTC needed).
func TestParsePtxasLog(t *testing.T) {
	log := `ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'b' for 'sm_90'
ptxas info    : Function properties for b
ptxas         .     8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 32 registers, 256 bytes smem
ptxas info    : Compiling entry function 'a' for 'sm_90'
ptxas info    : Function properties for a
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 45 registers, 380 bytes cmem[0]`
	got := ParsePtxasLog(log)
	want := []Resources{
		{Kernel: "b", Arch: "sm_90", Registers: 32, SpillStores: 4, SpillLoads: 12, StackFrame: 8, SharedMem: 256},
		{Kernel: "a", Arch: "sm_90", Registers: 45},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("ParsePtxasLog:\n%v\nwant\n%v", got, want)
	}
}

// TestSourcesEntries: every file has kernels, and every op the brief needs has one.
func TestSourcesEntries(t *testing.T) {
	all := map[string]bool{}
	for _, s := range Sources() {
		if len(s.Entries()) == 0 {
			t.Errorf("%s has no kernels", s.Name)
		}
		if strings.Contains(s.Text, "#include <") {
			t.Errorf("%s includes a system header (NVRTC 11.8 has none)", s.Name)
		}
		for _, e := range s.Entries() {
			if all[e] {
				t.Errorf("kernel %s defined twice", e)
			}
			all[e] = true
		}
	}
	for _, k := range []string{"rmsnorm_fwd", "rmsnorm_bwd", "silu_gate_fwd", "silu_gate_bwd", "add_f32", "softmax_causal", "adamw_step", "target_logprobs", "logits_grad"} {
		if !all[k] {
			t.Errorf("no kernel %s", k)
		}
	}
}

// TestCompileAgainReports: the same file compiled twice in one process still carries ptxas's
// report (NVRTC 12.9+ answers a repeated compile from memory, without one).
func TestCompileAgainReports(t *testing.T) {
	n := nvrtcOrSkip(t)
	s := Sources()[0]
	for i := range 2 {
		c, err := n.Compile(s.Name, s.Text, Headers(), CompileOptions{Arch: 80, Verbose: true})
		if err != nil {
			t.Fatal(err)
		}
		if got := len(ParsePtxasLog(c.Log)); got != len(s.Entries()) {
			t.Errorf("compile %d: %d kernels reported, want %d; options %v; log:\n%s", i+1, got, len(s.Entries()), c.Options, c.Log)
		}
	}
}
