//go:build goexperiment.simd && amd64

package kernels

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

// The compiled 8-lane kernels run no legacy-SSE instruction (an X register without the V
// prefix: Go's scalar float code) on any path from a use of a Y register to a VZEROUPPER (see
// the note above load8 on what one costs here). It compiles the package with -S (cached after
// the first run) and follows each kernel's jumps; -short skips it.
func TestAVX2KernelsStayVEX(t *testing.T) {
	if testing.Short() {
		t.Skip("compiles the package again")
	}
	checkStayVEX(t, "expScaledShift8", "sigmoid8", "max8", "dot8", "dot3_8", "axpby8", "axpy8",
		"mulScaled8", "rmsBack8", "softmaxBackRow8", "siluGate8", "siluGateBack8")
}

// The other archsimd code holds to the same rules: the direct bf16 products and their tiles
// (bf16_avx2_amd64.go, f32_avx2_amd64_gen.go), the bf16 widening and the 16-lane kernels of rows_avx512_amd64.go (compiled
// on every amd64 machine, so checked here even where the CPU cannot run them).
func TestArchsimdKernelsStayVEX(t *testing.T) {
	if testing.Short() {
		t.Skip("compiles the package again")
	}
	checkStayVEX(t, "bf16NN", "nn4x16", "nn1x64", "nn1x16", "nn1x8", "bf16NT", "nt2x4", "nt1x8",
		"dotBF16", "widenBF16To32",
		"f32NN", "nn4x16f", "nn1x64f", "nn1x16f", "nn1x8f", "f32NT", "nt2x4f", "nt1x8f", "dotF32",
		"expScaledShift16", "sigmoid16", "max16", "dot16", "dot3_16", "axpby16", "axpy16",
		"mulScaled16", "rmsBack16", "softmaxBackRow16", "siluGate16", "siluGateBack16", "roundBF16x16")
}

// checkStayVEX fails t for each legacy-SSE instruction that a path from a Y or Z register
// reaches before a VZEROUPPER in the compiled code of the engine functions named, and for each
// call (bar a panic) and return reached that way: the callee or the caller may run scalar
// float code next.
func checkStayVEX(t *testing.T, funcs ...string) {
	t.Helper()
	out := engineAsm(t)
	for _, k := range funcs {
		insns := kernelAsm(out, enginePkg+"."+k)
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

const enginePkg = "github.com/skein-ai/skein/engine/internal/kernels"

var engineAsmOnce struct {
	sync.Once
	out []byte
	err error
	why string // set when there is no go tool to compile with
}

// engineAsm returns the compiler's -S output for the engine package, compiled once per test
// binary.
func engineAsm(t *testing.T) []byte {
	t.Helper()
	a := &engineAsmOnce
	a.Do(func() {
		goTool := filepath.Join(runtime.GOROOT(), "bin", "go")
		if _, err := os.Stat(goTool); err != nil {
			a.why = fmt.Sprintf("no go tool to compile with: %v", err)
			return
		}
		cmd := exec.Command(goTool, "build", "-gcflags="+enginePkg+"=-S", "-o", os.DevNull, ".")
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
		exits := op == "RET" || (op == "CALL" && !strings.Contains(in.text, "panic"))
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
