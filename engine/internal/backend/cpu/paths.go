package cpu

import (
	"github.com/skein-ai/skein/engine/internal/backend"
	"github.com/skein-ai/skein/engine/internal/kernels"
	"github.com/skein-ai/skein/engine/internal/quant"
)

// The kernel paths, as the binary sees them: which instruction set the kernels run on, which this
// CPU has, and the switch behind SKEIN_GEMM. The choice itself lives in internal/kernels.

// GEMMName names the float32 GEMM in use (the bench reports it beside the peak it measures).
func GEMMName() string { return kernels.GEMMName() }

// KernelPath names the path the kernels run on (scalar, avx2, avx512, avx512bf16, amx).
func KernelPath() string { return kernels.Active().String() }

// DefaultKernelPath names the path "auto" chooses on this CPU before the start-up check: the
// fastest it has, AMX included (kernels.Best).
func DefaultKernelPath() string { return kernels.Best().String() }

// KernelPaths names the paths this CPU has, slowest first.
func KernelPaths() []string {
	var out []string
	for _, p := range kernels.SupportedPaths() {
		out = append(out, p.String())
	}
	return out
}

// UseKernelPath runs every kernel on the named path from now on ("auto" or "": the best this
// CPU has), once the path's kernels pass their start-up check against their references; a path
// that fails it is passed over for the next slower one that passes, and each failure is
// returned in faults. A path the CPU lacks, or an unknown name, is an error and changes nothing.
// Call it at start, before any engine runs: switching while kernels run is not safe.
func UseKernelPath(name string) (faults []error, err error) {
	p := kernels.Best()
	if name != "" && name != "auto" {
		if p, err = kernels.ParsePath(name); err != nil {
			return nil, err
		}
	}
	_, faults, err = kernels.Choose(p)
	quant.SetVectors(kernels.FewRowKernels())
	return faults, err
}

// The quantized formats' vector code follows the kernels' path (SKEIN_GEMM=scalar runs their
// plain-Go code too).
func init() { quant.SetVectors(kernels.FewRowKernels()) }

// KernelFaults returns the faults the start-up check found when the package chose its path.
func KernelFaults() []error { return kernels.StartFaults() }

// Caps is what the CPU's kernels can do on the path in use, for the engine's memory plan.
func (b *Backend) Caps() backend.Caps {
	return backend.Caps{BF16GEMM: kernels.HaveBF16GEMM(), F32GEMM: kernels.HaveGEMM()}
}
