package engine

import (
	"math"

	"github.com/skein-ai/skein/engine/internal/backend"
	"github.com/skein-ai/skein/engine/internal/kernels"
)

// The backward pass of the transformer's layer (transformer.go), reading what its forward
// saved (layerActs, loraTap). Written out by hand: the same formulas the finite-difference
// tests check on every architecture.

// ropeBack is rope's transpose: rotation by −θ.
func (s *pass[E]) ropeBack(dy, dx []E, b, t int) {
	c, sn := s.ropeAt(b, t, t)
	half := len(c) // partial rotary: the dims past 2·half passed through
	for i := range half {
		d1, d2 := dy[i], dy[i+half]
		dx[i] = d1*c[i] + d2*sn[i]
		dx[i+half] = d2*c[i] - d1*sn[i]
	}
	copy(dx[2*half:], dy[2*half:])
}

// rmsNormRowBack writes rmsNormRow's input gradient into dx.
func rmsNormRowBack[E float](dy, x, w []E, inv E, dx []E) {
	var dot float64
	for i := range x {
		dot += float64(dy[i]) * float64(w[i]) * float64(x[i])
	}
	iv := float64(inv)
	c := E(iv * iv * iv * dot / float64(len(x)))
	for i := range x {
		dx[i] = inv*dy[i]*w[i] - x[i]*c
	}
}

// backward runs the pass backward from d loss/d(the head's input) (dhf, headRows's): through the
// final norm (h and invF its input and 1/rms), then every layer from the last, releasing each
// layer's activations and merged weights once its backward pass is done. It reports false when
// the pass was cancelled between layers.
func (s *pass[E]) backward(h, invF, dhf mat[E], marks []backend.Mark) bool {
	c := s.c
	dh := s.ar.Alloc(s.B*s.T, c.HiddenSize)
	s.ar.RMSNormBack(dhf, h, invF.V, s.m.norm, dh, false)
	for l := c.NumHiddenLayers - 1; l >= 0; l-- {
		if s.cancelled() {
			return false
		}
		m := s.ar.Mark()
		if s.train.recompute {
			// The layer's forward again, from its kept input, saving what its backward reads (and
			// its taps); everything it allocates goes with the backward's temporaries below.
			in := s.train.inputs[l]
			s.layer(l, in)
			s.train.acts[l].h = in
		}
		dh = s.layerBack(l, dh)
		s.ar.Release(m, s.ar.Mark())
		s.ar.Release(marks[l], marks[l+1])
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
	s.ar.RMSNormBack(*dx1, la.h, la.inv1.V, L.inputNorm, dh2, true)
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
	s.ar.RMSNormBack(dx2, la.h2, la.inv2.V, L.postNorm, dh2, true)
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
	s.ar.Add(*dx1, *dxk)
	s.ar.Add(*dx1, *dxv)
	return dx1
}

// attentionBack takes d loss/d(attention's output) and returns d loss/d(the q, k and v
// projections), in token layout.
func (s *pass[E]) attentionBack(A *attentionLayer[E], l int, dh2 mat[E], la *layerActs[E]) (dq, dk, dv mat[E]) {
	c := s.c
	T, BK := s.T, s.B*c.NumKeyValueHeads
	do := s.linearBack(dh2, A.o, true)
	var dgate mat[E]
	if la.gate.V != nil {
		// o_proj's input was o ⊙ σ(gate): do ⊙ σ(gate) to o, do ⊙ o ⊙ σ'(gate) to the gate rows.
		dgate = s.ar.Alloc(la.gate.Dims...)
		for i, g := range la.gate.V {
			sg := E(sigmoid(float64(g)))
			dgate.V[i] = do.V[i] * la.o.V[i] * sg * (1 - sg)
			do.V[i] *= sg
		}
	}
	dO, dOT := s.tokensToHeads(do)
	scale := E(1 / math.Sqrt(float64(c.HeadDim)))
	probs := la.p
	if probs.Buf == nil {
		probs = s.ar.MatMul(la.qh, la.khT, BK, false)
		kernels.SoftmaxCausal(probs.V, T, scale)
	}
	dP := s.ar.MatMul(dO, la.vhT, BK, false)  // [BK, G·T, T]
	dVT := s.ar.MatMul(dOT, probs, BK, false) // [BK, hd, T]
	kernels.SoftmaxBack(probs.V, dP.V, T, scale)
	dQ := s.ar.MatMul(dP, la.kh, BK, false)   // [BK, G·T, hd]
	dKT := s.ar.MatMul(la.qhT, dP, BK, false) // [BK, hd, T]
	dq, dk, dv = s.headsBack(A, l, dQ, dKT, dVT)
	if dgate.V != nil {
		dq = s.joinGate(dq, dgate)
	}
	return dq, dk, dv
}

// tokensToHeads copies d loss/d(attention output) from token layout [B·T, H·hd] into the
// attention layout dO [B·KVH, G·T, hd] and its transpose dOT [B·KVH, hd, G·T].
func (s *pass[E]) tokensToHeads(do *mat[E]) (dO, dOT mat[E]) {
	c, B, T := s.c, s.B, s.T
	H, KVH, hd := c.NumAttentionHeads, c.NumKeyValueHeads, c.HeadDim
	G, N, BK := H/KVH, B*T, B*KVH
	dO, dOT = s.ar.Alloc(BK, G*T, hd), s.ar.Alloc(BK, hd, G*T)
	kernels.ParallelRows(N, func(r0, r1 int) {
		for n := r0; n < r1; n++ {
			b, t := n/T, n%T
			for h := range H {
				kv, g := h/G, h%G
				row := (b*KVH+kv)*G*T + g*T + t
				src := do.V[(n*H+h)*hd : (n*H+h+1)*hd]
				copy(dO.V[row*hd:(row+1)*hd], src)
				base := (b*KVH + kv) * hd * G * T
				for d, v := range src {
					dOT.V[base+d*G*T+g*T+t] = v
				}
			}
		}
	})
	return dO, dOT
}

// headsBack takes the gradients of layer l's queries, keys and values in the attention layout
// back to token layout through RoPE and the head norms.
func (s *pass[E]) headsBack(L *attentionLayer[E], l int, dQ, dKT, dVT mat[E]) (dq, dk, dv mat[E]) {
	c := s.c
	la := &s.train.acts[l]
	B, T := s.B, s.T
	H, KVH, hd := c.NumAttentionHeads, c.NumKeyValueHeads, c.HeadDim
	G, N := H/KVH, B*T
	dq, dk, dv = s.ar.Alloc(N, H*hd), s.ar.Alloc(N, KVH*hd), s.ar.Alloc(N, KVH*hd)
	qNorm, kNorm := L.qNorm, L.kNorm
	kernels.ParallelRows(N, func(r0, r1 int) {
		buf, col := make([]E, hd), make([]E, hd)
		for n := r0; n < r1; n++ {
			b, t := n/T, n%T
			for h := range H {
				kv, g := h/G, h%G
				row := (b*KVH+kv)*G*T + g*T + t
				dst := dq.V[(n*H+h)*hd : (n*H+h+1)*hd]
				if qNorm == nil {
					s.ropeBack(dQ.V[row*hd:(row+1)*hd], dst, b, t)
					continue
				}
				s.ropeBack(dQ.V[row*hd:(row+1)*hd], buf, b, t)
				rmsNormRowBack(buf, la.yq.V[(n*H+h)*hd:(n*H+h+1)*hd], qNorm, la.qInv[n*H+h], dst)
			}
			for kv := range KVH {
				base := (b*KVH + kv) * hd * T
				for d := range hd {
					col[d] = dKT.V[base+d*T+t]
				}
				dst := dk.V[(n*KVH+kv)*hd : (n*KVH+kv+1)*hd]
				if kNorm == nil {
					s.ropeBack(col, dst, b, t)
				} else {
					s.ropeBack(col, buf, b, t)
					rmsNormRowBack(buf, la.yk.V[(n*KVH+kv)*hd:(n*KVH+kv+1)*hd], kNorm, la.kInv[n*KVH+kv], dst)
				}
				dvr := dv.V[(n*KVH+kv)*hd : (n*KVH+kv+1)*hd]
				for d := range hd {
					dvr[d] = dVT.V[base+d*T+t]
				}
			}
		}
	})
	return dq, dk, dv
}


