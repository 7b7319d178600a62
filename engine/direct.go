package engine

import (
	"fmt"
	"math"
	"runtime/debug"
	"strings"

	"github.com/gomlx/compute"
)

// directBase is what an engine's forks share: the base weights as backend shared buffers and
// the compiled matmuls with their pool of step buffers.
type directBase struct {
	mm      *matmuls
	weights map[string]weightRef
}

type weightRef struct {
	buf  compute.Buffer
	flat any // []float32 or []float64
	dims []int
}

// layerActs are the activations of one decoder layer that its backward pass needs.
type layerActs[E float] struct {
	h, x1, inv1      mat[E] // layer input, its norm, 1/rms per token
	yq, yk           mat[E] // q, k projections before the Qwen3 head norms
	qInv, kInv       []E    // 1/rms per token and head (Qwen3)
	qh, qhT          mat[E] // queries [B·KVH, G·T, hd] and transposed [B·KVH, hd, G·T]
	kh, khT, vh, vhT mat[E] // keys and values [B·KVH, T, hd] and transposed [B·KVH, hd, T]
	p                mat[E] // attention probabilities [B·KVH, G·T, T]
	o                mat[E] // attention output, token layout [N, H·hd]
	h2, x2, inv2     mat[E] // residual after attention, its norm, 1/rms
	gate, up, act    mat[E] // MLP
	sig              mat[E] // σ(gate)
	B, T, KVH, G, hd int
}

// loraMats are one module's A and B for a pass (with the transposes its matmuls need), and the
// indices of their gradient accumulators.
type loraMats[E float] struct {
	a, b   mat[E] // A [r, in], B [out, r]
	aT, bT mat[E] // Aᵀ [in, r] for training's merge, Bᵀ [r, out] for decoding
	ai, bi int
}

// directStep is one chunk's forward (and backward) pass.
type directStep[E float] struct {
	e       *Engine
	c       *Config
	ar      *arena[E]
	lora    map[string]loraMats[E]
	scale   E
	taps    map[string]mat[E] // x·Aᵀ per module, for its gradients
	tapIn   map[string]mat[E] // x per module
	mergedW map[string]mat[E] // W + scale·Aᵀ·Bᵀ per module
	grads   [][]float64       // per adapter param, added to
	cos     []E               // [T, hd/2]
	sin     []E
	layers  []layerActs[E]
}

func (s *directStep[E]) w(name string) mat[E] { return weightOf[E](s.e.direct, name) }

// weightOf is a base weight as a tensor of the pass's element type.
func weightOf[E float](d *directBase, name string) mat[E] {
	r := d.weights[name]
	return mat[E]{buf: r.buf, v: r.flat.([]E), dims: r.dims}
}

// biasOf is the bias of the linear module at path, if it has one (Qwen2's q/k/v).
func biasOf[E float](d *directBase, path string) ([]E, bool) {
	r, ok := d.weights[path+".bias"]
	if !ok {
		return nil, false
	}
	return r.flat.([]E), true
}

// runDirect runs datums [lo,hi) of p: their logprobs and per-token losses go into res, their
// gradients are added to grads (when not nil), and their summed loss is returned.
func runDirect[E float](e *Engine, a *Adapter, p *prepared, lo, hi int, loss string, res *ForwardResult, grads [][]float64) (total float64, err error) {
	defer recoverCompute(&err)
	c := e.Config
	n := hi - lo
	maxLen := 0
	for i := lo; i < hi; i++ {
		maxLen = max(maxLen, len(p.tokens[i]))
	}
	// No padding rows and lengths only rounded up to a multiple of 16: a new shape costs a few
	// one-node matmul compiles (about 50 µs each), so power-of-two buckets would only waste work.
	B, T := n, padLen(maxLen)
	N := B * T
	s := &directStep[E]{e: e, c: c, ar: newArena[E](e.direct.mm),
		taps: map[string]mat[E]{}, tapIn: map[string]mat[E]{}, mergedW: map[string]mat[E]{}, grads: grads}
	defer s.ar.free()
	s.lora, s.scale = loraOf(s.ar, a, true)
	s.cos, s.sin = ropeTable[E](e.invFreq, T)

	// Embedding lookup.
	emb := s.w("model.embed_tokens.weight")
	D := c.HiddenSize
	h := s.ar.zeros(N, D)
	for b := range n {
		for t, tok := range p.tokens[lo+b] {
			copy(h.v[(b*T+t)*D:(b*T+t+1)*D], emb.v[tok*D:(tok+1)*D])
		}
	}
	// Memory: each layer's activations are released once nothing needs them (after its backward
	// pass, or after the next layer when there is none), so a step holds the forward activations,
	// one layer's backward temporaries and the logits, not everything it ever allocated.
	s.layers = make([]layerActs[E], c.NumHiddenLayers)
	marks := make([]arenaMark, c.NumHiddenLayers+1)
	for l := range c.NumHiddenLayers {
		marks[l] = s.ar.mark()
		h = s.layer(l, h, B, T)
		if grads == nil && l > 0 {
			s.ar.release(marks[l-1], marks[l])
		}
	}
	marks[c.NumHiddenLayers] = s.ar.mark()
	hf, invF := s.ar.alloc(N, D), make([]E, N)
	rmsNorm(h.v, s.w("model.norm.weight").v, c.RMSNormEps, hf.v, invF)
	logits := s.linear(hf, "lm_head")
	V := c.VocabSize

	// Per token: log p(target) = logit[target] − logsumexp. The logits row is overwritten by
	// exp(logit − max) on the way, which is all the backward pass needs of it.
	lp := make([]float64, N)
	sumExp := make([]float64, N)
	target := make([]int, N)
	for b := range n {
		copy(target[b*T:], p.targets[lo+b])
	}
	parallelRows(N, func(r0, r1 int) {
		for r := r0; r < r1; r++ {
			row := logits.v[r*V : (r+1)*V]
			m := rowMax(row)
			picked := row[target[r]]
			se := expShift(row, 1, m)
			sumExp[r] = se
			lp[r] = float64(picked-m) - math.Log(se)
		}
	})
	// Per-token loss and its derivative in lp.
	dlp := make([]float64, N)
	for b := range n {
		i := lo + b
		L := len(p.tokens[i])
		res.Logprobs[i] = append([]float64(nil), lp[b*T:b*T+L]...)
		res.Losses[i] = make([]float64, L)
		for t := range L {
			l, g := tokenLossGrad(loss, lp[b*T+t], p.weights[i][t], p.oldLP[i][t], p.adv[i][t], p.lo, p.hi, p.beta)
			res.Losses[i][t] = l
			dlp[b*T+t] = g
			total += l
		}
	}
	if grads == nil || s.ar.err != nil {
		return total, s.ar.err
	}

	// d loss/d logits = dlp·(onehot(target) − softmax), in place.
	parallelRows(N, func(r0, r1 int) {
		for r := r0; r < r1; r++ {
			row := logits.v[r*V : (r+1)*V]
			g := dlp[r]
			if g == 0 {
				clear(row)
				continue
			}
			k := E(-g / sumExp[r])
			for i := range row {
				row[i] *= k
			}
			row[target[r]] += E(g)
		}
	})
	dhf := *s.linearBack(logits, "lm_head", true)
	dh := s.ar.alloc(N, D)
	rmsNormBack(dhf.v, h.v, invF, s.w("model.norm.weight").v, dh.v, false)
	for l := c.NumHiddenLayers - 1; l >= 0; l-- {
		m := s.ar.mark()
		dh = s.layerBack(l, dh)
		s.ar.release(m, s.ar.mark())
		s.ar.release(marks[l], marks[l+1])
		for path := range s.mergedW { // this layer's merged weights were in the ranges just released
			if strings.HasPrefix(path, layerPrefix(l)) {
				delete(s.mergedW, path)
			}
		}
	}
	return total, s.ar.err
}

// loraOf copies an adapter's matrices into the arena (nil adapter: none) and returns its scale.
// Training merges with Aᵀ; decoding applies B unmerged, as Bᵀ.
func loraOf[E float](ar *arena[E], a *Adapter, training bool) (map[string]loraMats[E], E) {
	out := map[string]loraMats[E]{}
	if a == nil {
		return out, 0
	}
	r := a.Config.Rank
	for i, m := range a.mods {
		pa, pb := a.params[2*i], a.params[2*i+1]
		lm := loraMats[E]{a: ar.from(pa.w, pa.shape...), b: ar.from(pb.w, pb.shape...), ai: 2 * i, bi: 2*i + 1}
		if training {
			lm.aT = ar.alloc(m.In, r)
			transpose(lm.a.v, lm.aT.v, r, m.In, 1)
		} else {
			lm.bT = ar.alloc(r, m.Out)
			transpose(lm.b.v, lm.bT.v, m.Out, r, 1)
		}
		out[m.Path] = lm
	}
	return out, E(a.Config.Alpha / float64(r))
}

// ropeTable returns cos and sin [n, hd/2] of positions 0…n-1.
func ropeTable[E float](invFreq []float64, n int) (cos, sin []E) {
	half := len(invFreq)
	cos, sin = make([]E, n*half), make([]E, n*half)
	for p := range n {
		for i, f := range invFreq {
			cos[p*half+i], sin[p*half+i] = E(math.Cos(float64(p)*f)), E(math.Sin(float64(p)*f))
		}
	}
	return cos, sin
}

// recoverCompute turns a panic in the backend (a bug, not bad input: inputs are checked first)
// into an error, so one failed request does not take the server down. The caller's accumulators
// are only updated after a pass succeeds.
func recoverCompute(err *error) {
	if r := recover(); r != nil {
		*err = fmt.Errorf("engine: compute failed: %v\n%s", r, debug.Stack())
	}
}

// tokenLossGrad is one token's loss and its derivative in the token's logprob lp
// (w: CE weight, q: sampling logprob, adv: advantage).
func tokenLossGrad(kind string, lp, w, q, adv, lo, hi, beta float64) (loss, grad float64) {
	switch kind {
	case lossCrossEntropy:
		return -lp * w, -w
	case lossImportance:
		r := math.Exp(lp - q)
		return -r * adv, -r * adv
	case lossPPO:
		r := math.Exp(lp - q)
		clipped := min(max(r, lo), hi)
		if r*adv <= clipped*adv {
			return -r * adv, -r * adv
		}
		// The clipped branch is the minimum: its ratio is constant outside [lo, hi].
		if r > lo && r < hi {
			return -clipped * adv, -r * adv
		}
		return -clipped * adv, 0
	case lossCISPO:
		r := min(max(math.Exp(lp-q), lo), hi) // not differentiated
		return -r * lp * adv, -r * adv
	case lossDRO: // w is 1 where dro trains, 0 elsewhere (see droMask)
		d := lp - q
		return -w * (lp*adv - 0.5*beta*d*d), -w * (adv - beta*d)
	}
	return 0, 0
}

// weightName is the base weight a LoRA module path adapts: a tied lm_head is the embedding.
func (c *Config) weightName(path string) string {
	if path == "lm_head" && c.TieWordEmbeddings {
		return "model.embed_tokens.weight"
	}
	return path + ".weight"
}

// weightIsOutIn reports a module whose weight is stored [out, in] (a tied head: the embedding)
// rather than [in, out].
func (c *Config) weightIsOutIn(path string) bool { return path == "lm_head" && c.TieWordEmbeddings }

// linear is x·W (+ bias) for the module at path. With a LoRA on the module W is the merged
// W + scale·(B·A)ᵀ, one matmul instead of three (the rank-r matmuls are slow in the backend:
// little work per output element); x·Aᵀ is kept for the LoRA gradients.
func (s *directStep[E]) linear(x mat[E], path string) mat[E] {
	y := s.ar.matmul(x, s.merged(path), 0, s.c.weightIsOutIn(path))
	if b, ok := biasOf[E](s.e.direct, path); ok {
		addBias(y.v, b)
	}
	if lm, ok := s.lora[path]; ok && s.grads != nil { // only the LoRA gradients need x·Aᵀ
		s.taps[path] = s.ar.matmul(x, lm.a, 0, true) // [N, r]
		s.tapIn[path] = x
	}
	return y
}

// merged returns the module's weight, in its stored layout, with its LoRA folded in; built once
// per layer and pass.
func (s *directStep[E]) merged(path string) mat[E] {
	w := s.w(s.c.weightName(path))
	lm, ok := s.lora[path]
	if !ok {
		return w
	}
	if m, ok := s.mergedW[path]; ok {
		return m
	}
	var m mat[E]
	if s.c.weightIsOutIn(path) {
		m = s.ar.matmul(lm.b, lm.a, 0, false) // B·A [out, in]
	} else {
		m = s.ar.matmul(lm.aT, lm.b, 0, true) // Aᵀ·Bᵀ [in, out]
	}
	scaleAdd(m.v, w.v, s.scale)
	s.mergedW[path] = m
	return m
}

// linearBack adds the module's LoRA gradients for output gradient dy and returns d loss/dx
// (nil when !needDX).
func (s *directStep[E]) linearBack(dy mat[E], path string, needDX bool) *mat[E] {
	s.loraBack(dy, path)
	if !needDX {
		return nil
	}
	d := s.ar.matmul(dy, s.merged(path), 0, !s.c.weightIsOutIn(path))
	return &d
}

// loraBack adds dA = scale·(dy·B)ᵀ·x and dB = scale·dyᵀ·(x·Aᵀ) for the module at path. The
// rank-sized operands are transposed here so that every matmul is in the backend's plain layout.
func (s *directStep[E]) loraBack(dy mat[E], path string) {
	lm, ok := s.lora[path]
	if !ok {
		return
	}
	x := s.tapIn[path]
	r := lm.b.dims[1]
	dxa := s.ar.matmul(dy, lm.b, 0, false) // [N, r]
	dxaT := s.ar.alloc(r, dxa.dims[0])
	transpose(dxa.v, dxaT.v, dxa.dims[0], r, s.scale)
	dA := s.ar.matmul(dxaT, x, 0, false) // [r, in]
	gA := s.grads[lm.ai]
	for i, v := range dA.v {
		gA[i] += float64(v)
	}
	xa := s.taps[path]
	xaT := s.ar.alloc(r, xa.dims[0])
	transpose(xa.v, xaT.v, xa.dims[0], r, s.scale)
	dBt := s.ar.matmul(xaT, dy, 0, false) // [r, out]
	out := dy.dims[1]
	gB := s.grads[lm.bi]
	for j := range r {
		for o := range out {
			gB[o*r+j] += float64(dBt.v[j*out+o])
		}
	}
}

// transpose writes dst [cols, rows] = scale·srcᵀ for src [rows, cols].
func transpose[E float](src, dst []E, rows, cols int, scale E) {
	for i := range rows {
		for j := range cols {
			dst[j*rows+i] = scale * src[i*cols+j]
		}
	}
}

// layer runs decoder layer l on h [N, D] and keeps what its backward pass needs.
func (s *directStep[E]) layer(l int, h mat[E], B, T int) mat[E] {
	c := s.c
	p := layerPrefix(l)
	N, D := B*T, c.HiddenSize
	H, KVH, hd := c.NumAttentionHeads, c.NumKeyValueHeads, c.HeadDim
	G := H / KVH
	la := &s.layers[l]
	*la = layerActs[E]{h: h, B: B, T: T, KVH: KVH, G: G, hd: hd}

	la.x1, la.inv1 = s.ar.alloc(N, D), s.ar.alloc(N)
	rmsNorm(h.v, s.w(p+"input_layernorm.weight").v, c.RMSNormEps, la.x1.v, la.inv1.v)
	la.yq = s.linear(la.x1, p+"self_attn.q_proj")
	la.yk = s.linear(la.x1, p+"self_attn.k_proj")
	yv := s.linear(la.x1, p+"self_attn.v_proj")

	BK := B * KVH
	backward := s.grads != nil // Qᵀ and Vᵀ only serve the backward pass
	la.qh, la.kh, la.vh = s.ar.alloc(BK, G*T, hd), s.ar.alloc(BK, T, hd), s.ar.alloc(BK, T, hd)
	la.khT = s.ar.alloc(BK, hd, T)
	if backward {
		la.qhT, la.vhT = s.ar.alloc(BK, hd, G*T), s.ar.alloc(BK, hd, T)
	}
	var qNorm, kNorm []E
	if c.Arch == ArchQwen3 {
		qNorm, kNorm = s.w(p+"self_attn.q_norm.weight").v, s.w(p+"self_attn.k_norm.weight").v
		la.qInv, la.kInv = make([]E, N*H), make([]E, N*KVH)
	}
	// Heads into the attention layout, through the Qwen3 norm and RoPE on the way.
	parallelRows(N, func(r0, r1 int) {
		buf := make([]E, hd)
		for n := r0; n < r1; n++ {
			b, t := n/T, n%T
			for h := range H {
				kv, g := h/G, h%G
				src := la.yq.v[(n*H+h)*hd : (n*H+h+1)*hd]
				if qNorm != nil {
					rmsNormRow(src, qNorm, c.RMSNormEps, buf, &la.qInv[n*H+h])
					src = buf
				}
				row := (b*KVH+kv)*G*T + g*T + t
				dst := la.qh.v[row*hd : (row+1)*hd]
				s.rope(src, dst, t)
				if !backward {
					continue
				}
				base := (b*KVH + kv) * hd * G * T
				for d, v := range dst {
					la.qhT.v[base+d*G*T+g*T+t] = v
				}
			}
			for kv := range KVH {
				src := la.yk.v[(n*KVH+kv)*hd : (n*KVH+kv+1)*hd]
				if kNorm != nil {
					rmsNormRow(src, kNorm, c.RMSNormEps, buf, &la.kInv[n*KVH+kv])
					src = buf
				}
				row := (b*KVH+kv)*T + t
				kr, vr := la.kh.v[row*hd:(row+1)*hd], la.vh.v[row*hd:(row+1)*hd]
				s.rope(src, kr, t)
				copy(vr, yv.v[(n*KVH+kv)*hd:(n*KVH+kv+1)*hd])
				base := (b*KVH + kv) * hd * T
				for d := range hd {
					la.khT.v[base+d*T+t] = kr[d]
				}
				if backward {
					for d := range hd {
						la.vhT.v[base+d*T+t] = vr[d]
					}
				}
			}
		}
	})
	scale := E(1 / math.Sqrt(float64(hd)))
	la.p = s.ar.matmul(la.qh, la.khT, BK, false) // [BK, G·T, T]
	softmaxCausal(la.p.v, T, scale)
	o := s.ar.matmul(la.p, la.vh, BK, false) // [BK, G·T, hd]
	if s.e.recomputeProbs(T) {
		// Long sequences: the probabilities outweigh everything else a layer keeps, so the
		// backward pass computes them again (one more matmul) instead of holding them.
		s.ar.releaseOne(la.p)
		la.p = mat[E]{}
	}
	la.o = s.ar.alloc(N, H*hd)
	headsToTokens(o.v, la.o.v, B, T, KVH, G, hd)

	attn := s.linear(la.o, p+"self_attn.o_proj")
	la.h2 = attn
	addScaled(la.h2.v, h.v, 1)
	la.x2, la.inv2 = s.ar.alloc(N, D), s.ar.alloc(N)
	rmsNorm(la.h2.v, s.w(p+"post_attention_layernorm.weight").v, c.RMSNormEps, la.x2.v, la.inv2.v)
	la.gate = s.linear(la.x2, p+"mlp.gate_proj")
	la.up = s.linear(la.x2, p+"mlp.up_proj")
	la.act = s.ar.alloc(N, c.IntermediateSize)
	la.sig = s.ar.alloc(N, c.IntermediateSize)
	siluGate(la.gate.v, la.up.v, la.sig.v, la.act.v)
	out := s.linear(la.act, p+"mlp.down_proj")
	addScaled(out.v, la.h2.v, 1)
	if s.grads == nil || !s.e.keepsMerged() {
		s.dropMerged()
	}
	return out
}

// dropMerged gives back the merged weights built so far: the pass holds one layer's worth, and
// the backward pass merges again (a rank-r matmul and one pass over the weight). Models whose
// merged weights are small next to the step budget keep them instead (keepsMerged).
func (s *directStep[E]) dropMerged() {
	for path, m := range s.mergedW {
		s.ar.releaseOne(m)
		delete(s.mergedW, path)
	}
}

// headsToTokens copies o [B·KVH, G·T, hd] into token layout [B·T, H·hd].
func headsToTokens[E float](o, dst []E, B, T, KVH, G, hd int) {
	H := KVH * G
	parallelRows(B*T, func(r0, r1 int) {
		for n := r0; n < r1; n++ {
			b, t := n/T, n%T
			for h := range H {
				row := (b*KVH+h/G)*G*T + (h%G)*T + t
				copy(dst[(n*H+h)*hd:(n*H+h+1)*hd], o[row*hd:(row+1)*hd])
			}
		}
	})
}

// rope rotates one head vector at position t (HF rotate_half convention).
func (s *directStep[E]) rope(x, y []E, t int) {
	half := len(x) / 2
	ropeRow(x, y, s.cos[t*half:(t+1)*half], s.sin[t*half:(t+1)*half])
}

// ropeRow rotates x into y by the angles whose cosines and sines are c and sn.
func ropeRow[E float](x, y, c, sn []E) {
	half := len(x) / 2
	for i := range half {
		x1, x2 := x[i], x[i+half]
		y[i] = x1*c[i] - x2*sn[i]
		y[i+half] = x2*c[i] + x1*sn[i]
	}
}

// layerPrefix is the HF name prefix of layer l's weights.
func layerPrefix(l int) string { return fmt.Sprintf("model.layers.%d.", l) }

// ropeBack is rope's transpose: rotation by −θ.
func (s *directStep[E]) ropeBack(dy, dx []E, t int) {
	half := len(dy) / 2
	c, sn := s.cos[t*half:(t+1)*half], s.sin[t*half:(t+1)*half]
	for i := range half {
		d1, d2 := dy[i], dy[i+half]
		dx[i] = d1*c[i] + d2*sn[i]
		dx[i+half] = d2*c[i] - d1*sn[i]
	}
}

// rmsNormRow normalises one row (a Qwen3 head), storing 1/rms in inv.
func rmsNormRow[E float](x, w []E, eps float64, y []E, inv *E) {
	var ss float64
	for _, v := range x {
		ss += float64(v) * float64(v)
	}
	iv := E(1 / math.Sqrt(ss/float64(len(x))+eps))
	*inv = iv
	for i, v := range x {
		y[i] = v * iv * w[i]
	}
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

// layerBack takes d loss/d(layer l's output) and returns d loss/d(its input), adding LoRA
// gradients on the way. Layer 0's input gradient is not needed (embeddings are frozen): nil.
func (s *directStep[E]) layerBack(l int, dh mat[E]) mat[E] {
	c := s.c
	p := layerPrefix(l)
	la := &s.layers[l]
	B, T, KVH, G, hd := la.B, la.T, la.KVH, la.G, la.hd
	H, N, BK := KVH*G, B*T, B*KVH

	// MLP.
	da := s.linearBack(dh, p+"mlp.down_proj", true)
	dg, du := s.ar.alloc(N, c.IntermediateSize), s.ar.alloc(N, c.IntermediateSize)
	siluGateBack(da.v, la.gate.v, la.up.v, la.sig.v, dg.v, du.v)
	dx2 := s.linearBack(dg, p+"mlp.gate_proj", true)
	addScaled(dx2.v, s.linearBack(du, p+"mlp.up_proj", true).v, 1)
	dh2 := dh // the residual passes dh through; the norm's gradient is added to it
	rmsNormBack(dx2.v, la.h2.v, la.inv2.v, s.w(p+"post_attention_layernorm.weight").v, dh2.v, true)

	// Attention.
	do := s.linearBack(dh2, p+"self_attn.o_proj", true)
	dO, dOT := s.ar.alloc(BK, G*T, hd), s.ar.alloc(BK, hd, G*T)
	parallelRows(N, func(r0, r1 int) {
		for n := r0; n < r1; n++ {
			b, t := n/T, n%T
			for h := range H {
				kv, g := h/G, h%G
				row := (b*KVH+kv)*G*T + g*T + t
				src := do.v[(n*H+h)*hd : (n*H+h+1)*hd]
				copy(dO.v[row*hd:(row+1)*hd], src)
				base := (b*KVH + kv) * hd * G * T
				for d, v := range src {
					dOT.v[base+d*G*T+g*T+t] = v
				}
			}
		}
	})
	scale := E(1 / math.Sqrt(float64(hd)))
	probs := la.p
	if probs.buf == nil {
		probs = s.ar.matmul(la.qh, la.khT, BK, false)
		softmaxCausal(probs.v, T, scale)
	}
	dP := s.ar.matmul(dO, la.vhT, BK, false)  // [BK, G·T, T]
	dVT := s.ar.matmul(dOT, probs, BK, false) // [BK, hd, T]
	softmaxBack(probs.v, dP.v, T, scale)
	dQ := s.ar.matmul(dP, la.kh, BK, false)   // [BK, G·T, hd]
	dKT := s.ar.matmul(la.qhT, dP, BK, false) // [BK, hd, T]

	// Back to token layout through RoPE and the Qwen3 norms.
	dq, dk, dv := s.ar.alloc(N, H*hd), s.ar.alloc(N, KVH*hd), s.ar.alloc(N, KVH*hd)
	var qNorm, kNorm []E
	if c.Arch == ArchQwen3 {
		qNorm, kNorm = s.w(p+"self_attn.q_norm.weight").v, s.w(p+"self_attn.k_norm.weight").v
	}
	parallelRows(N, func(r0, r1 int) {
		buf, col := make([]E, hd), make([]E, hd)
		for n := r0; n < r1; n++ {
			b, t := n/T, n%T
			for h := range H {
				kv, g := h/G, h%G
				row := (b*KVH+kv)*G*T + g*T + t
				dst := dq.v[(n*H+h)*hd : (n*H+h+1)*hd]
				if qNorm == nil {
					s.ropeBack(dQ.v[row*hd:(row+1)*hd], dst, t)
					continue
				}
				s.ropeBack(dQ.v[row*hd:(row+1)*hd], buf, t)
				rmsNormRowBack(buf, la.yq.v[(n*H+h)*hd:(n*H+h+1)*hd], qNorm, la.qInv[n*H+h], dst)
			}
			for kv := range KVH {
				base := (b*KVH + kv) * hd * T
				for d := range hd {
					col[d] = dKT.v[base+d*T+t]
				}
				dst := dk.v[(n*KVH+kv)*hd : (n*KVH+kv+1)*hd]
				if kNorm == nil {
					s.ropeBack(col, dst, t)
				} else {
					s.ropeBack(col, buf, t)
					rmsNormRowBack(buf, la.yk.v[(n*KVH+kv)*hd:(n*KVH+kv+1)*hd], kNorm, la.kInv[n*KVH+kv], dst)
				}
				dvr := dv.v[(n*KVH+kv)*hd : (n*KVH+kv+1)*hd]
				for d := range hd {
					dvr[d] = dVT.v[base+d*T+t]
				}
			}
		}
	})
	needDX := l > 0
	dx1 := s.linearBack(dq, p+"self_attn.q_proj", needDX)
	dxk := s.linearBack(dk, p+"self_attn.k_proj", needDX)
	dxv := s.linearBack(dv, p+"self_attn.v_proj", needDX)
	if !needDX {
		return mat[E]{}
	}
	addScaled(dx1.v, dxk.v, 1)
	addScaled(dx1.v, dxv.v, 1)
	rmsNormBack(dx1.v, la.h.v, la.inv1.v, s.w(p+"input_layernorm.weight").v, dh2.v, true)
	return dh2
}
