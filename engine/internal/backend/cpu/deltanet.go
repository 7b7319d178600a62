package cpu

import (
	"math"

	"github.com/skein-ai/skein/engine/internal/backend"
	"github.com/skein-ai/skein/engine/internal/kernels"
)

// Gated DeltaNet's core (Yang et al., arXiv 2412.06464, as HF's Qwen3_5GatedDeltaNet computes
// it), between a layer's projections and its out_proj: a short causal depthwise conv with SiLU
// over q‖k‖v; q and k L2-normalised (q also by 1/√dk); β = σ(b), g = −exp(A_log)·softplus(a +
// dt_bias); per value head h (reading key head h / (Hv/Hk), HF's repeat_interleave) the state
// S [dk, dv]:
//
//	S ← e^g·S;  u = β·(v − Sᵀk);  S ← S + k·uᵀ;  o = Sᵀq
//
// then a gated RMSNorm per head, w ⊙ norm(o) ⊙ silu(z). The recurrent form everywhere
// (training, prefill, decode), so that the sampler's logprobs equal a training pass's bit for
// bit, and the state is only ever exponentiated by g ≤ 0.

// dnDims are a layer's DeltaNet sizes.
type dnDims struct {
	Hk, Hv, dk, dv, K int
	Kd, Vd, C, r      int // Hk·dk, Hv·dv, conv channels 2·Kd+Vd, value heads per key head
}

func dimsOf(g backend.DeltaDims) dnDims {
	d := dnDims{Hk: g.Hk, Hv: g.Hv, dk: g.DK, dv: g.DV, K: g.K}
	d.Kd, d.Vd = d.Hk*d.dk, d.Hv*d.dv
	d.C, d.r = 2*d.Kd+d.Vd, d.Hv/max(d.Hk, 1)
	return d
}

// deltaChunk is how many tokens a training pass runs between kept states.
const deltaChunk = backend.DeltaChunk

// deltaActs are what a DeltaNet layer's backward pass reads.
type deltaActs[E backend.Float] struct {
	pre        backend.Tensor[E] // [N, C] conv outputs before SiLU
	qh, kh     backend.Tensor[E] // [N, Kd] normalised queries (·1/√dk) and keys
	qInv, kInv []E               // [N·Hk] 1/‖q‖, 1/‖k‖ (with HF's 1e-6 inside the root)
	v          backend.Tensor[E] // [N, Vd] values (after conv and SiLU)
	g, beta    []E               // [N·Hv] log-decay and β
	dgda       []E               // [N·Hv] dg/da = −exp(A_log)·softplus'(a + dt_bias)
	z, o       backend.Tensor[E] // [N, Vd] gate pre-activation and the rule's output
	oInv       []E               // [N·Hv] the gated norm's 1/rms
	ckpt       []E               // [B·Hv, chunks, dk·dv]: the state before each chunk's first token
}

// softplus as torch's F.softplus (beta 1, threshold 20: the input itself above 20).
func softplus(x float64) float64 {
	if x > 20 {
		return x
	}
	return math.Log1p(math.Exp(x))
}

// DeltaNet: the conv with its norms and gates (dnConvAndGates), the conv history kept for the
// sampler (keepHistory), the rule over every token (dnRecurrence), the gated norm (dnGatedNorm).
func (s *step[E]) DeltaNet(a *backend.DeltaNet[E], keep bool) (backend.Tensor[E], any) {
	d := dimsOf(a.DeltaDims)
	in := dnConvInput[E]{q: a.Q, k: a.K, v: a.Value, st: a.State, cont: a.Cont, d: d, T: a.T}
	acts := s.dnConvAndGates(a, &in)
	if a.State != nil {
		in.keepHistory(a.B, a.Lens)
	}
	acts.z = a.Z
	s.dnRecurrence(a, &acts, d, keep)
	y := s.dnGatedNorm(a, d, &acts)
	if !keep {
		return y, nil
	}
	return y, &acts
}

// DeltaNetBack: the forward's stages in reverse: the gated norm (dnGatedNormBack), the rule
// (dnRecurrenceBack: the states recomputed a chunk at a time from the forward's checkpoints and
// walked backwards), the norms and gates (dnGatesBack), the conv (dnConvBack).
func (s *step[E]) DeltaNetBack(a *backend.DeltaNet[E], kept any, dy backend.Tensor[E]) (dq, dk, dv, dz, da, db backend.Tensor[E]) {
	acts := kept.(*deltaActs[E])
	d := dimsOf(a.DeltaDims)
	dO, dz := s.dnGatedNormBack(a, d, acts, dy)
	g := s.dnRecurrenceBack(a, d, acts, dO)
	dpre, da, db := s.dnGatesBack(a, d, acts, g)
	dq, dk, dv = s.dnConvBack(a, d, dpre)
	return dq, dk, dv, dz, da, db
}

// dnConvInput is the conv's input: the q, k and v projections' outputs side by side as
// in_proj_qkv's channels, after the history a continuation carries.
type dnConvInput[E backend.Float] struct {
	q, k, v backend.Tensor[E]
	st      *backend.DeltaState[E]
	cont    bool
	d       dnDims
	T       int
}

// at is conv input (b, t, ch); t < 0 reads the cached history of a continuation (zeros at a
// sequence start, as HF's left padding).
func (in *dnConvInput[E]) at(b, t, ch int) E {
	d := in.d
	if t < 0 {
		if !in.cont {
			return 0
		}
		K1 := d.K - 1
		return in.st.Conv.V[(b*d.C+ch)*K1+K1+t]
	}
	n := b*in.T + t
	switch {
	case ch < d.Kd:
		return in.q.V[n*d.Kd+ch]
	case ch < 2*d.Kd:
		return in.k.V[n*d.Kd+ch-d.Kd]
	}
	return in.v.V[n*d.Vd+ch-2*d.Kd]
}

// keepHistory writes the conv history the sampler keeps: the last K-1 inputs before each row's
// end (its prompt's last token in a prefill, the step's last token in a continuation), computed
// whole before it is overwritten, since at reads the old one.
func (in *dnConvInput[E]) keepHistory(B int, lens []int) {
	d, K1 := in.d, in.d.K-1
	hist := make([]E, B*d.C*K1)
	for b := range B {
		end := in.T
		if lens != nil {
			end = lens[b]
		}
		for ch := range d.C {
			for j := range K1 {
				hist[(b*d.C+ch)*K1+j] = in.at(b, end-K1+j, ch)
			}
		}
	}
	copy(in.st.Conv.V, hist)
}

// dnConvAndGates runs, per token, the causal depthwise conv with SiLU, q's and k's L2 norms
// (q also by 1/√dk), and the gates g = −exp(A_log)·softplus(a + dt_bias) and β = σ(b), keeping
// what the backward pass reads.
func (s *step[E]) dnConvAndGates(L *backend.DeltaNet[E], in *dnConvInput[E]) deltaActs[E] {
	d, T, N := in.d, in.T, L.B*L.T
	av, bv := L.A, L.Beta
	K1 := d.K - 1
	a := deltaActs[E]{pre: s.Alloc(N, d.C), qh: s.Alloc(N, d.Kd), kh: s.Alloc(N, d.Kd), v: s.Alloc(N, d.Vd),
		qInv: make([]E, N*d.Hk), kInv: make([]E, N*d.Hk), g: make([]E, N*d.Hv), beta: make([]E, N*d.Hv), dgda: make([]E, N*d.Hv)}
	qScale := 1 / math.Sqrt(float64(d.dk))
	kernels.ParallelRows(N, func(n0, n1 int) {
		act := make([]float64, d.C)
		for n := n0; n < n1; n++ {
			b, t := n/T, n%T
			for ch := range d.C {
				var acc float64
				w := L.Conv.V[ch*d.K : (ch+1)*d.K]
				for j := range d.K {
					acc += float64(w[j]) * float64(in.at(b, t-K1+j, ch))
				}
				pe := E(acc)
				a.pre.V[n*d.C+ch] = pe
				act[ch] = float64(pe) * sigmoid(float64(pe))
			}
			for hk := range d.Hk {
				for i, dst := range []backend.Tensor[E]{a.qh, a.kh} {
					seg := act[i*d.Kd+hk*d.dk : i*d.Kd+(hk+1)*d.dk]
					var ss float64
					for _, x := range seg {
						ss += x * x
					}
					iv := 1 / math.Sqrt(ss+1e-6)
					if i == 0 {
						a.qInv[n*d.Hk+hk] = E(iv)
						iv *= qScale
					} else {
						a.kInv[n*d.Hk+hk] = E(iv)
					}
					out := dst.V[n*d.Kd+hk*d.dk : n*d.Kd+(hk+1)*d.dk]
					for j, x := range seg {
						out[j] = E(x * iv)
					}
				}
			}
			for j := range d.Vd {
				a.v.V[n*d.Vd+j] = E(act[2*d.Kd+j])
			}
			dnGates(L, d, n, av, bv, &a)
		}
	})
	return a
}

// dnGates writes token n's log-decay g, dg/da and β for every value head.
func dnGates[E backend.Float](L *backend.DeltaNet[E], d dnDims, n int, av, bv backend.Tensor[E], a *deltaActs[E]) {
	for hv := range d.Hv {
		x := float64(av.V[n*d.Hv+hv]) + float64(L.DtBias.V[hv])
		A := math.Exp(float64(L.ALog.V[hv]))
		a.g[n*d.Hv+hv] = E(-A * softplus(x))
		dsp := 1.0 // softplus' = σ, 1 where torch's softplus returns its input
		if x <= 20 {
			dsp = sigmoid(x)
		}
		a.dgda[n*d.Hv+hv] = E(-A * dsp)
		a.beta[n*d.Hv+hv] = E(sigmoid(float64(bv.V[n*d.Hv+hv])))
	}
}

// dnRecurrence runs the rule over every token of every (row, value head), writing a.o; a
// training pass (saving) also keeps the state before each chunk's first token in a.ckpt. A
// continuation starts from, and a prefill or continuation leaves, the sampler's state st.
func (s *step[E]) dnRecurrence(L *backend.DeltaNet[E], a *deltaActs[E], d dnDims, saving bool) {
	B, T := L.B, L.T
	st, cont, lens := L.State, L.Cont, L.Lens
	a.o = s.Alloc(B*T, d.Vd)
	chunks := (T + deltaChunk - 1) / deltaChunk
	if saving {
		a.ckpt = make([]E, B*d.Hv*chunks*d.dk*d.dv)
	}
	dkdv := d.dk * d.dv
	kernels.ParallelRows(B*d.Hv, func(r0, r1 int) {
		S, u, ones := make([]E, dkdv), make([]E, d.dv), onesOf[E](dkdv)
		for r := r0; r < r1; r++ {
			b, hv := r/d.Hv, r%d.Hv
			hk := hv / d.r
			clear(S)
			if cont {
				copy(S, st.S.V[r*dkdv:(r+1)*dkdv])
			}
			end := T
			if st != nil && lens != nil {
				end = lens[b]
			}
			for t := range T {
				if saving && t%deltaChunk == 0 {
					copy(a.ckpt[(r*chunks+t/deltaChunk)*dkdv:], S)
				}
				n := b*T + t
				deltaStep(S, S, a.qh.V[n*d.Kd+hk*d.dk:n*d.Kd+(hk+1)*d.dk], a.kh.V[n*d.Kd+hk*d.dk:n*d.Kd+(hk+1)*d.dk],
					a.v.V[n*d.Vd+hv*d.dv:n*d.Vd+(hv+1)*d.dv], a.g[n*d.Hv+hv], a.beta[n*d.Hv+hv], a.o.V[n*d.Vd+hv*d.dv:n*d.Vd+(hv+1)*d.dv], u, ones, d.dv)
				// The state after the row's own last token (a row with none in this pass keeps
				// the state it came with).
				if st != nil && t == end-1 {
					copy(st.S.V[r*dkdv:(r+1)*dkdv], S)
				}
			}
		}
	})
}

// dnGatedNorm is the gated RMSNorm per value head, w ⊙ o/rms(o) ⊙ silu(z), keeping each head's
// 1/rms in a.oInv.
func (s *step[E]) dnGatedNorm(L *backend.DeltaNet[E], d dnDims, a *deltaActs[E]) backend.Tensor[E] {
	N := L.B * L.T
	y := s.Alloc(N, d.Vd)
	a.oInv = make([]E, N*d.Hv)
	eps := L.Eps
	kernels.ParallelRows(N*d.Hv, func(r0, r1 int) {
		for r := r0; r < r1; r++ {
			seg := a.o.V[r*d.dv : (r+1)*d.dv]
			var ss float64
			for _, x := range seg {
				ss += float64(x) * float64(x)
			}
			iv := E(1 / math.Sqrt(ss/float64(d.dv)+eps))
			a.oInv[r] = iv
			for j, x := range seg {
				zz := float64(a.z.V[r*d.dv+j])
				y.V[r*d.dv+j] = L.Norm.V[j] * (x * iv) * E(zz*sigmoid(zz))
			}
		}
	})
	return y
}

// deltaStep is one token of the rule from state src to dst [dk, dv] (the same slice, or
// another: the backward pass's recomputation keeps every state of a chunk): decay, delta update,
// and the output o = Sᵀq; u is scratch of dv and ones dk·dv ones. Every pass over the state goes
// through the vector row kernels.
func deltaStep[E backend.Float](dst, src, q, k, v []E, g, beta E, o, u, ones []E, dv int) {
	kernels.MulScaled(dst, src, ones, E(math.Exp(float64(g)))) // S ← e^g·S
	clear(u)
	for i, ki := range k { // u = Sᵀk, what the decayed state predicts for k
		kernels.Axpy(u, dst[i*dv:(i+1)*dv], ki)
	}
	for j := range u {
		u[j] = beta * (v[j] - u[j])
	}
	clear(o)
	for i, ki := range k {
		row := dst[i*dv : (i+1)*dv]
		kernels.Axpy(row, u, ki) // S ← S + k·uᵀ
		kernels.Axpy(o, row, q[i])
	}
}

// onesOf is a slice of n ones (deltaStep's scaling operand).
func onesOf[E backend.Float](n int) []E {
	v := make([]E, n)
	for i := range v {
		v[i] = 1
	}
	return v
}

// dnGatedNormBack takes d loss/dy of y = w ⊙ (o·inv) ⊙ silu(z) to d loss/do and d loss/dz.
func (s *step[E]) dnGatedNormBack(L *backend.DeltaNet[E], d dnDims, a *deltaActs[E], dy backend.Tensor[E]) (dO, dz backend.Tensor[E]) {
	N := L.B * L.T
	dO, dz = s.Alloc(N, d.Vd), s.Alloc(N, d.Vd)
	kernels.ParallelRows(N*d.Hv, func(r0, r1 int) {
		dn := make([]E, d.dv)
		for r := r0; r < r1; r++ {
			iv := a.oInv[r]
			for j := range d.dv {
				zz := float64(a.z.V[r*d.dv+j])
				sg := sigmoid(zz)
				gy := dy.V[r*d.dv+j]
				dn[j] = gy * E(zz*sg)
				dz.V[r*d.dv+j] = gy * L.Norm.V[j] * a.o.V[r*d.dv+j] * iv * E(sg*(1+zz*(1-sg)))
			}
			rmsNormRowBack(dn, a.o.V[r*d.dv:(r+1)*d.dv], L.Norm.V, iv, dO.V[r*d.dv:(r+1)*d.dv])
		}
	})
	return dO, dz
}

// dnRuleGrads are the rule's input gradients: d loss/d(normalised q, k), d loss/dv, and per
// (token, value head) d loss/dg and d loss/dβ.
type dnRuleGrads[E backend.Float] struct {
	dqh, dkh, dv backend.Tensor[E]
	dg, dbeta    []E
}

// dnRecurrenceBack walks the rule backwards for every (row, key head): the value heads that
// share a key head add into the same dq and dk rows, so one worker owns them all.
func (s *step[E]) dnRecurrenceBack(L *backend.DeltaNet[E], d dnDims, a *deltaActs[E], dO backend.Tensor[E]) dnRuleGrads[E] {
	B, T, N := L.B, L.T, L.B*L.T
	g := dnRuleGrads[E]{dqh: s.Zeros(N, d.Kd), dkh: s.Zeros(N, d.Kd), dv: s.Alloc(N, d.Vd), dg: make([]E, N*d.Hv), dbeta: make([]E, N*d.Hv)}
	chunks := (T + deltaChunk - 1) / deltaChunk
	dkdv := d.dk * d.dv
	kernels.ParallelRows(B*d.Hk, func(r0, r1 int) {
		states := make([]E, (deltaChunk+1)*dkdv)
		w := newDeltaBackScratch[E](d)
		for bk := r0; bk < r1; bk++ {
			b, hk := bk/d.Hk, bk%d.Hk
			for hv := hk * d.r; hv < (hk+1)*d.r; hv++ {
				row := b*d.Hv + hv
				clear(w.dS)
				for ch := chunks - 1; ch >= 0; ch-- {
					t0, t1 := ch*deltaChunk, min(T, (ch+1)*deltaChunk)
					copy(states[:dkdv], a.ckpt[(row*chunks+ch)*dkdv:(row*chunks+ch+1)*dkdv])
					for t := t0; t < t1; t++ {
						n := b*T + t
						deltaStep(states[(t-t0+1)*dkdv:(t-t0+2)*dkdv], states[(t-t0)*dkdv:(t-t0+1)*dkdv], a.qh.V[n*d.Kd+hk*d.dk:n*d.Kd+(hk+1)*d.dk], a.kh.V[n*d.Kd+hk*d.dk:n*d.Kd+(hk+1)*d.dk],
							a.v.V[n*d.Vd+hv*d.dv:n*d.Vd+(hv+1)*d.dv], a.g[n*d.Hv+hv], a.beta[n*d.Hv+hv], w.scratch, w.u, w.ones, d.dv)
					}
					for t := t1 - 1; t >= t0; t-- {
						w.token(d, a, dO, &g, b*T+t, hk, hv, states[(t-t0)*dkdv:(t-t0+1)*dkdv], states[(t-t0+1)*dkdv:(t-t0+2)*dkdv])
					}
				}
			}
		}
	})
	return g
}

// deltaBackScratch is one worker's state gradient dS [dk, dv] (carried backwards from token to
// token) and its per-token scratch vectors of dv.
type deltaBackScratch[E backend.Float] struct {
	dS, ones             []E
	r, du, e, scratch, u []E
}

func newDeltaBackScratch[E backend.Float](d dnDims) *deltaBackScratch[E] {
	return &deltaBackScratch[E]{dS: make([]E, d.dk*d.dv), ones: onesOf[E](d.dk * d.dv),
		r: make([]E, d.dv), du: make([]E, d.dv), e: make([]E, d.dv), scratch: make([]E, d.dv), u: make([]E, d.dv)}
}

// token is the rule's backward at token n of value head hv (key head hk), from the state before
// it (prev) and after it (cur) and d loss/do (dO): it adds into g's dq and dk rows, writes dv,
// dg and dβ, and moves w.dS to the state before the token.
func (w *deltaBackScratch[E]) token(d dnDims, a *deltaActs[E], dO backend.Tensor[E], g *dnRuleGrads[E], n, hk, hv int, prev, cur []E) {
	q := a.qh.V[n*d.Kd+hk*d.dk : n*d.Kd+(hk+1)*d.dk]
	k := a.kh.V[n*d.Kd+hk*d.dk : n*d.Kd+(hk+1)*d.dk]
	vv := a.v.V[n*d.Vd+hv*d.dv : n*d.Vd+(hv+1)*d.dv]
	do := dO.V[n*d.Vd+hv*d.dv : n*d.Vd+(hv+1)*d.dv]
	beta := a.beta[n*d.Hv+hv]
	decay := E(math.Exp(float64(a.g[n*d.Hv+hv])))
	dq, dk := g.dqh.V[n*d.Kd+hk*d.dk:n*d.Kd+(hk+1)*d.dk], g.dkh.V[n*d.Kd+hk*d.dk:n*d.Kd+(hk+1)*d.dk]
	dS, r, u, du, e := w.dS, w.r, w.u, w.du, w.e
	// o = Sᵀq: dq = S·do, dS += q·doᵀ. r = v − Ŝᵀk with Ŝ = decay·prev.
	clear(r)
	for i := range d.dk {
		dq[i] += E(kernels.Dot(cur[i*d.dv:(i+1)*d.dv], do))
		kernels.Axpy(dS[i*d.dv:(i+1)*d.dv], do, q[i])
		kernels.Axpy(r, prev[i*d.dv:(i+1)*d.dv], k[i])
	}
	for j := range r {
		r[j] = vv[j] - decay*r[j]
		u[j] = beta * r[j]
	}
	// S = Ŝ + k·uᵀ with u = β·r: dk = dS·u, du = dSᵀk, dβ = du·r, dv = β·du.
	clear(du)
	for i := range d.dk {
		dSi := dS[i*d.dv : (i+1)*d.dv]
		dk[i] += E(kernels.Dot(dSi, u))
		kernels.Axpy(du, dSi, k[i])
	}
	g.dbeta[n*d.Hv+hv] = E(kernels.Dot(du, r))
	for j := range e {
		e[j] = beta * du[j]
	}
	copy(g.dv.V[n*d.Vd+hv*d.dv:n*d.Vd+(hv+1)*d.dv], e)
	// dŜ = dS − k·eᵀ; dk −= Ŝ·e; dg = ⟨dŜ, Ŝ⟩; dS ← decay·dŜ (into the previous state).
	var dgt float64
	for i := range d.dk {
		dSi, pi := dS[i*d.dv:(i+1)*d.dv], prev[i*d.dv:(i+1)*d.dv]
		kernels.Axpy(dSi, e, -k[i])
		dk[i] -= decay * E(kernels.Dot(pi, e))
		dgt += kernels.Dot(dSi, pi)
	}
	kernels.MulScaled(dS, dS, w.ones, decay)
	g.dg[n*d.Hv+hv] = E(float64(decay) * dgt)
}

// dnGatesBack takes the rule's input gradients, per token, back through q's and k's norms,
// SiLU and the gates to the conv's outputs (dpre) and the a and b projections' outputs.
func (s *step[E]) dnGatesBack(L *backend.DeltaNet[E], d dnDims, a *deltaActs[E], g dnRuleGrads[E]) (dpre, da, db backend.Tensor[E]) {
	N := L.B * L.T
	dpre = s.Alloc(N, d.C)
	da, db = s.Alloc(N, d.Hv), s.Alloc(N, d.Hv)
	qScale := 1 / math.Sqrt(float64(d.dk))
	kernels.ParallelRows(N, func(n0, n1 int) {
		for n := n0; n < n1; n++ {
			for hk := range d.Hk {
				for i, m := range []struct {
					nrm, dn backend.Tensor[E]
					inv     []E
					scale   float64
				}{{a.qh, g.dqh, a.qInv, qScale}, {a.kh, g.dkh, a.kInv, 1}} {
					base := n*d.Kd + hk*d.dk
					// x̂ = scale·x·inv: with u = x·inv, du = scale·dx̂, dx = inv·(du − u·(u·du)).
					var dot float64
					for j := range d.dk {
						u := float64(m.nrm.V[base+j]) / m.scale
						dot += u * float64(m.dn.V[base+j]) * m.scale
					}
					iv := float64(m.inv[n*d.Hk+hk])
					for j := range d.dk {
						u := float64(m.nrm.V[base+j]) / m.scale
						ch := i*d.Kd + hk*d.dk + j
						dact := iv * (float64(m.dn.V[base+j])*m.scale - u*dot)
						p := float64(a.pre.V[n*d.C+ch])
						sg := sigmoid(p)
						dpre.V[n*d.C+ch] = E(dact * sg * (1 + p*(1-sg)))
					}
				}
			}
			for j := range d.Vd {
				ch := 2*d.Kd + j
				p := float64(a.pre.V[n*d.C+ch])
				sg := sigmoid(p)
				dpre.V[n*d.C+ch] = E(float64(g.dv.V[n*d.Vd+j]) * sg * (1 + p*(1-sg)))
			}
			for hv := range d.Hv {
				i := n*d.Hv + hv
				bt := float64(a.beta[i])
				db.V[i] = E(float64(g.dbeta[i]) * bt * (1 - bt))
				da.V[i] = g.dg[i] * a.dgda[i]
			}
		}
	})
	return dpre, da, db
}

// dnConvBack is the conv, transposed: input m[t] fed outputs t … t+K-1 (training starts from
// zero history), split back into the q, k and v projections' output gradients.
func (s *step[E]) dnConvBack(L *backend.DeltaNet[E], d dnDims, dpre backend.Tensor[E]) (dmq, dmk, dmv backend.Tensor[E]) {
	T, N := L.T, L.B*L.T
	dmq, dmk, dmv = s.Alloc(N, d.Kd), s.Alloc(N, d.Kd), s.Alloc(N, d.Vd)
	K1 := d.K - 1
	kernels.ParallelRows(N, func(n0, n1 int) {
		for n := n0; n < n1; n++ {
			b, t := n/T, n%T
			for ch := range d.C {
				var acc float64
				for j := range d.K {
					if tt := t + K1 - j; tt < T {
						acc += float64(L.Conv.V[ch*d.K+j]) * float64(dpre.V[(b*T+tt)*d.C+ch])
					}
				}
				switch {
				case ch < d.Kd:
					dmq.V[n*d.Kd+ch] = E(acc)
				case ch < 2*d.Kd:
					dmk.V[n*d.Kd+ch-d.Kd] = E(acc)
				default:
					dmv.V[n*d.Vd+ch-2*d.Kd] = E(acc)
				}
			}
		}
	})
	return dmq, dmk, dmv
}
