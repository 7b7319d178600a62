package engine

import (
	"github.com/skein-ai/skein/engine/internal/backend"
)

// Gated DeltaNet (Qwen3.5's linear_attention layers; Yang et al., arXiv 2412.06464, as HF's
// Qwen3_5GatedDeltaNet computes it). Per token: projections q, k, v (the split rows of
// in_proj_qkv), z, a, b; a short causal depthwise conv with SiLU over q‖k‖v; q and k
// L2-normalised (q also by 1/√dk); β = σ(b), g = −exp(A_log)·softplus(a + dt_bias); per value
// head h (reading key head h / (Hv/Hk), HF's repeat_interleave) the state S [dk, dv]:
//
//	S ← e^g·S;  u = β·(v − Sᵀk);  S ← S + k·uᵀ;  o = Sᵀq
//
// then a gated RMSNorm per head, w ⊙ norm(o) ⊙ silu(z), and out_proj. The recurrent form
// everywhere (training, prefill, decode), so that the sampler's logprobs equal a training
// pass's bit for bit, and the state is only ever exponentiated by g ≤ 0.

// deltaChunk is how many tokens a training pass runs between kept states: the backward pass
// recomputes the states of one chunk from its first and walks them backwards.
const deltaChunk = backend.DeltaChunk

// deltaNetLayer is a Gated DeltaNet layer's weights.
type deltaNetLayer[E float] struct {
	q, k, v, z, a, b, out *linear[E]
	conv                  mat[E] // [C, K] depthwise taps, channels in in_proj_qkv's row order
	dtBias, aLog          mat[E] // [Hv]
	norm                  mat[E] // [dv] the gated RMSNorm's weight (plain, not zero-centred)
}

func (d *deltaNetLayer[E]) linears() []*linear[E] {
	return []*linear[E]{d.q, d.k, d.v, d.z, d.a, d.b, d.out}
}

// dnDims are a config's DeltaNet sizes.
type dnDims struct {
	Hk, Hv, dk, dv, K int
	Kd, Vd, C, r      int // Hk·dk, Hv·dv, conv channels 2·Kd+Vd, value heads per key head
}

func (c *Config) dnDims() dnDims {
	d := dnDims{Hk: c.LinearNumKeyHeads, Hv: c.LinearNumValueHeads, dk: c.LinearKeyHeadDim, dv: c.LinearValueHeadDim, K: c.LinearConvKernelDim}
	d.Kd, d.Vd = d.Hk*d.dk, d.Hv*d.dv
	d.C, d.r = 2*d.Kd+d.Vd, d.Hv/max(d.Hk, 1)
	return d
}

// forward is out_proj(DeltaNet(x1)) of layer l for its normed input x1, saving its activations
// into la (nil: a forward-only pass). The state starts at zero unless the pass continues the sampler's
// (a decode step), and a prefill leaves each row's state, taken after its own last token, in
// the sampler's cache. The stages: projections, the conv with its norms and gates
// (dnConvAndGates), the conv history kept for the sampler (keepHistory), the rule over every
// token (dnRecurrence), the gated norm (dnGatedNorm), out_proj.
func (L *deltaNetLayer[E]) forward(s *pass[E], l int, x1 mat[E], la *layerActs[E]) mat[E] {
	st, cont, lens := s.kv.deltaState(l)
	dn := L.core(s)
	dn.State, dn.Cont, dn.Lens = st, cont, lens
	dn.Q, dn.K, dn.Value = s.linear(x1, L.q), s.linear(x1, L.k), s.linear(x1, L.v)
	dn.Z, dn.A, dn.Beta = s.linear(x1, L.z), s.linear(x1, L.a), s.linear(x1, L.b)
	if s.op.Err() != nil {
		return x1 // the pass has failed: any [N, D] tensor
	}
	y, kept := s.op.DeltaNet(dn, la != nil)
	out := s.linear(y, L.out)
	if la != nil {
		la.dn = kept
	}
	return out
}

// core is the layer's arguments for the backend's DeltaNet ops, its weights and sizes.
func (L *deltaNetLayer[E]) core(s *pass[E]) *backend.DeltaNet[E] {
	d := s.c.dnDims()
	return &backend.DeltaNet[E]{B: s.B, T: s.T, DeltaDims: backend.DeltaDims{Hk: d.Hk, Hv: d.Hv, DK: d.dk, DV: d.dv, K: d.K},
		Conv: L.conv, DtBias: L.dtBias, ALog: L.aLog, Norm: L.norm, Eps: s.c.RMSNormEps}
}

// backward takes d loss/d(the mixer's output) dh2 and returns d loss/d(its input x1) (nil when
// !needDX: layer 0, whose input gradient is not needed), adding the LoRA gradients of q, k, v,
// z, a, b and out_proj on the way: out_proj, the core (backend DeltaNetBack), the projections.
func (L *deltaNetLayer[E]) backward(s *pass[E], l int, dh2 mat[E], la *layerActs[E], needDX bool) *mat[E] {
	dy := s.linearBack(dh2, L.out, true)
	dmq, dmk, dmv, dz, da, db := s.op.DeltaNetBack(L.core(s), la.dn, *dy)
	var dx1 *mat[E]
	for _, p := range []struct {
		dy  mat[E]
		lin *linear[E]
	}{{dmq, L.q}, {dmk, L.k}, {dmv, L.v}, {dz, L.z}, {da, L.a}, {db, L.b}} {
		dx := s.linearBack(p.dy, p.lin, needDX)
		if !needDX {
			continue
		}
		if dx1 == nil {
			dx1 = dx
		} else {
			s.op.Add(*dx1, *dx)
		}
	}
	return dx1
}
