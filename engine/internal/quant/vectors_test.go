package quant

import (
	"github.com/skein-ai/skein/engine/internal/kernels"
)

// The package's vector gate follows the kernels' path in its tests as the CPU backend makes it
// follow it in the engine (SKEIN_GEMM=scalar runs the plain-Go code here too).
func init() { SetVectors(kernels.FewRowKernels()) }

// useKernels switches the kernels' path and the vector gate with it, returning the undo of both.
func useKernels(p kernels.Path) (undo func(), err error) {
	u, err := kernels.Use(p)
	if err != nil {
		return nil, err
	}
	SetVectors(kernels.FewRowKernels())
	return func() { u(); SetVectors(kernels.FewRowKernels()) }, nil
}
