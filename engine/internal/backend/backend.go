// Package backend is the seam between the engine's model code and the machine it computes on.
// The model code (engine/*.go) reads as the math: it asks a Step for tensors and runs coarse,
// fused ops on them (a norm, a gated activation, attention's softmax, a loss's gradient, an
// AdamW update), never touching their memory or asking which CPU it runs on. A backend
// implements the ops: the CPU backend (backend/cpu) over skein's kernels, a device backend over
// its own memory and kernels.
//
// To add a device: implement Backend and Step in a package of its own, and run the op tests
// (backend/cpu's reference tests, and the engine's golden bits) against the CPU backend. To add
// an op: add its method to Step here, its loop to the CPU backend (its doc comment is the
// reference), its kernel to each device backend, and a parity test.
//
// Step is generic over the element type: the float64 engine (gradient checks against finite
// differences) runs the very same model code, so those checks test what production runs. A device
// backend implements Step[float32] only and refuses float64 engines.
package backend

import (
	"github.com/skein-ai/skein/engine/internal/tensor"
)

// Float is a step's element type.
type Float interface{ float32 | float64 }

// Tensor is one tensor of a step, or a weight.
type Tensor[E Float] = tensor.Mat[E]

// Mark is a point in a step's allocations: everything allocated after it can be given back.
type Mark = tensor.Point

// Step is one pass's memory and ops. Every tensor a step hands out lives until the step is freed
// or the range holding it is released. After the first failure (an allocation refused, a
// cancelled pass) every call is a no-op and Err reports it.
type Step[E Float] interface {
	// Memory.
	Alloc(dims ...int) Tensor[E] // uninitialised: the caller writes every element
	Zeros(dims ...int) Tensor[E]
	// From is a new tensor holding host numbers (an upload).
	From(v []float64, dims ...int) Tensor[E]
	Mark() Mark
	Release(from, to Mark)                   // everything allocated between two marks
	ReleaseExcept(from Mark, keep Tensor[E]) // everything since from but keep
	ReleaseOne(t Tensor[E])
	Fail(err error)
	Err() error
	Free() // the end of the step: every tensor goes back

	// Products: x·y, or x·yᵀ when transB; batch > 0: both have a leading batch axis.
	MatMul(x, y Tensor[E], batch int, transB bool) Tensor[E]
	// MatMulAdd adds x·y (x·yᵀ) to c.
	MatMulAdd(c, x, y Tensor[E], transB bool)

	Ops[E]
}

// Ops are a step's element-wise and row-wise ops, fused forward/backward pairs. Shapes are the
// tensors' own; rows are the leading dimensions flattened.
type Ops[E Float] interface {
	// Add is dst += src.
	Add(dst, src Tensor[E])
	// AddBias adds bias to every row of y.
	AddBias(y Tensor[E], bias []E)
	// RMSNorm writes y = x/rms(x)·w for each row and inv = 1/rms (eps inside the root);
	// ggml rounds as ggml-cpu does (float32 only).
	RMSNorm(x Tensor[E], w []E, eps float64, y, inv Tensor[E], ggml bool)
	// RMSNormBack writes (accumulate: adds) dx for dy through RMSNorm of x with 1/rms inv.
	RMSNormBack(dy, x Tensor[E], inv []E, w []E, dx Tensor[E], accumulate bool)
	// SiluGate writes sig = σ(gate) and out = silu(gate)·up; ggml as ggml-cpu rounds (float32).
	SiluGate(gate, up, sig, out Tensor[E], ggml bool)
	// SiluGateBack writes dgate and dup for d(out) da.
	SiluGateBack(da, gate, up, sig, dgate, dup Tensor[E])
}
