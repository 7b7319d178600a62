//go:build goexperiment.simd && amd64

package engine

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
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
	goTool := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(goTool); err != nil {
		t.Skipf("no go tool to compile with: %v", err)
	}
	const pkg = "github.com/skein-ai/skein/engine"
	cmd := exec.Command(goTool, "build", "-gcflags="+pkg+"=-S", "-o", os.DevNull, ".")
	cmd.Env = append(os.Environ(), "GOEXPERIMENT=simd")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go build -S: %v\n%.2000s", err, out)
	}
	kernels := []string{"expScaledShift8", "sigmoid8", "max8", "dot8", "dot3_8", "axpby8", "axpy8",
		"mulScaled8", "rmsBack8", "softmaxBackRow8", "siluGate8", "siluGateBack8"}
	for _, k := range kernels {
		insns := kernelAsm(out, pkg+"."+k)
		if len(insns) == 0 {
			t.Errorf("%s: no code in the -S output (inlined? then check its caller)", k)
			continue
		}
		for _, bad := range sseWhileDirty(insns) {
			t.Errorf("%s: legacy SSE at %s: %s", k, bad.loc, bad.text)
		}
	}
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

// sseWhileDirty returns the legacy-SSE instructions some path reaches with dirty upper halves:
// a forward dataflow over the fallthroughs and jumps (a panic call ends its path).
func sseWhileDirty(insns []asmInsn) []asmInsn {
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
	var bad []asmInsn
	for i, in := range insns {
		if dirtyIn[i] && !strings.HasPrefix(in.text, "V") && xmmReg.MatchString(in.text) {
			bad = append(bad, in)
		}
	}
	return slices.Clip(bad)
}
