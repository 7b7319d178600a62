package engine

import (
	"github.com/skein-ai/skein/engine/internal/backend"
)

// The backward pass of the transformer's layer (transformer.go), reading what its forward
// saved (layerActs, loraTap). Written out by hand: the same formulas the finite-difference
// tests check on every architecture.

// backward runs the pass backward from d loss/d(the head's input) (dhf, headRows's): through the
// final norm (h and invF its input and 1/rms), then every layer from the last, releasing each
// layer's activations and merged weights once its backward pass is done. It reports false when
// the pass was cancelled between layers.
func (s *pass[E]) backward(h, invF, dhf mat[E], marks []backend.Mark) bool {
	c := s.c
	dh := s.op.Alloc(s.B*s.T, c.HiddenSize)
	s.op.RMSNormBack(dhf, h, invF, s.m.norm, dh, false)
	for l := c.NumHiddenLayers - 1; l >= 0; l-- {
		if s.cancelled() {
			return false
		}
		m := s.op.Mark()
		if s.train.recompute {
			// The layer's forward again, from its kept input, saving what its backward reads (and
			// its taps); everything it allocates goes with the backward's temporaries below.
			in := s.train.inputs[l]
			s.layer(l, in)
			s.train.acts[l].h = in
		}
		dh = s.layerBack(l, dh)
		s.op.Release(m, s.op.Mark())
		s.op.Release(marks[l], marks[l+1])
		for _, lin := range s.m.layers[l].linears() { // this layer's merged weights were in the ranges just released
			s.merged[lin.id] = mat[E]{}
		}
	}
	return true
}

// layerBack takes d loss/d(layer l's output) and returns d loss/d(its input), adding LoRA
// gradients on the way. Layer 0's input gradient is not needed (embeddings are frozen): nil.
func (s *pass[E]) layerBack(l int, dh mat[E]) mat[E] {
	L, la := &s.m.layers[l], &s.train.acts[l]
	dh2 := s.feedForwardBack(l, dh)
	dx1 := L.mix.backward(s, l, dh2, la, l > 0)
	if dx1 == nil {
		return mat[E]{}
	}
	s.op.RMSNormBack(*dx1, la.h, la.inv1, L.inputNorm, dh2, true)
	return dh2
}

// feedForwardBack takes d loss/d(the feed-forward block's output) and returns d loss/d(its
// input h2), in dh's buffer: the residual passes dh through and the norm's gradient is added to
// it.
func (s *pass[E]) feedForwardBack(l int, dh mat[E]) mat[E] {
	L := &s.m.layers[l]
	la := &s.train.acts[l]
	dx2 := L.ffn.backward(s, dh, la)
	dh2 := dh
	s.op.RMSNormBack(dx2, la.h2, la.inv2, L.postNorm, dh2, true)
	return dh2
}

// backward takes d loss/d(the mixer's output) and returns d loss/d(its input x1) (nil when
// !needDX: layer 0, whose input gradient is not needed), adding the LoRA gradients of q, k, v and
// o on the way.
func (A *attentionLayer[E]) backward(s *pass[E], l int, dy mat[E], la *layerActs[E], needDX bool) *mat[E] {
	dq, dk, dv := s.attentionBack(A, l, dy, la)
	dx1 := s.linearBack(dq, A.q, needDX)
	dxk := s.linearBack(dk, A.k, needDX)
	dxv := s.linearBack(dv, A.v, needDX)
	if !needDX {
		return nil
	}
	s.op.Add(*dx1, *dxk)
	s.op.Add(*dx1, *dxv)
	return dx1
}

// attentionBack takes d loss/d(attention's output) and returns d loss/d(the q, k and v
// projections), in token layout.
func (s *pass[E]) attentionBack(A *attentionLayer[E], l int, dh2 mat[E], la *layerActs[E]) (dq, dk, dv mat[E]) {
	c := s.c
	do := s.linearBack(dh2, A.o, true)
	var dgate mat[E]
	if la.gate.Dims != nil {
		// o_proj's input was o ⊙ σ(gate): do ⊙ σ(gate) to o, do ⊙ o ⊙ σ'(gate) to the gate rows.
		dgate = s.op.Alloc(la.gate.Dims...)
		s.op.GateBack(*do, la.o, la.gate, dgate)
	}
	g := s.heads()
	dQ, dKT, dVT := s.op.AttendBack(&backend.AttentionGrads[E]{Heads: g, QH: la.qh, QHT: la.qhT, Keys: la.kh,
		KeysT: la.khT, ValuesT: la.vhT, Probs: la.p}, *do)
	dq, dk, dv = s.op.HeadsBack(&backend.HeadsBack[E]{Heads: g, DQ: dQ, DKT: dKT, DVT: dVT, Q: la.yq, K: la.yk,
		QNorm: A.qNorm, KNorm: A.kNorm, QInv: la.qInv, KInv: la.kInv, Rot: s.rotation()})
	if dgate.Dims != nil {
		dq = s.op.JoinGate(dq, dgate, c.NumAttentionHeads, c.HeadDim)
	}
	return dq, dk, dv
}
