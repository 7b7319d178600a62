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

// deltaNet is h + out_proj(DeltaNet(norm(h))) of layer l, saving its activations into la (nil:
// a forward-only pass). The state starts at zero unless the pass continues the sampler's
// (a decode step), and a prefill leaves each row's state, taken after its own last token, in
// the sampler's cache.
func (s *pass[E]) deltaNet(l int, h mat[E], la *layerActs[E]) mat[E] {
	c, Ly := s.c, &s.m.layers[l]
	L := Ly.dn
	d := c.dnDims()
	B, T, N, D := s.B, s.T, s.B*s.T, c.HiddenSize
	x1, inv1 := s.ar.Alloc(N, D), s.ar.Alloc(N)
	kernels.RMSNorm(h.V, Ly.inputNorm, c.RMSNormEps, x1.V, inv1.V)
	mq, mk, mv := s.linear(x1, L.q), s.linear(x1, L.k), s.linear(x1, L.v)
	z, av, bv := s.linear(x1, L.z), s.linear(x1, L.a), s.linear(x1, L.b)
	if s.ar.Err != nil {
		return h
	}
	st, cont, lens := s.kv.deltaState(l)
	K1 := d.K - 1
	// in is conv input (b, t, ch); t < 0 reads the cached history of a continuation (zeros at a
	// sequence start, as HF's left padding).
	in := func(b, t, ch int) E {
		if t < 0 {
			if !cont {
				return 0
			}
			return st.conv.V[(b*d.C+ch)*K1+K1+t]
		}
		n := b*T + t
		switch {
		case ch < d.Kd:
			return mq.V[n*d.Kd+ch]
		case ch < 2*d.Kd:
			return mk.V[n*d.Kd+ch-d.Kd]
		}
		return mv.V[n*d.Vd+ch-2*d.Kd]
	}
	pre := s.ar.Alloc(N, d.C)
	qh, kh, v := s.ar.Alloc(N, d.Kd), s.ar.Alloc(N, d.Kd), s.ar.Alloc(N, d.Vd)
	qInv, kInv := make([]E, N*d.Hk), make([]E, N*d.Hk)
	g, beta, dgda := make([]E, N*d.Hv), make([]E, N*d.Hv), make([]E, N*d.Hv)
	qScale := 1 / math.Sqrt(float64(d.dk))
	kernels.ParallelRows(N, func(n0, n1 int) {
		act := make([]float64, d.C)
		for n := n0; n < n1; n++ {
			b, t := n/T, n%T
			for ch := range d.C {
				var acc float64
				w := L.conv[ch*d.K : (ch+1)*d.K]
				for j := range d.K {
					acc += float64(w[j]) * float64(in(b, t-K1+j, ch))
				}
				pe := E(acc)
				pre.V[n*d.C+ch] = pe
				act[ch] = float64(pe) * sigmoid(float64(pe))
			}
			for hk := range d.Hk {
				for i, dst := range []mat[E]{qh, kh} {
					seg := act[i*d.Kd+hk*d.dk : i*d.Kd+(hk+1)*d.dk]
					var ss float64
					for _, x := range seg {
						ss += x * x
					}
					iv := 1 / math.Sqrt(ss+1e-6)
					if i == 0 {
						qInv[n*d.Hk+hk] = E(iv)
						iv *= qScale
					} else {
						kInv[n*d.Hk+hk] = E(iv)
					}
					out := dst.V[n*d.Kd+hk*d.dk : n*d.Kd+(hk+1)*d.dk]
					for j, x := range seg {
						out[j] = E(x * iv)
					}
				}
			}
			for j := range d.Vd {
				v.V[n*d.Vd+j] = E(act[2*d.Kd+j])
			}
			for hv := range d.Hv {
				x := float64(av.V[n*d.Hv+hv]) + float64(L.dtBias[hv])
				A := math.Exp(float64(L.aLog[hv]))
				g[n*d.Hv+hv] = E(-A * softplus(x))
				dsp := 1.0 // softplus' = σ, 1 where torch's softplus returns its input
				if x <= 20 {
					dsp = sigmoid(x)
				}
				dgda[n*d.Hv+hv] = E(-A * dsp)
				beta[n*d.Hv+hv] = E(sigmoid(float64(bv.V[n*d.Hv+hv])))
			}
		}
	})
	if st != nil {
		// The conv history the sampler keeps: the last K-1 inputs before each row's end (its
		// prompt's last token in a prefill, the step's last token in a continuation), computed
		// before it is overwritten, since in reads the old one.
		hist := make([]E, B*d.C*K1)
		for b := range B {
			end := T
			if !cont && lens != nil {
				end = lens[b]
			}
			for ch := range d.C {
				for j := range K1 {
					hist[(b*d.C+ch)*K1+j] = in(b, end-K1+j, ch)
				}
			}
		}
		copy(st.conv.V, hist)
	}
	o := s.ar.Alloc(N, d.Vd)
	saving := la != nil
	chunks := (T + deltaChunk - 1) / deltaChunk
	var ckpt []E
	if saving {
		ckpt = make([]E, B*d.Hv*chunks*d.dk*d.dv)
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
					copy(ckpt[(r*chunks+t/deltaChunk)*dkdv:], S)
				}
				n := b*T + t
				deltaStep(S, S, qh.V[n*d.Kd+hk*d.dk:n*d.Kd+(hk+1)*d.dk], kh.V[n*d.Kd+hk*d.dk:n*d.Kd+(hk+1)*d.dk],
					v.V[n*d.Vd+hv*d.dv:n*d.Vd+(hv+1)*d.dv], g[n*d.Hv+hv], beta[n*d.Hv+hv], o.V[n*d.Vd+hv*d.dv:n*d.Vd+(hv+1)*d.dv], u, ones, d.dv)
				if st != nil && !cont && t == end-1 {
					copy(st.S.V[r*dkdv:(r+1)*dkdv], S)
				}
			}
			if cont {
				copy(st.S.V[r*dkdv:(r+1)*dkdv], S)
			}
		}
	})
	// Gated RMSNorm per value head: w ⊙ o/rms(o) ⊙ silu(z).
	y := s.ar.Alloc(N, d.Vd)
	oInv := make([]E, N*d.Hv)
	kernels.ParallelRows(N*d.Hv, func(r0, r1 int) {
		for r := r0; r < r1; r++ {
			seg := o.V[r*d.dv : (r+1)*d.dv]
			var ss float64
			for _, x := range seg {
				ss += float64(x) * float64(x)
			}
			iv := E(1 / math.Sqrt(ss/float64(d.dv)+c.RMSNormEps))
			oInv[r] = iv
			for j, x := range seg {
				zz := float64(z.V[r*d.dv+j])
				y.V[r*d.dv+j] = L.norm[j] * (x * iv) * E(zz*sigmoid(zz))
			}
		}
	})
	out := s.linear(y, L.out)
	kernels.AddScaled(out.V, h.V, 1)
	if saving {
		la.x1, la.inv1 = x1, inv1
		la.dn = deltaActs[E]{pre: pre, qh: qh, kh: kh, qInv: qInv, kInv: kInv, v: v, g: g, beta: beta, dgda: dgda, z: z, o: o, oInv: oInv, ckpt: ckpt}
	}
	return out
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

// deltaNetBack takes d loss/d(the mixer's residual output) dh2 and returns d loss/d(the layer's
// input), added into dh2 (nil for layer 0, whose input gradient is not needed), adding the LoRA
// gradients of q, k, v, z and out_proj on the way. The states are recomputed a chunk at a time
// from the forward's checkpoints and walked backwards (reference §3).
func (s *pass[E]) deltaNetBack(l int, dh2 mat[E]) mat[E] {
	c, Ly := s.c, &s.m.layers[l]
	L, la := Ly.dn, &s.train.acts[l]
	a := &la.dn
	d := c.dnDims()
	B, T, N := s.B, s.T, s.B*s.T
	dy := s.linearBack(dh2, L.out, true)
	// Gated norm: y = w ⊙ (o·inv) ⊙ silu(z).
	dO, dz := s.ar.Alloc(N, d.Vd), s.ar.Alloc(N, d.Vd)
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
	// The rule, backwards.
	dqh, dkh, dv := s.ar.Zeros(N, d.Kd), s.ar.Zeros(N, d.Kd), s.ar.Alloc(N, d.Vd)
	dg, dbeta := make([]E, N*d.Hv), make([]E, N*d.Hv)
	chunks := (T + deltaChunk - 1) / deltaChunk
	dkdv := d.dk * d.dv
	kernels.ParallelRows(B*d.Hk, func(r0, r1 int) {
		states := make([]E, (deltaChunk+1)*dkdv)
		dS := make([]E, dkdv)
		r, du, e, scratch, u := make([]E, d.dv), make([]E, d.dv), make([]E, d.dv), make([]E, d.dv), make([]E, d.dv)
		ones := onesOf[E](dkdv)
		for bk := r0; bk < r1; bk++ {
			b, hk := bk/d.Hk, bk%d.Hk
			for hv := hk * d.r; hv < (hk+1)*d.r; hv++ {
				row := b*d.Hv + hv
				clear(dS)
				for ch := chunks - 1; ch >= 0; ch-- {
					t0, t1 := ch*deltaChunk, min(T, (ch+1)*deltaChunk)
					copy(states[:dkdv], a.ckpt[(row*chunks+ch)*dkdv:(row*chunks+ch+1)*dkdv])
					for t := t0; t < t1; t++ {
						n := b*T + t
						deltaStep(states[(t-t0+1)*dkdv:(t-t0+2)*dkdv], states[(t-t0)*dkdv:(t-t0+1)*dkdv], a.qh.V[n*d.Kd+hk*d.dk:n*d.Kd+(hk+1)*d.dk], a.kh.V[n*d.Kd+hk*d.dk:n*d.Kd+(hk+1)*d.dk],
							a.v.V[n*d.Vd+hv*d.dv:n*d.Vd+(hv+1)*d.dv], a.g[n*d.Hv+hv], a.beta[n*d.Hv+hv], scratch, u, ones, d.dv)
					}
					for t := t1 - 1; t >= t0; t-- {
						n := b*T + t
						prev, cur := states[(t-t0)*dkdv:(t-t0+1)*dkdv], states[(t-t0+1)*dkdv:(t-t0+2)*dkdv]
						q := a.qh.V[n*d.Kd+hk*d.dk : n*d.Kd+(hk+1)*d.dk]
						k := a.kh.V[n*d.Kd+hk*d.dk : n*d.Kd+(hk+1)*d.dk]
						vv := a.v.V[n*d.Vd+hv*d.dv : n*d.Vd+(hv+1)*d.dv]
						do := dO.V[n*d.Vd+hv*d.dv : n*d.Vd+(hv+1)*d.dv]
						beta := a.beta[n*d.Hv+hv]
						decay := E(math.Exp(float64(a.g[n*d.Hv+hv])))
						dq, dk := dqh.V[n*d.Kd+hk*d.dk:n*d.Kd+(hk+1)*d.dk], dkh.V[n*d.Kd+hk*d.dk:n*d.Kd+(hk+1)*d.dk]
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
						dbeta[n*d.Hv+hv] = E(kernels.Dot(du, r))
						for j := range e {
							e[j] = beta * du[j]
						}
						copy(dv.V[n*d.Vd+hv*d.dv:n*d.Vd+(hv+1)*d.dv], e)
						// dŜ = dS − k·eᵀ; dk −= Ŝ·e; dg = ⟨dŜ, Ŝ⟩; dS ← decay·dŜ (into the previous state).
						var dgt float64
						for i := range d.dk {
							dSi, pi := dS[i*d.dv:(i+1)*d.dv], prev[i*d.dv:(i+1)*d.dv]
							kernels.Axpy(dSi, e, -k[i])
							dk[i] -= decay * E(kernels.Dot(pi, e))
							dgt += kernels.Dot(dSi, pi)
						}
						kernels.MulScaled(dS, dS, ones, decay)
						dg[n*d.Hv+hv] = E(float64(decay) * dgt)
					}
				}
			}
		}
	})
	// Per token: the norms of q and k, SiLU and the gates, back to the projections' outputs.
	dpre := s.ar.Alloc(N, d.C)
	da, db := s.ar.Alloc(N, d.Hv), s.ar.Alloc(N, d.Hv)
	qScale := 1 / math.Sqrt(float64(d.dk))
	kernels.ParallelRows(N, func(n0, n1 int) {
		for n := n0; n < n1; n++ {
			for hk := range d.Hk {
				for i, m := range []struct {
					nrm, dn mat[E]
					inv     []E
					scale   float64
				}{{a.qh, dqh, a.qInv, qScale}, {a.kh, dkh, a.kInv, 1}} {
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
				dpre.V[n*d.C+ch] = E(float64(dv.V[n*d.Vd+j]) * sg * (1 + p*(1-sg)))
			}
			for hv := range d.Hv {
				i := n*d.Hv + hv
				bt := float64(a.beta[i])
				db.V[i] = E(float64(dbeta[i]) * bt * (1 - bt))
				da.V[i] = dg[i] * a.dgda[i]
			}
		}
	})
	// The conv, transposed: input m[t] fed outputs t … t+K-1 (training starts from zero history).
	dmq, dmk, dmv := s.ar.Alloc(N, d.Kd), s.ar.Alloc(N, d.Kd), s.ar.Alloc(N, d.Vd)
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
	needDX := l > 0
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
			kernels.AddScaled(dx1.V, dx.V, 1)
		}
	}
	if !needDX {
		return mat[E]{}
	}
	kernels.RMSNormBack(dx1.V, la.h.V, la.inv1.V, Ly.inputNorm, dh2.V, true)
	return dh2
}
