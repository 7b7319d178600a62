package cpu

import (
	"math"

	"github.com/skein-ai/skein/engine/internal/backend"
	"github.com/skein-ai/skein/engine/internal/kernels"
)

// Attend: probs = softmax over slots 0…Slot[n] of q·kᵀ/√HD (the rest 0), out = probs·v, the
// heads back in token layout.
func (s *step[E]) Attend(a *backend.Attention[E]) (probs, ot backend.Tensor[E]) {
	B, T := a.B, a.T
	H, KVH, hd := a.H, a.KVH, a.HD
	G, BK, S := H/KVH, B*KVH, a.Values.Dims[1]
	scale := E(1 / math.Sqrt(float64(hd)))
	if !a.KeepProbs && a.ChunkRows == 0 && T <= spanTokens {
		return backend.Tensor[E]{}, s.attendSpans(a)
	}
	if n := s.attnChunks(a, BK, G*T, S); n > 0 {
		return backend.Tensor[E]{}, s.attendInChunks(a, n)
	}
	probs = s.MatMul(a.QH, a.KeysT, BK, false) // [BK, G·T, S]
	kernels.ParallelRows(BK*G*T, func(r0, r1 int) {
		for r := r0; r < r1; r++ {
			b, t := r/(KVH*G*T), r%T
			kernels.SoftmaxRow(probs.V[r*S:(r+1)*S], a.Slot[b*T+t], scale) // a row sees slots 0…its own
		}
	})
	o := s.MatMul(probs, a.Values, BK, false) // [BK, G·T, hd]
	ot = s.Alloc(B*T, H*hd)
	headsToTokens(o.V, ot.V, B, T, KVH, G, hd)
	return probs, ot
}

// spanTokens is the most query tokens a row of a forward pass may have for its attention to run
// over the slots it sees only (attendSpans): a decode step's one token, or a few.
const spanTokens = 4

// attendSpans is Attend for a forward pass of few tokens a row (a decode step): each kv head's
// scores are computed over the slots its row sees, 0…its last position, not over every slot
// of the cache, whose S is the longest row's. A batch mixing a long request with short ones
// costs each row what it reads (issue 39: with one 576-slot row in a continuous loop every
// row of the batch attended over 576 slots), and a row's numbers do not depend on the slots
// its neighbours have. With G·T query rows a head, the product is a few rows by a span: it is
// bound by reading the keys, so axpys over each key row (the keys are kept transposed, [HD, S])
// read them once, as the GEMM would.
func (s *step[E]) attendSpans(a *backend.Attention[E]) backend.Tensor[E] {
	B, T := a.B, a.T
	H, KVH, hd := a.H, a.KVH, a.HD
	G, BK, S := H/KVH, B*KVH, a.Values.Dims[1]
	GT := G * T
	scale := E(1 / math.Sqrt(float64(hd)))
	o := s.Alloc(BK, GT, hd)
	if s.Err() != nil {
		return backend.Tensor[E]{}
	}
	q, kt, v := a.QH.V, a.KeysT.V, a.Values.V
	kernels.ParallelRows(BK, func(k0, k1 int) {
		most := 0
		for bk := k0; bk < k1; bk++ {
			for t := range T {
				most = max(most, a.Slot[bk/KVH*T+t]+1)
			}
		}
		p := make([]E, GT*most) // scores, then probabilities: [G·T, span] of one head at a time
		for bk := k0; bk < k1; bk++ {
			b := bk / KVH
			span := 0
			for t := range T {
				span = max(span, a.Slot[b*T+t]+1)
			}
			clear(p[:GT*span])
			qh, kh := q[bk*GT*hd:(bk+1)*GT*hd], kt[bk*hd*S:(bk+1)*hd*S]
			for d := range hd {
				keys := kh[d*S : d*S+span]
				for r := range GT {
					kernels.Axpy(p[r*span:(r+1)*span], keys, qh[r*hd+d])
				}
			}
			vh, oh := v[bk*S*hd:(bk+1)*S*hd], o.V[bk*GT*hd:(bk+1)*GT*hd]
			for r := range GT {
				last := a.Slot[b*T+r%T] // a row sees slots 0…its own
				pr, out := p[r*span:r*span+last+1], oh[r*hd:(r+1)*hd]
				kernels.SoftmaxRow(pr, last, scale)
				clear(out)
				for j, w := range pr {
					kernels.Axpy(out, vh[j*hd:(j+1)*hd], w)
				}
			}
		}
	})
	ot := s.Alloc(B*T, H*hd)
	headsToTokens(o.V, ot.V, B, T, KVH, G, hd)
	return ot
}

// attnProbsBytes bounds the attention probabilities a forward-only pass holds at once.
const attnProbsBytes = 64 << 20

// attnChunks is how many chunks of query rows each kv head's attention runs in when a
// forward-only float32 pass's probabilities [BK, G·T, S] would pass attnProbsBytes (a long
// prompt's prefill: 27 GB a layer for 40,960 tokens of an 8B shape), 0 when they fit or when
// the pass keeps them (training). Chunks have more rows than kernels.FewRowsF32, so every row
// goes through the GEMM as it does in one product.
func (s *step[E]) attnChunks(a *backend.Attention[E], BK, GT, S int) int {
	if _, ok := any(s).(*step[float32]); !ok || a.KeepProbs || !kernels.HaveGEMM() {
		return 0
	}
	rows := attnProbsBytes / 4 / S
	if a.ChunkRows > 0 {
		rows = a.ChunkRows
	} else if BK*GT <= rows {
		return 0
	}
	n := (GT + rows - 1) / rows
	return max(1, min(n, GT/(kernels.FewRowsF32()+1)))
}

// attendInChunks is Attend for a forward-only pass, one kv head at a time and its G·T query rows
// in n chunks of nearly equal size: each chunk's probabilities [rows, S] are computed, masked
// and multiplied by the values, then given back. Each row is the same products as in one pass.
func (s *step[E]) attendInChunks(a *backend.Attention[E], n int) backend.Tensor[E] {
	B, T := a.B, a.T
	H, KVH, hd := a.H, a.KVH, a.HD
	G, BK, S := H/KVH, B*KVH, a.Values.Dims[1]
	GT := G * T
	scale := float32(1 / math.Sqrt(float64(hd)))
	o := s.Alloc(BK, GT, hd)
	of, qf := any(o.V).([]float32), any(a.QH.V).([]float32)
	kf, vf := any(a.KeysT.V).([]float32), any(a.Values.V).([]float32)
	for bk := range BK {
		for i := range n {
			r0, r1 := GT*i/n, GT*(i+1)/n
			m := s.Mark()
			p := s.Alloc(r1-r0, S)
			if s.Err() != nil {
				break
			}
			pf := any(p.V).([]float32)
			kernels.MatMul(pf, qf[(bk*GT+r0)*hd:(bk*GT+r1)*hd], kf[bk*hd*S:(bk+1)*hd*S], 1, r1-r0, hd, S, false)
			kernels.ParallelRows(r1-r0, func(a0, a1 int) {
				for r := a0; r < a1; r++ {
					kernels.SoftmaxRow(pf[r*S:(r+1)*S], a.Slot[(bk/KVH)*T+(r0+r)%T], scale) // a row sees slots 0…its own
				}
			})
			kernels.MatMul(of[(bk*GT+r0)*hd:(bk*GT+r1)*hd], pf, vf[bk*S*hd:(bk+1)*S*hd], 1, r1-r0, S, hd, false)
			s.Release(m, s.Mark())
		}
	}
	ot := s.Alloc(B*T, H*hd)
	headsToTokens(o.V, ot.V, B, T, KVH, G, hd)
	return ot
}

// headsToTokens copies o [B·KVH, G·T, hd] into token layout [B·T, H·hd].
func headsToTokens[E backend.Float](o, dst []E, B, T, KVH, G, hd int) {
	H := KVH * G
	kernels.ParallelRows(B*T, func(r0, r1 int) {
		for n := r0; n < r1; n++ {
			b, t := n/T, n%T
			for h := range H {
				row := (b*KVH+h/G)*G*T + (h%G)*T + t
				copy(dst[(n*H+h)*hd:(n*H+h+1)*hd], o[row*hd:(row+1)*hd])
			}
		}
	})
}

// AttendBack: with P the probabilities (kept, or q·kᵀ again with the causal softmax), dO the
// output gradient in the attention layout: dP = dO·Vᵀ, dVᵀ = dOᵀ·P, dS = P⊙(dP − rowsum(P⊙dP))/√HD,
// dQ = dS·K, dKᵀ = Qᵀ·dS.
func (s *step[E]) AttendBack(a *backend.AttentionGrads[E], do backend.Tensor[E]) (dQ, dKT, dVT backend.Tensor[E]) {
	T, BK := a.T, a.B*a.KVH
	dO, dOT := s.tokensToHeads(a.Heads, do)
	scale := E(1 / math.Sqrt(float64(a.HD)))
	probs := a.Probs
	if probs.Buf == nil {
		probs = s.MatMul(a.QH, a.KeysT, BK, false)
		kernels.SoftmaxCausal(probs.V, T, scale)
	}
	dP := s.MatMul(dO, a.ValuesT, BK, false) // [BK, G·T, T]
	dVT = s.MatMul(dOT, probs, BK, false)    // [BK, hd, T]
	kernels.SoftmaxBack(probs.V, dP.V, T, scale)
	dQ = s.MatMul(dP, a.Keys, BK, false) // [BK, G·T, hd]
	dKT = s.MatMul(a.QHT, dP, BK, false) // [BK, hd, T]
	return dQ, dKT, dVT
}

// tokensToHeads copies d loss/d(attention output) from token layout [B·T, H·hd] into the
// attention layout dO [B·KVH, G·T, hd] and its transpose dOT [B·KVH, hd, G·T].
func (s *step[E]) tokensToHeads(g backend.Heads, do backend.Tensor[E]) (dO, dOT backend.Tensor[E]) {
	B, T := g.B, g.T
	H, KVH, hd := g.H, g.KVH, g.HD
	G, N, BK := H/KVH, B*T, B*KVH
	dO, dOT = s.Alloc(BK, G*T, hd), s.Alloc(BK, hd, G*T)
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

// HeadsBack: per token and head, the attention layout's gradient rotated back (by −θ) and,
// where a head norm was applied, through its backward.
func (s *step[E]) HeadsBack(a *backend.HeadsBack[E]) (dq, dk, dv backend.Tensor[E]) {
	B, T := a.B, a.T
	H, KVH, hd := a.H, a.KVH, a.HD
	G, N := H/KVH, B*T
	dq, dk, dv = s.Alloc(N, H*hd), s.Alloc(N, KVH*hd), s.Alloc(N, KVH*hd)
	qNorm, kNorm := a.QNorm.V, a.KNorm.V
	kernels.ParallelRows(N, func(r0, r1 int) {
		buf, col := make([]E, hd), make([]E, hd)
		for n := r0; n < r1; n++ {
			b, t := n/T, n%T
			cs, sn := a.Rot.At(n)
			for h := range H {
				kv, g := h/G, h%G
				row := (b*KVH+kv)*G*T + g*T + t
				dst := dq.V[(n*H+h)*hd : (n*H+h+1)*hd]
				if qNorm == nil {
					ropeBack(a.DQ.V[row*hd:(row+1)*hd], dst, cs, sn)
					continue
				}
				ropeBack(a.DQ.V[row*hd:(row+1)*hd], buf, cs, sn)
				rmsNormRowBack(buf, a.Q.V[(n*H+h)*hd:(n*H+h+1)*hd], qNorm, a.QInv.V[n*H+h], dst)
			}
			for kv := range KVH {
				base := (b*KVH + kv) * hd * T
				for d := range hd {
					col[d] = a.DKT.V[base+d*T+t]
				}
				dst := dk.V[(n*KVH+kv)*hd : (n*KVH+kv+1)*hd]
				if kNorm == nil {
					ropeBack(col, dst, cs, sn)
				} else {
					ropeBack(col, buf, cs, sn)
					rmsNormRowBack(buf, a.K.V[(n*KVH+kv)*hd:(n*KVH+kv+1)*hd], kNorm, a.KInv.V[n*KVH+kv], dst)
				}
				dvr := dv.V[(n*KVH+kv)*hd : (n*KVH+kv+1)*hd]
				for d := range hd {
					dvr[d] = a.DVT.V[base+d*T+t]
				}
			}
		}
	})
	return dq, dk, dv
}

// SplitGate: row n, head h: q = yq[n, h, :HD], gate = yq[n, h, HD:2·HD].
func (s *step[E]) SplitGate(yq backend.Tensor[E], H, hd int) (q, gate backend.Tensor[E]) {
	N := yq.Dims[0]
	q, gate = s.Alloc(N, H*hd), s.Alloc(N, H*hd)
	for n := range N {
		for h := range H {
			src := yq.V[(n*H+h)*2*hd:]
			copy(q.V[(n*H+h)*hd:(n*H+h+1)*hd], src[:hd])
			copy(gate.V[(n*H+h)*hd:(n*H+h+1)*hd], src[hd:2*hd])
		}
	}
	return q, gate
}

// JoinGate is SplitGate's inverse, for gradients: [N, H·hd] twice into [N, H·2·hd].
func (s *step[E]) JoinGate(dq, dgate backend.Tensor[E], H, hd int) backend.Tensor[E] {
	N := dq.Dims[0]
	out := s.Alloc(N, 2*H*hd)
	for n := range N {
		for h := range H {
			dst := out.V[(n*H+h)*2*hd:]
			copy(dst[:hd], dq.V[(n*H+h)*hd:(n*H+h+1)*hd])
			copy(dst[hd:2*hd], dgate.V[(n*H+h)*hd:(n*H+h+1)*hd])
		}
	}
	return out
}

// Gate: out = o·σ(gate), elementwise, or each row by its one gate number (gate [N, 1]).
func (s *step[E]) Gate(o, gate backend.Tensor[E]) backend.Tensor[E] {
	out := s.Alloc(o.Dims...)
	if s.Err() != nil {
		return out
	}
	w := len(o.V) / max(len(gate.V), 1) // 1: elementwise; the row's width: a gate a row
	for i, g := range gate.V {
		sg := E(sigmoid(float64(g)))
		for c := i * w; c < (i+1)*w; c++ {
			out.V[c] = o.V[c] * sg
		}
	}
	return out
}

// GateBack: dgate = Σ do·o·σ(g)(1−σ(g)) over the elements g gates, then do ← do·σ(g).
func (s *step[E]) GateBack(do, o, gate, dgate backend.Tensor[E]) {
	if s.Err() != nil {
		return
	}
	w := len(o.V) / max(len(gate.V), 1)
	for i, g := range gate.V {
		sg := E(sigmoid(float64(g)))
		var d E
		for c := i * w; c < (i+1)*w; c++ {
			d += do.V[c] * o.V[c]
			do.V[c] *= sg
		}
		dgate.V[i] = d * sg * (1 - sg)
	}
}

func sigmoid(x float64) float64 { return 1 / (1 + math.Exp(-x)) }
