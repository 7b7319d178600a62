// Package vexcheck checks the compiled code of archsimd kernels for legacy-SSE instructions run
// while the vector registers' upper halves are dirty. Go compiles scalar float code (and some
// moves into X registers, such as a shift count) to legacy SSE, and on some Intel CPUs each such
// instruction after a 256- or 512-bit operation without a VZEROUPPER costs about 100 ns: a kernel
// that does it runs slower than plain Go (measured: the Q8_0 widening into bf16 pairs 12× slower
// than its scalar reference on a Xeon with AVX-512; the same code was 4× faster on AMD EPYC).
// The check reads the compiler's -S output, so it holds on every amd64 machine whatever its CPU.
package vexcheck

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// Check fails t for each legacy-SSE instruction that a path from a Y or Z register
// reaches before a VZEROUPPER in the compiled code of the functions of pkg named, and for each
// call (bar a panic) and return reached that way: the callee or the caller may run scalar
// float code next.
func Check(t testing.TB, pkg string, funcs ...string) {
	t.Helper()
	out := packageAsm(t, pkg)
	for _, k := range funcs {
		insns := kernelAsm(out, pkg+"."+k)
		if len(insns) == 0 {
			t.Errorf("%s: no code in the -S output (inlined? then check its caller)", k)
			continue
		}
		for _, bad := range sseWhileDirty(insns) {
			t.Errorf("%s: legacy SSE at %s: %s", k, bad.loc, bad.text)
		}
		for _, bad := range leavesDirty(insns) {
			t.Errorf("%s: upper halves dirty at %s: %s", k, bad.loc, bad.text)
		}
	}
}

// Covered fails t for each function of pkg that uses a Y or Z register (VectorFuncs) and is
// neither in checked nor in exempt (helpers that take or return vectors, inlined into the
// kernels that are checked): a kernel added later is then checked, or named, not forgotten.
func Covered(t testing.TB, pkg string, checked, exempt []string) {
	t.Helper()
	for _, f := range VectorFuncs(t, pkg) {
		if !slices.Contains(checked, f) && !slices.Contains(exempt, f) {
			t.Errorf("%s uses vector registers and is not checked by vexcheck.Check: add it to the checked list, or to the exempt list if it only passes vectors to and from an inlined caller", f)
		}
	}
}

// VectorFuncs returns the functions of pkg whose compiled code uses a Y or Z register, by name
// within the package (closures and generic instances included), so that a test can require each
// to be checked or named as exempt: a new kernel is then checked without anyone remembering to.
func VectorFuncs(t testing.TB, pkg string) []string {
	t.Helper()
	var names []string
	sc := bufio.NewScanner(bytes.NewReader(packageAsm(t, pkg)))
	sc.Buffer(nil, 1<<20)
	name, uses := "", false
	flush := func() {
		if name != "" && uses {
			names = append(names, name)
		}
	}
	for sc.Scan() {
		line := sc.Text()
		if line != "" && line[0] != '\t' && line[0] != ' ' {
			flush()
			name, uses = "", false
			if f := strings.Fields(line); len(f) > 1 && f[1] == "STEXT" && strings.HasPrefix(f[0], pkg+".") {
				name = strings.TrimPrefix(f[0], pkg+".")
			}
			continue
		}
		if m := asmLine.FindStringSubmatch(line); name != "" && m != nil && vecReg.MatchString(m[3]) {
			uses = true
		}
	}
	flush()
	slices.Sort(names)
	return slices.Compact(names)
}

type compiled struct {
	once sync.Once
	out  []byte
	err  error
	why  string // set when there is no go tool to compile with
}

var (
	compiledMu sync.Mutex
	byPackage  = map[string]*compiled{}
)

// packageAsm returns the compiler's -S output for pkg, the package in the test's working
// directory, compiled once per test binary.
func packageAsm(t testing.TB, pkg string) []byte {
	t.Helper()
	compiledMu.Lock()
	a := byPackage[pkg]
	if a == nil {
		a = &compiled{}
		byPackage[pkg] = a
	}
	compiledMu.Unlock()
	a.once.Do(func() {
		goTool := filepath.Join(runtime.GOROOT(), "bin", "go")
		if _, err := os.Stat(goTool); err != nil {
			a.why = fmt.Sprintf("no go tool to compile with: %v", err)
			return
		}
		cmd := exec.Command(goTool, "build", "-gcflags="+pkg+"=-S", "-o", os.DevNull, ".")
		cmd.Env = append(os.Environ(), "GOEXPERIMENT=simd")
		a.out, a.err = cmd.CombinedOutput()
	})
	if a.why != "" {
		t.Skip(a.why)
	}
	if a.err != nil {
		t.Fatalf("go build -S: %v\n%.2000s", a.err, a.out)
	}
	return a.out
}

type asmInsn struct {
	offset    int
	loc, text string
}

var asmLine = regexp.MustCompile(`^\s+0x[0-9a-f]+ (\d+) \(([^)]*)\)\s+(\S+.*)$`)

// kernelAsm returns the instructions of fn from the compiler's -S output.
func kernelAsm(out []byte, fn string) []asmInsn {
	var insns []asmInsn
	in := false
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line != "" && line[0] != '\t' && line[0] != ' ' {
			in = strings.HasPrefix(line, fn+" STEXT")
			continue
		}
		m := asmLine.FindStringSubmatch(line)
		if !in || m == nil {
			continue
		}
		op := strings.Fields(m[3])[0]
		if op == "PCDATA" || op == "FUNCDATA" || op == "NOP" || op == "XCHGL" {
			continue
		}
		off, _ := strconv.Atoi(m[1])
		insns = append(insns, asmInsn{off, filepath.Base(m[2]), m[3]})
	}
	return insns
}

var (
	vecReg  = regexp.MustCompile(`\b[YZ]\d+\b`)
	xmmReg  = regexp.MustCompile(`\bX\d+\b`)
	jumpArg = regexp.MustCompile(`^J\w+\s+(\d+)$`)
)

// sseWhileDirty returns the legacy-SSE instructions some path reaches with dirty upper halves.
func sseWhileDirty(insns []asmInsn) []asmInsn {
	dirtyIn := dirtyBefore(insns)
	var bad []asmInsn
	for i, in := range insns {
		if dirtyIn[i] && !strings.HasPrefix(in.text, "V") && xmmReg.MatchString(in.text) {
			bad = append(bad, in)
		}
	}
	return slices.Clip(bad)
}

// leavesDirty returns the calls (other than to a panic) and returns that some path reaches
// with dirty upper halves, or that leave them dirty by using a Y or Z register themselves.
func leavesDirty(insns []asmInsn) []asmInsn {
	dirtyIn := dirtyBefore(insns)
	var bad []asmInsn
	for i, in := range insns {
		op := strings.Fields(in.text)[0]
		// A panic ends the path; morestack runs on the stack-growth path of a function whose
		// vector arguments arrive in registers, and returns to its start.
		exits := op == "RET" || (op == "CALL" && !strings.Contains(in.text, "panic") && !strings.Contains(in.text, "morestack"))
		if exits && (dirtyIn[i] || vecReg.MatchString(in.text)) {
			bad = append(bad, in)
		}
	}
	return slices.Clip(bad)
}

// dirtyBefore reports, for each instruction, whether some path reaches it with dirty upper
// halves: a forward dataflow over the fallthroughs and jumps (a panic call ends its path).
func dirtyBefore(insns []asmInsn) []bool {
	at := map[int]int{}
	for i, in := range insns {
		at[in.offset] = i
	}
	dirtyIn := make([]bool, len(insns))
	for changed := true; changed; {
		changed = false
		for i, in := range insns {
			op := strings.Fields(in.text)[0]
			dirty := dirtyIn[i]
			switch {
			case op == "VZEROUPPER":
				dirty = false
			case vecReg.MatchString(in.text):
				dirty = true
			}
			if !dirty {
				continue
			}
			var next []int
			if op != "JMP" && op != "RET" && !(op == "CALL" && strings.Contains(in.text, "panic")) && i+1 < len(insns) {
				next = append(next, i+1)
			}
			if m := jumpArg.FindStringSubmatch(in.text); m != nil {
				off, _ := strconv.Atoi(m[1])
				if j, ok := at[off]; ok {
					next = append(next, j)
				}
			}
			for _, j := range next {
				if !dirtyIn[j] {
					dirtyIn[j], changed = true, true
				}
			}
		}
	}
	return dirtyIn
}
