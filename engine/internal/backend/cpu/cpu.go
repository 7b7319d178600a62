// Package cpu is the CPU backend: a step's tensors are Go memory (shared with GoMLX's Go backend
// for the float64 engine's products), its ops are skein's kernels (internal/kernels) on the path
// chosen at start (scalar, AVX2, AVX-512, AVX512_BF16, AMX). The only importer of the kernels
// and the CPU feature package, with the model code reaching them through backend.Step.
package cpu

import (
	"github.com/skein-ai/skein/engine/internal/backend"
	"github.com/skein-ai/skein/engine/internal/kernels"
	"github.com/skein-ai/skein/engine/internal/tensor"
)

// Backend is the CPU: compiled products (GoMLX's, for paths without a GEMM and for float64) and
// the pool of step buffers, shared by an engine's forks.
type Backend struct {
	Pool  *tensor.Pool
	pairs pairs
}

// New keeps at most maxFree bytes of free step buffers between steps.
func New(maxFree int) (*Backend, error) {
	mm, err := tensor.NewPool(maxFree)
	if err != nil {
		return nil, err
	}
	return &Backend{Pool: mm}, nil
}

// NewStep starts a step of element type E.
func NewStep[E backend.Float](b *Backend, opts backend.StepOptions) backend.Step[E] {
	return &step[E]{Arena: tensor.NewArena[E](b.Pool), b: b, opts: opts}
}

// step is a CPU step: the arena hands out and takes back memory, the methods are the ops.
type step[E backend.Float] struct {
	*tensor.Arena[E]
	b    *Backend
	opts backend.StepOptions
	// A quantized weight widened for the bf16 GEMM (product.go), reused by its products: the
	// head's tiles multiply by the same weight one after another, forward and back.
	qPairs   []uint32
	qPairsOf *weight[E] // the weight qPairs holds (nil: none)
	qPairsAt [2]int     // and which of its outputs (pairsChunkOutputs)
}

// Free gives back the step's buffers and its pairs.
func (s *step[E]) Free() {
	s.b.putPairs(s.qPairs)
	s.qPairs, s.qPairsOf = nil, nil
	s.Arena.Free()
}

var (
	_ backend.Step[float32] = (*step[float32])(nil)
	_ backend.Step[float64] = (*step[float64])(nil)
)

// Add is dst += src.
func (s *step[E]) Add(dst, src backend.Tensor[E]) { kernels.AddScaled(dst.V, src.V, 1) }

// AddBias adds bias to every row of y.
func (s *step[E]) AddBias(y, bias backend.Tensor[E]) { kernels.AddBias(y.V, bias.V) }

// RMSNorm: for each row r, inv[r] = 1/√(mean(x[r]²)+eps), y[r] = x[r]·inv[r]·w.
func (s *step[E]) RMSNorm(x, w backend.Tensor[E], eps float64, y, inv backend.Tensor[E], ggml bool) {
	if xf, ok := any(x.V).([]float32); ok && ggml {
		kernels.RMSNormGGML(xf, any(w.V).([]float32), eps, any(y.V).([]float32), any(inv.V).([]float32))
		return
	}
	kernels.RMSNorm(x.V, w.V, eps, y.V, inv.V)
}

// RMSNormBack: dx = inv·dy·w − x·inv³·mean(dy·w·x), added to dx when accumulate.
func (s *step[E]) RMSNormBack(dy, x, inv, w, dx backend.Tensor[E], accumulate bool) {
	kernels.RMSNormBack(dy.V, x.V, inv.V, w.V, dx.V, accumulate)
}

// SiluGate: sig = σ(gate), out = gate·sig·up.
func (s *step[E]) SiluGate(gate, up, sig, out backend.Tensor[E], ggml bool) {
	if gf, ok := any(gate.V).([]float32); ok && ggml {
		kernels.SiluGateGGML(gf, any(up.V).([]float32), any(sig.V).([]float32), any(out.V).([]float32), gate.Dims[len(gate.Dims)-1])
		return
	}
	kernels.SiluGate(gate.V, up.V, sig.V, out.V)
}

// SiluGateBack: dgate = da·up·σ(g)(1+g(1−σ(g))), dup = da·g·σ(g).
func (s *step[E]) SiluGateBack(da, gate, up, sig, dgate, dup backend.Tensor[E]) {
	kernels.SiluGateBack(da.V, gate.V, up.V, sig.V, dgate.V, dup.V)
}

// CompileStats counts compilations of GoMLX one-node products (the float64 engine's and the
// scalar path's), one per distinct shape.
type CompileStats = tensor.CompileStats
