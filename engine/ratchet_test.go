package engine

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The engine-seam ratchet: the model code (engine/*.go, tests aside) moves toward reading as the
// math over ops of a backend, so the ways it touches CPU memory and CPU kernels may only fall.
// Each ceiling is today's count; when a change lowers a count, lower its ceiling in the same
// commit (the test says so). The target of each is 0 (engine/internal/backend, design notes).
var seamCeilings = []struct {
	name    string
	pattern string
	ceiling int
}{
	// Reads and writes of a tensor's memory.
	{"tensor memory (.V, .Buf)", `\.(V|Buf)\b`, 0},
	// Calls into the CPU kernels.
	{"CPU kernel calls (kernels.)", `\bkernels\.`, 0},
	// Element-type assertions that pick a float32 kernel from generic code.
	{"float32 assertions", `\.\(\[\]float32\)`, 0},
	// Questions about the CPU a kernel runs on.
	{"CPU checks", `\bkernels\.(Have\w*|FewRow\w*|Active|Supported\w*|Best)\(`, 0},
	// Per-element loops fanned out over the cores from the model code.
	{"ParallelRows fan-outs", `\bParallelRows\b`, 0},
	// Imports of the CPU's own packages.
	{"CPU package imports", `"github.com/skein-ai/skein/engine/internal/(kernels|quant|cpu|tensor)"`, 5},
}

func TestSeamRatchet(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var src strings.Builder
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		src.Write(b)
		src.WriteByte('\n')
	}
	for _, c := range seamCeilings {
		n := len(regexp.MustCompile(c.pattern).FindAllStringIndex(src.String(), -1))
		switch {
		case n > c.ceiling:
			t.Errorf("%s: %d in engine/*.go, the ceiling is %d: model code goes through the backend (engine/internal/backend), not around it", c.name, n, c.ceiling)
		case n < c.ceiling:
			t.Errorf("%s: %d in engine/*.go, below its ceiling %d: lower the ceiling in seamCeilings to %d", c.name, n, c.ceiling, n)
		default:
			t.Logf("%s: %d", c.name, n)
		}
	}
}
