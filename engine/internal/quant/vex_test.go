//go:build goexperiment.simd && amd64

package quant

import (
	"testing"

	"github.com/skein-ai/skein/engine/internal/vexcheck"
)

// The AVX2 block kernels run no legacy-SSE instruction between a use of a Y register and a
// VZEROUPPER, and call and return only with clean upper halves (vexcheck's package note: on a
// Xeon with AVX-512 these kernels ran 2.4–12× slower than their plain-Go references until they
// did). The shift counts, the f16 scales and the lanes' sums were the culprits. -short skips it.
func TestBlockKernelsStayVEX(t *testing.T) {
	if testing.Short() {
		t.Skip("compiles the package again")
	}
	vexcheck.Check(t, quantPkg, blockKernels...)
}

const quantPkg = "github.com/skein-ai/skein/engine/internal/quant"

var blockKernels = []string{"q8OutputsRows", "q8BlockPairs", "dotQ8_0", "q4KScaledLanesSIMD", "q6KLanesSIMD", "dotQ4_KSIMD", "fmaHW", "q4KBlockFloats", "q4KBlockPairs", "q6KBlockFloats", "q6KBlockPairs", "superBlockPairs"}

// Every function of the package whose code uses a Y or Z register is checked, or only passes
// vectors to and from a kernel it is inlined into.
func TestEveryBlockKernelIsChecked(t *testing.T) {
	if testing.Short() {
		t.Skip("compiles the package again")
	}
	vexcheck.Covered(t, quantPkg, blockKernels, []string{"f16x8", "highNibbles", "hsumRows", "q6KLanesSIMD.func1", "q6KLanesSIMD.func2"})
}
