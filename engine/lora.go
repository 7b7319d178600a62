package engine

import (
	"fmt"

	"github.com/skein-ai/skein/engine/internal/backend"
)

// loraMats are one module's A and B for a pass, with the transposes its products need, and the
// indices of their gradient accumulators.
type loraMats[E float] struct {
	a, b   mat[E] // A [r, in], B [out, r]: the adapter's own numbers, or copies (loraOf)
	aT     mat[E] // Aᵀ [in, r] for merging into an [in, out] weight
	bTs    mat[E] // scale·Bᵀ [r, out] for the few-row kernels of segmented passes (decode)
	ai, bi int
}

// loraTap is what a module's LoRA gradients need of its forward pass: its input and x·Aᵀ.
type loraTap[E float] struct{ x, xa mat[E] }

// loraOf gives a pass an adapter's matrices, by linear id (nil adapter: none), and its scale.
// A training pass (alias) reads A and B where the adapter keeps them whenever its matmuls take
// Go slices (float32 on the kernels' GEMM): an adapter's ops run one after another (the gateway
// orders them), so nothing changes them during the pass, and for an 8B shape at rank 32 the
// copies were 0.7 GB. Otherwise (the backend's matmuls take only its buffers; decode, whose
// generations outlive an optim_step) they are copied into the arena, with scale·Bᵀ for the
// few-row products. The scale is applied to the rank-r products instead (addedLoRA).
func loraOf[E float](ar step[E], a *Adapter, m *model[E], alias bool) ([]*loraMats[E], E) {
	out := make([]*loraMats[E], m.loraSlots())
	if a == nil {
		return out, 0
	}
	r := a.Config.Rank
	scale := E(a.Config.Alpha / float64(r))
	for i, mod := range a.mods {
		if mod.Experts > 0 {
			// A mixture of experts' projection: read as its A and B (moe.go), never merged.
			x, ok := m.expertMods[mod.Path]
			if !ok || x.in != mod.In || x.out != mod.Out {
				ar.Fail(fmt.Errorf("engine: adapter module %s [%d→%d] does not fit the model", mod.Path, mod.In, mod.Out))
				continue
			}
			pa, pb := a.params[2*i], a.params[2*i+1]
			lm := &loraMats[E]{ai: 2 * i, bi: 2*i + 1}
			if alias && ar.ReadsInPlace() {
				lm.a, lm.b = numbersOf[E](pa).w, numbersOf[E](pb).w
			} else {
				lm.a, lm.b = ar.Copy(numbersOf[E](pa).w), ar.Copy(numbersOf[E](pb).w)
			}
			out[x.id] = lm
			continue
		}
		lin := m.byPath[mod.Path]
		if lin == nil || lin.in != mod.In || lin.out != mod.Out {
			ar.Fail(fmt.Errorf("engine: adapter module %s [%d→%d] does not fit the model", mod.Path, mod.In, mod.Out))
			continue
		}
		pa, pb := a.params[2*i], a.params[2*i+1]
		lm := &loraMats[E]{ai: 2 * i, bi: 2*i + 1}
		if alias && ar.ReadsInPlace() {
			lm.a, lm.b = numbersOf[E](pa).w, numbersOf[E](pb).w
		} else {
			lm.a, lm.b = ar.Copy(numbersOf[E](pa).w), ar.Copy(numbersOf[E](pb).w)
			lm.bTs = ar.Transpose(lm.b, scale)
		}
		if !lin.w.OutIn() && !lin.alwaysAdds() { // Aᵀ only merges
			lm.aT = ar.Transpose(lm.a, 1)
		}
		out[lin.id] = lm
	}
	return out, scale
}

// loraApply is how a linear module applies its LoRA, forward and for the input gradient.
type loraApply[E float] interface {
	// forward returns x·(W + scale·(B·A)ᵀ), saving x and x·Aᵀ when the pass trains.
	forward(s *pass[E], x mat[E], lin *linear[E], lm *loraMats[E]) mat[E]
	// inputGrad returns dy·(W + scale·(B·A)ᵀ)ᵀ, given dyB = dy·B.
	inputGrad(s *pass[E], dy, dyB mat[E], lin *linear[E], lm *loraMats[E]) mat[E]
}

// loraWay picks how module lin applies its LoRA over rows rows: merging costs a rank-r
// product of the weight's size (in·out·r) and one pass over it; adding costs rank-r products
// of the rows' size (rows·(in+out)·r). Merging wins from rows·(in+out) ≥ in·out: training
// and long prefills merge, decode steps add. A weight kept in bf16 on a path with a bf16 GEMM
// always adds: its product runs in bf16, and the LoRA term (as PEFT under autocast) in float32;
// a merged weight would be float32. The choice depends on the shape, the weight and the path
// only, so a pass computes the same bits whether training, a forward or the sampler asked for it.
func (s *pass[E]) loraWay(lin *linear[E], rows int) loraApply[E] {
	if lin.alwaysAdds() {
		return addedLoRA[E]{}
	}
	if rows*(lin.in+lin.out) >= lin.in*lin.out {
		return mergedLoRA[E]{}
	}
	return addedLoRA[E]{}
}

// alwaysAdds reports whether the module adds its LoRA whatever the rows: its products read the
// weight as kept (bf16 on a path with a bf16 GEMM, quantized blocks), where a merged weight
// would be float32 (Weight.AddsLoRA).
func (lin *linear[E]) alwaysAdds() bool { return lin.w.AddsLoRA() }

// mergedLoRA multiplies by W + scale·(B·A)ᵀ: one big matmul instead of three (the rank-r
// matmuls are slow in the backend: little work per output element).
type mergedLoRA[E float] struct{}

func (mergedLoRA[E]) forward(s *pass[E], x mat[E], lin *linear[E], lm *loraMats[E]) mat[E] {
	y := s.op.MatMul(x, s.mergedWeight(lin, lm), 0, lin.w.OutIn())
	if s.saving() { // only the LoRA gradients need x·Aᵀ
		s.train.taps[lin.id] = loraTap[E]{x: x, xa: s.op.MatMul(x, lm.a, 0, true)}
	}
	return y
}

func (mergedLoRA[E]) inputGrad(s *pass[E], dy, _ mat[E], lin *linear[E], lm *loraMats[E]) mat[E] {
	return s.op.MatMul(dy, s.mergedWeight(lin, lm), 0, !lin.w.OutIn())
}

// mergedWeight returns the module's weight, in its stored layout, with its LoRA merged in;
// built once per layer and pass (or kept for the backward pass, see trainState.keepMerged).
func (s *pass[E]) mergedWeight(lin *linear[E], lm *loraMats[E]) mat[E] {
	if f := s.merged[lin.id]; f.Dims != nil {
		return f
	}
	var m mat[E]
	if lin.w.OutIn() {
		m = s.op.MatMul(lm.b, lm.a, 0, false) // B·A [out, in]
	} else {
		m = s.op.MatMul(lm.aT, lm.b, 0, true) // Aᵀ·Bᵀ [in, out]
	}
	s.op.Merge(m, lin.w, s.scale)
	s.merged[lin.id] = m
	return m
}

// addedLoRA adds (x·Aᵀ)·(scale·Bᵀ) to x·W, and (dy·B)·(scale·A) to its input gradient, each in
// one pass over the output (MatMulAdd): with few rows the rank-r products are tiny, and merging
// would copy the weight for every call.
type addedLoRA[E float] struct{}

func (addedLoRA[E]) forward(s *pass[E], x mat[E], lin *linear[E], lm *loraMats[E]) mat[E] {
	y := s.baseProduct(x, lin, false)
	if s.ggmlLoRA(x, y, lin, lm, 0, x.Dims[0]) {
		if s.saving() {
			s.train.taps[lin.id] = loraTap[E]{x: x, xa: s.op.MatMul(x, lm.a, 0, true)}
		}
		return y
	}
	xa := s.op.MatMul(x, lm.a, 0, true) // [N, r]
	xas := s.op.Scale(xa, s.scale)
	s.op.MatMulAdd(y, xas, lm.b, true) // (scale·x·Aᵀ)·Bᵀ: the scale on [N, r], not on B
	s.op.ReleaseOne(xas)
	if s.saving() {
		s.train.taps[lin.id] = loraTap[E]{x: x, xa: xa}
	}
	return y
}

func (addedLoRA[E]) inputGrad(s *pass[E], dy, dyB mat[E], lin *linear[E], lm *loraMats[E]) mat[E] {
	dx := s.baseProduct(dy, lin, true)
	dyBs := s.op.Scale(dyB, s.scale)
	s.op.MatMulAdd(dx, dyBs, lm.a, false) // (scale·dy·B)·A [N, in]
	s.op.ReleaseOne(dyBs)
	return dx
}

// ggmlLoRA adds rows r0…r1 of module lin's LoRA term to y as llama.cpp does (under ggmlNorms:
// Step.AddLoRAGGML, float32 passes) and reports whether it did. An ulp of difference here
// reaches the next product's activation rounding as the norms' would.
func (s *pass[E]) ggmlLoRA(x, y mat[E], lin *linear[E], lm *loraMats[E], r0, r1 int) bool {
	if !s.e.ggmlNorms() { // a quantized base: float32 passes only
		return false
	}
	s.op.AddLoRAGGML(x, y, backend.LoRARun[E]{R0: r0, R1: r1, A: lm.a, B: lm.b, Scale: s.scale})
	return true
}

// linearBack adds the module's LoRA gradients for output gradient dy and returns d loss/dx
// (nil when !needDX).
func (s *pass[E]) linearBack(dy mat[E], lin *linear[E], needDX bool) *mat[E] {
	lm := s.lora[lin.id]
	var dyB mat[E]
	if lm != nil {
		dyB = s.loraGrads(dy, lin, lm)
	}
	if !needDX {
		return nil
	}
	var d mat[E]
	if lm != nil {
		d = s.loraWay(lin, dy.Dims[0]).inputGrad(s, dy, dyB, lin, lm)
	} else {
		d = s.baseProduct(dy, lin, true)
	}
	return &d
}

// loraGrads adds dA = scale·(dy·B)ᵀ·x and dB = scale·dyᵀ·(x·Aᵀ) for the module and returns
// dy·B. The rank-sized operands are transposed here so that every matmul is in the backend's
// plain layout.
func (s *pass[E]) loraGrads(dy mat[E], lin *linear[E], lm *loraMats[E]) mat[E] {
	tap := s.train.taps[lin.id]
	dyB := s.op.MatMul(dy, lm.b, 0, false) // [N, r]
	dyBT := s.op.Transpose(dyB, s.scale)
	dA := s.op.MatMul(dyBT, tap.x, 0, false) // [r, in]
	s.op.AddGrad(s.train.grads[lm.ai], dA, false)
	xaT := s.op.Transpose(tap.xa, s.scale)
	dBt := s.op.MatMul(xaT, dy, 0, false) // [r, out]
	s.op.AddGrad(s.train.grads[lm.bi], dBt, true)
	return dyB
}
