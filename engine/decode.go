package engine

import (
	"math"

	"github.com/gomlx/compute/dtypes"
)

// The sampler's forward passes (prefill and each decode step) run op by op like training: backend
// matmuls on shared buffers, Go kernels between them. The KV cache is a pair of shared buffers per
// layer, written in place at each row's positions and multiplied directly, being already in the
// layout of an attention operand: values [B·KVH, S, hd], keys transposed [B·KVH, hd, S] so that
// scores are a plain product (for a few query rows the backend multiplies q·Kᵀ with K untransposed
// at a third of the speed). LoRA is applied unmerged: decode steps have a few rows, so the rank-r
// matmuls are tiny, and merging would copy the weights for every call.

// stepFunc feeds tokens [B][T] at positions [B][T] and returns the logits of the positions want
// accepts, indexed b·T+t (nil elsewhere). Only those rows go through the unembedding: a prefill
// needs one row per sequence unless prompt logprobs were asked for.
type stepFunc func(tok, pos [][]int, want func(b, t int) bool) ([][]float64, error)

// newDecodeStep returns the step function of one sampling loop over B rows and S cache slots, and
// a function that frees its cache.
func (e *Engine) newDecodeStep(a *Adapter, B, S int) (stepFunc, func()) {
	if e.dtype == dtypes.Float64 {
		d := newKVDecoder[float64](e, a, B, S)
		return d.step, d.long.free
	}
	d := newKVDecoder[float32](e, a, B, S)
	return d.step, d.long.free
}

type kvDecoder[E float] struct {
	e        *Engine
	B, S     int
	long     *arena[E] // cache and LoRA matrices: live for the whole loop
	kc, vc   []mat[E]  // per layer: keys [B·KVH, hd, S], values [B·KVH, S, hd]
	lora     map[string]loraMats[E]
	scale    E
	cos, sin []E // [S, hd/2]
}

func newKVDecoder[E float](e *Engine, a *Adapter, B, S int) *kvDecoder[E] {
	c := e.Config
	d := &kvDecoder[E]{e: e, B: B, S: S, long: newArena[E](e.direct.mm)}
	BK := B * c.NumKeyValueHeads
	for range c.NumHiddenLayers {
		// Slots are written before any query may attend to them; zeroing keeps stale values of a
		// reused buffer out of the masked-off products (0 × NaN would still be NaN).
		d.kc = append(d.kc, d.long.zeros(BK, c.HeadDim, S))
		d.vc = append(d.vc, d.long.zeros(BK, S, c.HeadDim))
	}
	d.lora, d.scale = loraOf(d.long, a, false)
	d.cos, d.sin = ropeTable[E](e.invFreq, S)
	return d
}

func (d *kvDecoder[E]) w(name string) mat[E] { return weightOf[E](d.e.direct, name) }

// linear is x·W (+ bias) + scale·(x·Aᵀ)·Bᵀ.
func (d *kvDecoder[E]) linear(ar *arena[E], x mat[E], path string) mat[E] {
	c := d.e.Config
	y := ar.matmul(x, d.w(c.weightName(path)), 0, c.weightIsOutIn(path))
	if b, ok := biasOf[E](d.e.direct, path); ok {
		addBias(y.v, b)
	}
	d.addLora(ar, x, y, path)
	return y
}

func (d *kvDecoder[E]) addLora(ar *arena[E], x, y mat[E], path string) {
	if lm, ok := d.lora[path]; ok {
		xa := ar.matmul(x, lm.a, 0, true)
		addScaled(y.v, ar.matmul(xa, lm.bT, 0, false).v, d.scale)
	}
}

func (d *kvDecoder[E]) step(tok, pos [][]int, want func(b, t int) bool) (_ [][]float64, err error) {
	defer recoverCompute(&err)
	if d.long.err != nil {
		return nil, d.long.err
	}
	e, c := d.e, d.e.Config
	ar := newArena[E](e.direct.mm)
	defer ar.free()
	B, T := d.B, len(tok[0])
	N, D, V := B*T, c.HiddenSize, c.VocabSize
	H, KVH, hd := c.NumAttentionHeads, c.NumKeyValueHeads, c.HeadDim
	G, BK, S, half := H/KVH, B*KVH, d.S, hd/2
	for b := range B {
		for t := range T {
			if pos[b][t] < 0 || pos[b][t] >= S {
				return nil, inputErr(-1, "prompt", "position %d outside the cache of %d", pos[b][t], S)
			}
		}
	}
	emb := d.w("model.embed_tokens.weight")
	h := ar.alloc(N, D)
	for b := range B {
		for t, id := range tok[b] {
			copy(h.v[(b*T+t)*D:(b*T+t+1)*D], emb.v[id*D:(id+1)*D])
		}
	}
	scale := E(1 / math.Sqrt(float64(hd)))
	for l := range c.NumHiddenLayers {
		p := layerPrefix(l)
		x, inv := ar.alloc(N, D), ar.alloc(N)
		rmsNorm(h.v, d.w(p+"input_layernorm.weight").v, c.RMSNormEps, x.v, inv.v)
		yq := d.linear(ar, x, p+"self_attn.q_proj")
		yk := d.linear(ar, x, p+"self_attn.k_proj")
		yv := d.linear(ar, x, p+"self_attn.v_proj")
		var qNorm, kNorm []E
		if c.Arch == ArchQwen3 {
			qNorm, kNorm = d.w(p+"self_attn.q_norm.weight").v, d.w(p+"self_attn.k_norm.weight").v
		}
		qh := ar.alloc(BK, G*T, hd)
		kc, vc := d.kc[l], d.vc[l]
		parallelRows(N, func(r0, r1 int) {
			buf, kr := make([]E, hd), make([]E, hd)
			var scratch E
			for n := r0; n < r1; n++ {
				b, t := n/T, n%T
				ps := pos[b][t]
				cs, sn := d.cos[ps*half:(ps+1)*half], d.sin[ps*half:(ps+1)*half]
				for hh := range H {
					kv, g := hh/G, hh%G
					src := yq.v[(n*H+hh)*hd : (n*H+hh+1)*hd]
					if qNorm != nil {
						rmsNormRow(src, qNorm, c.RMSNormEps, buf, &scratch)
						src = buf
					}
					row := (b*KVH+kv)*G*T + g*T + t
					ropeRow(src, qh.v[row*hd:(row+1)*hd], cs, sn)
				}
				for kv := range KVH {
					src := yk.v[(n*KVH+kv)*hd : (n*KVH+kv+1)*hd]
					if kNorm != nil {
						rmsNormRow(src, kNorm, c.RMSNormEps, buf, &scratch)
						src = buf
					}
					ropeRow(src, kr, cs, sn)
					base := (b*KVH*hd + kv*hd) * S
					for dd, v := range kr {
						kc.v[base+dd*S+ps] = v
					}
					slot := ((b*KVH+kv)*S + ps) * hd
					copy(vc.v[slot:slot+hd], yv.v[(n*KVH+kv)*hd:(n*KVH+kv+1)*hd])
				}
			}
		})
		probs := ar.matmul(qh, kc, BK, false) // [BK, G·T, S]
		parallelRows(BK*G*T, func(r0, r1 int) {
			for r := r0; r < r1; r++ {
				b, t := r/(KVH*G*T), r%T
				softmaxRow(probs.v[r*S:(r+1)*S], pos[b][t], scale) // a row sees slots 0…its position
			}
		})
		o := ar.matmul(probs, vc, BK, false) // [BK, G·T, hd]
		ot := ar.alloc(N, H*hd)
		headsToTokens(o.v, ot.v, B, T, KVH, G, hd)
		h2 := d.linear(ar, ot, p+"self_attn.o_proj")
		addScaled(h2.v, h.v, 1)
		x2, inv2 := ar.alloc(N, D), ar.alloc(N)
		rmsNorm(h2.v, d.w(p+"post_attention_layernorm.weight").v, c.RMSNormEps, x2.v, inv2.v)
		gate := d.linear(ar, x2, p+"mlp.gate_proj")
		up := d.linear(ar, x2, p+"mlp.up_proj")
		act, sig := ar.alloc(N, c.IntermediateSize), ar.alloc(N, c.IntermediateSize)
		siluGate(gate.v, up.v, sig.v, act.v)
		h = d.linear(ar, act, p+"mlp.down_proj")
		addScaled(h.v, h2.v, 1)
	}
	var picked []int
	for n := range N {
		if want(n/T, n%T) {
			picked = append(picked, n)
		}
	}
	out := make([][]float64, N)
	if len(picked) == 0 {
		return out, ar.err
	}
	M := len(picked)
	hm := ar.alloc(M, D)
	for i, n := range picked {
		copy(hm.v[i*D:(i+1)*D], h.v[n*D:(n+1)*D])
	}
	hf, invF := ar.alloc(M, D), ar.alloc(M)
	rmsNorm(hm.v, d.w("model.norm.weight").v, c.RMSNormEps, hf.v, invF.v)
	logits := d.linear(ar, hf, "lm_head")
	if ar.err != nil {
		return nil, ar.err
	}
	parallelRows(M, func(r0, r1 int) {
		for i := r0; i < r1; i++ {
			row := make([]float64, V)
			for j, v := range logits.v[i*V : (i+1)*V] {
				row[j] = float64(v)
			}
			out[picked[i]] = row
		}
	})
	return out, nil
}
