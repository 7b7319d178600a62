package engine

import (
	"math"

	"github.com/skein-ai/skein/engine/internal/kernels"
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
const deltaChunk = 64

// deltaNetLayer is a Gated DeltaNet layer's weights.
type deltaNetLayer[E float] struct {
	q, k, v, z, a, b, out *linear[E]
	conv                  []E // [C, K] depthwise taps, channels in in_proj_qkv's row order
	dtBias, aLog          []E // [Hv]
	norm                  []E // [dv] the gated RMSNorm's weight (plain, not zero-centred)
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

// deltaState is a sampling loop's per-row state of one DeltaNet layer.
type deltaState[E float] struct {
	conv mat[E] // [B, C, K-1]: each channel's last K-1 conv inputs, oldest first
	S    mat[E] // [B, Hv, dk, dv]
}

// deltaActs are what a DeltaNet layer's backward pass reads.
type deltaActs[E float] struct {
	pre        mat[E] // [N, C] conv outputs before SiLU
	qh, kh     mat[E] // [N, Kd] normalised queries (·1/√dk) and keys
	qInv, kInv []E    // [N·Hk] 1/‖q‖, 1/‖k‖ (with HF's 1e-6 inside the root)
	v          mat[E] // [N, Vd] values (after conv and SiLU)
	g, beta    []E    // [N·Hv] log-decay and β
	dgda       []E    // [N·Hv] dg/da = −exp(A_log)·softplus'(a + dt_bias)
	z, o       mat[E] // [N, Vd] gate pre-activation and the rule's output
	oInv       []E    // [N·Hv] the gated norm's 1/rms
	ckpt       []E    // [B·Hv, chunks, dk·dv]: the state before each chunk's first token
}

func sigmoid(x float64) float64 { return 1 / (1 + math.Exp(-x)) }

// softplus as torch's F.softplus (beta 1, threshold 20: the input itself above 20).
func softplus(x float64) float64 {
	if x > 20 {
		return x
	}
	return math.Log1p(math.Exp(x))
}

// forward is out_proj(DeltaNet(x1)) of layer l for its normed input x1, saving its activations
// into la (nil: a forward-only pass). The state starts at zero unless the pass continues the sampler's
// (a decode step), and a prefill leaves each row's state, taken after its own last token, in
// the sampler's cache. The stages: projections, the conv with its norms and gates
// (dnConvAndGates), the conv history kept for the sampler (keepHistory), the rule over every
// token (dnRecurrence), the gated norm (dnGatedNorm), out_proj.
func (L *deltaNetLayer[E]) forward(s *pass[E], l int, x1 mat[E], la *layerActs[E]) mat[E] {
	c := s.c
	st, cont, lens := s.kv.deltaState(l)
	in := dnConvInput[E]{q: s.linear(x1, L.q), k: s.linear(x1, L.k), v: s.linear(x1, L.v), st: st, cont: cont, d: c.dnDims(), T: s.T}
	z, av, bv := s.linear(x1, L.z), s.linear(x1, L.a), s.linear(x1, L.b)
	if s.ar.Err() != nil {
		return x1 // the pass has failed: any [N, D] tensor
	}
	a := s.dnConvAndGates(L, &in, av, bv)
	if st != nil {
		in.keepHistory(s.B, lens)
	}
	a.z = z
	s.dnRecurrence(&a, in.d, st, cont, lens, la != nil)
	y := s.dnGatedNorm(L, in.d, &a)
	out := s.linear(y, L.out)
	if la != nil {
		la.dn = a
	}
	return out
}

// dnConvInput is the conv's input: the q, k and v projections' outputs side by side as
// in_proj_qkv's channels, after the history a continuation carries.
type dnConvInput[E float] struct {
	q, k, v mat[E]
	st      *deltaState[E]
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
		return in.st.conv.V[(b*d.C+ch)*K1+K1+t]
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
		if !in.cont && lens != nil {
			end = lens[b]
		}
		for ch := range d.C {
			for j := range K1 {
				hist[(b*d.C+ch)*K1+j] = in.at(b, end-K1+j, ch)
			}
		}
	}
	copy(in.st.conv.V, hist)
}

// dnConvAndGates runs, per token, the causal depthwise conv with SiLU, q's and k's L2 norms
// (q also by 1/√dk), and the gates g = −exp(A_log)·softplus(a + dt_bias) and β = σ(b), keeping
// what the backward pass reads.
func (s *pass[E]) dnConvAndGates(L *deltaNetLayer[E], in *dnConvInput[E], av, bv mat[E]) deltaActs[E] {
	d, T, N := in.d, in.T, s.B*s.T
	K1 := d.K - 1
	a := deltaActs[E]{pre: s.ar.Alloc(N, d.C), qh: s.ar.Alloc(N, d.Kd), kh: s.ar.Alloc(N, d.Kd), v: s.ar.Alloc(N, d.Vd),
		qInv: make([]E, N*d.Hk), kInv: make([]E, N*d.Hk), g: make([]E, N*d.Hv), beta: make([]E, N*d.Hv), dgda: make([]E, N*d.Hv)}
	qScale := 1 / math.Sqrt(float64(d.dk))
	kernels.ParallelRows(N, func(n0, n1 int) {
		act := make([]float64, d.C)
		for n := n0; n < n1; n++ {
			b, t := n/T, n%T
			for ch := range d.C {
				var acc float64
				w := L.conv[ch*d.K : (ch+1)*d.K]
				for j := range d.K {
					acc += float64(w[j]) * float64(in.at(b, t-K1+j, ch))
				}
				pe := E(acc)
				a.pre.V[n*d.C+ch] = pe
				act[ch] = float64(pe) * sigmoid(float64(pe))
			}
			for hk := range d.Hk {
				for i, dst := range []mat[E]{a.qh, a.kh} {
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
func dnGates[E float](L *deltaNetLayer[E], d dnDims, n int, av, bv mat[E], a *deltaActs[E]) {
	for hv := range d.Hv {
		x := float64(av.V[n*d.Hv+hv]) + float64(L.dtBias[hv])
		A := math.Exp(float64(L.aLog[hv]))
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
func (s *pass[E]) dnRecurrence(a *deltaActs[E], d dnDims, st *deltaState[E], cont bool, lens []int, saving bool) {
	B, T := s.B, s.T
	a.o = s.ar.Alloc(B*T, d.Vd)
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
			if st != nil && !cont && lens != nil {
				end = lens[b]
			}
			for t := range T {
				if saving && t%deltaChunk == 0 {
					copy(a.ckpt[(r*chunks+t/deltaChunk)*dkdv:], S)
				}
				n := b*T + t
				deltaStep(S, S, a.qh.V[n*d.Kd+hk*d.dk:n*d.Kd+(hk+1)*d.dk], a.kh.V[n*d.Kd+hk*d.dk:n*d.Kd+(hk+1)*d.dk],
					a.v.V[n*d.Vd+hv*d.dv:n*d.Vd+(hv+1)*d.dv], a.g[n*d.Hv+hv], a.beta[n*d.Hv+hv], a.o.V[n*d.Vd+hv*d.dv:n*d.Vd+(hv+1)*d.dv], u, ones, d.dv)
				if st != nil && !cont && t == end-1 {
					copy(st.S.V[r*dkdv:(r+1)*dkdv], S)
				}
			}
			if cont {
				copy(st.S.V[r*dkdv:(r+1)*dkdv], S)
			}
		}
	})
}

// dnGatedNorm is the gated RMSNorm per value head, w ⊙ o/rms(o) ⊙ silu(z), keeping each head's
// 1/rms in a.oInv.
func (s *pass[E]) dnGatedNorm(L *deltaNetLayer[E], d dnDims, a *deltaActs[E]) mat[E] {
	N := s.B * s.T
	y := s.ar.Alloc(N, d.Vd)
	a.oInv = make([]E, N*d.Hv)
	eps := s.c.RMSNormEps
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
				y.V[r*d.dv+j] = L.norm[j] * (x * iv) * E(zz*sigmoid(zz))
			}
		}
	})
	return y
}

// deltaStep is one token of the rule from state src to dst [dk, dv] (the same slice, or
// another: the backward pass's recomputation keeps every state of a chunk): decay, delta update,
// and the output o = Sᵀq; u is scratch of dv and ones dk·dv ones. Every pass over the state goes
// through the vector row kernels.
func deltaStep[E float](dst, src, q, k, v []E, g, beta E, o, u, ones []E, dv int) {
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
func onesOf[E float](n int) []E {
	v := make([]E, n)
	for i := range v {
		v[i] = 1
	}
	return v
}

// backward takes d loss/d(the mixer's output) dh2 and returns d loss/d(its input x1) (nil when
// !needDX: layer 0, whose input gradient is not needed), adding the LoRA
// gradients of q, k, v, z and out_proj on the way. The forward's stages in reverse: out_proj,
// the gated norm (dnGatedNormBack), the rule (dnRecurrenceBack: the states recomputed a chunk at
// a time from the forward's checkpoints and walked backwards, reference §3), the norms and gates
// (dnGatesBack), the conv (dnConvBack), the projections.
func (L *deltaNetLayer[E]) backward(s *pass[E], l int, dh2 mat[E], la *layerActs[E], needDX bool) *mat[E] {
	a := &la.dn
	d := s.c.dnDims()
	dy := s.linearBack(dh2, L.out, true)
	dO, dz := s.dnGatedNormBack(L, d, a, *dy)
	g := s.dnRecurrenceBack(d, a, dO)
	dpre, da, db := s.dnGatesBack(d, a, g)
	dmq, dmk, dmv := s.dnConvBack(L, d, dpre)
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
			s.ar.Add(*dx1, *dx)
		}
	}
	return dx1
}

// dnGatedNormBack takes d loss/dy of y = w ⊙ (o·inv) ⊙ silu(z) to d loss/do and d loss/dz.
func (s *pass[E]) dnGatedNormBack(L *deltaNetLayer[E], d dnDims, a *deltaActs[E], dy mat[E]) (dO, dz mat[E]) {
	N := s.B * s.T
	dO, dz = s.ar.Alloc(N, d.Vd), s.ar.Alloc(N, d.Vd)
	kernels.ParallelRows(N*d.Hv, func(r0, r1 int) {
		dn := make([]E, d.dv)
		for r := r0; r < r1; r++ {
			iv := a.oInv[r]
			for j := range d.dv {
				zz := float64(a.z.V[r*d.dv+j])
				sg := sigmoid(zz)
				gy := dy.V[r*d.dv+j]
				dn[j] = gy * E(zz*sg)
				dz.V[r*d.dv+j] = gy * L.norm[j] * a.o.V[r*d.dv+j] * iv * E(sg*(1+zz*(1-sg)))
			}
			rmsNormRowBack(dn, a.o.V[r*d.dv:(r+1)*d.dv], L.norm, iv, dO.V[r*d.dv:(r+1)*d.dv])
		}
	})
	return dO, dz
}

// dnRuleGrads are the rule's input gradients: d loss/d(normalised q, k), d loss/dv, and per
// (token, value head) d loss/dg and d loss/dβ.
type dnRuleGrads[E float] struct {
	dqh, dkh, dv mat[E]
	dg, dbeta    []E
}

// dnRecurrenceBack walks the rule backwards for every (row, key head): the value heads that
// share a key head add into the same dq and dk rows, so one worker owns them all.
func (s *pass[E]) dnRecurrenceBack(d dnDims, a *deltaActs[E], dO mat[E]) dnRuleGrads[E] {
	B, T, N := s.B, s.T, s.B*s.T
	g := dnRuleGrads[E]{dqh: s.ar.Zeros(N, d.Kd), dkh: s.ar.Zeros(N, d.Kd), dv: s.ar.Alloc(N, d.Vd), dg: make([]E, N*d.Hv), dbeta: make([]E, N*d.Hv)}
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
type deltaBackScratch[E float] struct {
	dS, ones             []E
	r, du, e, scratch, u []E
}

func newDeltaBackScratch[E float](d dnDims) *deltaBackScratch[E] {
	return &deltaBackScratch[E]{dS: make([]E, d.dk*d.dv), ones: onesOf[E](d.dk * d.dv),
		r: make([]E, d.dv), du: make([]E, d.dv), e: make([]E, d.dv), scratch: make([]E, d.dv), u: make([]E, d.dv)}
}

// token is the rule's backward at token n of value head hv (key head hk), from the state before
// it (prev) and after it (cur) and d loss/do (dO): it adds into g's dq and dk rows, writes dv,
// dg and dβ, and moves w.dS to the state before the token.
func (w *deltaBackScratch[E]) token(d dnDims, a *deltaActs[E], dO mat[E], g *dnRuleGrads[E], n, hk, hv int, prev, cur []E) {
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
func (s *pass[E]) dnGatesBack(d dnDims, a *deltaActs[E], g dnRuleGrads[E]) (dpre, da, db mat[E]) {
	N := s.B * s.T
	dpre = s.ar.Alloc(N, d.C)
	da, db = s.ar.Alloc(N, d.Hv), s.ar.Alloc(N, d.Hv)
	qScale := 1 / math.Sqrt(float64(d.dk))
	kernels.ParallelRows(N, func(n0, n1 int) {
		for n := n0; n < n1; n++ {
			for hk := range d.Hk {
				for i, m := range []struct {
					nrm, dn mat[E]
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
func (s *pass[E]) dnConvBack(L *deltaNetLayer[E], d dnDims, dpre mat[E]) (dmq, dmk, dmv mat[E]) {
	T, N := s.T, s.B*s.T
	dmq, dmk, dmv = s.ar.Alloc(N, d.Kd), s.ar.Alloc(N, d.Kd), s.ar.Alloc(N, d.Vd)
	K1 := d.K - 1
	kernels.ParallelRows(N, func(n0, n1 int) {
		for n := n0; n < n1; n++ {
			b, t := n/T, n%T
			for ch := range d.C {
				var acc float64
				for j := range d.K {
					if tt := t + K1 - j; tt < T {
						acc += float64(L.conv[ch*d.K+j]) * float64(dpre.V[(b*T+tt)*d.C+ch])
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
