package kernels

import (
	"fmt"
	"strings"

	"github.com/skein-ai/skein/engine/internal/cpu"
)

// Path is one instruction set the kernels run on. Every path has a table of row kernels (exp,
// sigmoid, max, dot, axpy and the fused RMSNorm/softmax/SiLU rows) and, from AVX2 on, a float32
// GEMM; the bf16 paths also multiply bf16 weights without widening them. The best path the CPU
// has is chosen at init; Use switches (tests, benchmarks, SKEIN_GEMM) and returns its undo.
type Path uint8

const (
	Scalar     Path = iota // plain Go; float32 products go to the engine's backend matmul
	AVX2                   // AVX2 + FMA: 8-lane rows, 6×16 GEMM
	AVX512                 // AVX-512F: 16-lane rows, 12×32 zmm GEMM
	AVX512BF16             // AVX512_BF16: AVX512 plus VDPBF16PS products over bf16 weights
	AMX                    // AMX-BF16: AVX512 plus tile products over bf16 weights
	numPaths
)

// Paths lists every path, slowest first.
var Paths = [...]Path{Scalar, AVX2, AVX512, AVX512BF16, AMX}

var pathNames = [numPaths]string{"scalar", "avx2", "avx512", "avx512bf16", "amx"}

func (p Path) String() string {
	if p < numPaths {
		return pathNames[p]
	}
	return "unknown"
}

// ParsePath reads a path's name as String writes it.
func ParsePath(name string) (Path, error) {
	for p, n := range pathNames {
		if strings.EqualFold(name, n) {
			return Path(p), nil
		}
	}
	return 0, fmt.Errorf("unknown kernel path %q (want one of %s)", name, strings.Join(pathNames[:], ", "))
}

// Supported reports whether this CPU, and this build, can run p.
func Supported(p Path) bool {
	if p != Scalar && !vectorBuild {
		return false
	}
	switch p {
	case Scalar:
		return true
	case AVX2:
		return cpu.X86.AVX2
	case AVX512:
		return cpu.X86.AVX512
	case AVX512BF16:
		return cpu.X86.AVX512BF16
	case AMX:
		return cpu.X86.AMXBF16 && amxBuilt
	}
	return false
}

// SupportedPaths lists the paths this CPU has, slowest first.
func SupportedPaths() []Path {
	var out []Path
	for _, p := range Paths {
		if Supported(p) {
			out = append(out, p)
		}
	}
	return out
}

// Best is the fastest path this CPU supports, AMX included where the CPU has AMX-BF16 and Linux
// granted the tile state (else it is not supported, and the next path is best). The start-up
// check then runs each path's kernels against their Go models and falls back, logged, from a
// path that disagrees. On the AMX path products of few rows still take AVX512_BF16's kernel
// (bf16KernelFor); its AMX kernel passed its tests on a real Xeon (issue 36).
func Best() Path {
	best := Scalar
	for _, p := range Paths {
		if Supported(p) {
			best = p
		}
	}
	return best
}

// active is the path in use; rows is its row-kernel table. Both change only through Use.
var (
	active = Scalar
	rows   = &scalarRows
)

// Active is the path in use.
func Active() Path { return active }

// Use switches every kernel to path p and returns the undo, or an error (changing nothing) where
// the CPU lacks p. Not safe while kernels run: start-up, tests and benchmarks call it.
func Use(p Path) (undo func(), err error) {
	if !Supported(p) {
		return nil, fmt.Errorf("kernel path %s: CPU lacks it (this CPU has %v)", p, SupportedPaths())
	}
	old := active
	use(p)
	return func() { use(old) }, nil
}

func use(p Path) {
	active = p
	rows = rowTables[rowPath(p)]
}

// rowPath is the path whose row kernels p runs: the bf16 paths add products, not rows.
func rowPath(p Path) Path { return min(p, AVX512) }

// rowTable is one path's float32 row kernels. Each entry's doc is its scalar loop (rows_scalar.go).
type rowTable struct {
	max            func(v []float32) float32
	dot            func(a, b []float32) float64
	dot3           func(a, b, c []float32) float64
	axpby          func(dst, x []float32, alpha float32)
	axpy           func(dst, x []float32, alpha float32)
	mulScaled      func(dst, a, b []float32, s float32)
	rmsBack        func(dx, dy, w, x []float32, inv, c float32, accumulate bool)
	softmaxBackRow func(p, dr []float32, d, scale float32)
	siluGate       func(g, u, sig, out []float32)
	siluGateBack   func(da, g, u, sig, dg, du []float32)
	expScaledShift func(v []float32, scale, shift float32) float64
	sigmoid        func(dst, src []float32)
	roundBF16      func(dst []uint16, src []float32) // dst[i] = BF16Of(src[i])
}

// rowTables holds each row path's table; the vector files fill in theirs at init.
var rowTables = [AVX512 + 1]*rowTable{Scalar: &scalarRows, AVX2: &scalarRows, AVX512: &scalarRows}

var scalarRows = rowTable{
	max: maxScalar[float32], dot: dotScalar[float32], dot3: dot3Scalar[float32],
	axpby: axpbyScalar[float32], axpy: axpyScalar[float32], mulScaled: mulScaledScalar[float32],
	rmsBack: rmsBackScalar[float32], softmaxBackRow: softmaxBackRowScalar[float32],
	siluGate: siluGateScalar[float32], siluGateBack: siluGateBackScalar[float32],
	expScaledShift: expScaledShiftScalar, sigmoid: sigmoidScalar, roundBF16: roundBF16Scalar,
}
