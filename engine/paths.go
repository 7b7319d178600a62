package engine

import "github.com/skein-ai/skein/engine/internal/backend/cpu"

// The CPU backend's kernel paths, as the binary sees them (cpu/paths.go): which instruction set
// the kernels run on, which this CPU has, and the switch behind SKEIN_GEMM.

// GEMMName names the float32 GEMM in use (the bench reports it beside the peak it measures).
func GEMMName() string { return cpu.GEMMName() }

// KernelPath names the path the kernels run on (scalar, avx2, avx512, avx512bf16, amx).
func KernelPath() string { return cpu.KernelPath() }

// DefaultKernelPath names the path "auto" chooses on this CPU before the start-up check: the
// fastest it has, AMX included.
func DefaultKernelPath() string { return cpu.DefaultKernelPath() }

// KernelPaths names the paths this CPU has, slowest first.
func KernelPaths() []string { return cpu.KernelPaths() }

// UseKernelPath runs every kernel on the named path from now on (cpu.UseKernelPath).
func UseKernelPath(name string) (faults []error, err error) { return cpu.UseKernelPath(name) }

// KernelFaults returns the faults the start-up check found when the kernels chose their path.
func KernelFaults() []error { return cpu.KernelFaults() }
