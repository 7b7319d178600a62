//go:build goexperiment.simd && amd64

package kernels

import (
	"testing"

	"github.com/skein-ai/skein/engine/internal/vexcheck"
)

const kernelsPkg = "github.com/skein-ai/skein/engine/internal/kernels"

// The compiled 8-lane kernels run no legacy-SSE instruction (an X register without the V
// prefix: Go's scalar float code) on any path from a use of a Y register to a VZEROUPPER (see
// the note above load8 on what one costs here). It compiles the package with -S (cached after
// the first run) and follows each kernel's jumps; -short skips it.
func TestAVX2KernelsStayVEX(t *testing.T) {
	if testing.Short() {
		t.Skip("compiles the package again")
	}
	vexcheck.Check(t, kernelsPkg, rowKernels8...)
}

var rowKernels8 = []string{"expScaledShift8", "sigmoid8", "max8", "dot8", "dot3_8", "axpby8", "axpy8",
	"mulScaled8", "rmsBack8", "softmaxBackRow8", "siluGate8", "siluGateBack8", "lanesSum8"}

// The other archsimd code holds to the same rules: the direct bf16 products and their tiles
// (bf16_avx2_amd64.go, f32_avx2_amd64_gen.go), the bf16 widening and the 16-lane kernels of rows_avx512_amd64.go (compiled
// on every amd64 machine, so checked here even where the CPU cannot run them).
func TestArchsimdKernelsStayVEX(t *testing.T) {
	if testing.Short() {
		t.Skip("compiles the package again")
	}
	vexcheck.Check(t, kernelsPkg, otherKernels...)
}

var otherKernels = []string{"bf16NN", "nn4x16", "nn1x64", "nn1x16", "nn1x8", "bf16NT", "nt2x4", "nt1x8",
	"dotBF16", "widenBF16To32", "bfLanes8",
	"f32NN", "nn4x16f", "nn1x64f", "nn1x16f", "nn1x8f", "f32NT", "nt2x4f", "nt1x8f", "dotF32",
	"expScaledShift16", "sigmoid16", "max16", "dot16", "dot3_16", "axpby16", "axpy16",
	"mulScaled16", "rmsBack16", "softmaxBackRow16", "siluGate16", "siluGateBack16", "roundBF16x16", "lanesSum"}

// Every function of the package whose code uses a Y or Z register is in one of the lists above,
// or is a helper that only passes vectors to and from the kernels it is inlined into.
func TestEveryVectorFunctionIsChecked(t *testing.T) {
	if testing.Short() {
		t.Skip("compiles the package again")
	}
	vexcheck.Covered(t, kernelsPkg, append(rowKernels8, otherKernels...), []string{
		"bcast", "bcast8", "bcastBits", "bfBcast8", "bfHsum4", "bfLoad8", "bfLoadAt8", "bfStore8",
		"bfWide8", "bfWiden8", "bfZero8", "exp16", "exp8", "last8", "load", "load8", "newLanes8"})
}
