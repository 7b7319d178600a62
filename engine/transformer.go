package engine

import (
	"context"
	"math"

	"github.com/skein-ai/skein/engine/internal/backend"
	"github.com/skein-ai/skein/engine/internal/kernels"
)

// The one transformer. Training, forward-only passes (forward, compute_logprobs) and the
// sampler's steps all run the layer below; what differs between them is plugged in:
//   - how a linear applies its LoRA (loraApply): merged into the weight when the pass has many
//     rows, added after the base product when it has few; chosen by the pass's shape, so the
//     same tokens give the same bits whichever API asked;
//   - where keys and values come from and go to (kvStore): the pass's own tokens (training,
//     forward, a prefill, which also fills the cache), or the sampler's cache (decode steps);
//   - whether activations are saved (training): a forward-only pass keeps one layer's
//     tensors at a time, a training pass keeps what backward.go reads.

// pass is one forward (and perhaps backward) pass over B rows of T tokens.
type pass[E float] struct {
	e        *Engine
	c        *Config
	m        *model[E]
	ar       step[E]
	B, T     int
	kv       kvStore[E]
	cos, sin []E            // rotary tables [slots, hd/2]
	lora     []*loraMats[E] // by linear id; nil: no LoRA on the module
	scale    E              // LoRA alpha/rank
	segs     []loraSeg[E]   // rows of several adapters (segments.go); nil: lora applies to every row
	rowBatch []int          // the batch row of each row of the head's product, while segs need it
	qPairs   []uint32       // a quantized weight widened for the bf16 GEMM (linear.go), reused by its products
	qPairsOf *linear[E]     // the weight qPairs holds (nil: none)
	qPairsAt [2]int         // and which of its outputs (pairsChunkOutputs)
	merged   []mat[E]       // by linear id: W + scale·(B·A)ᵀ while kept (buf nil: none)
	train    *trainState[E] // nil for forward-only passes
	// Vision-language passes (vlpass.go, mrope.go): rotary angles other than by slot, and image
	// features placed at and added to the image tokens' rows. nil: a text pass.
	rope *ropeOverride[E]
	vis  *visualInputs
	ctx  context.Context // nil: never cancelled; checked between layers
}

// cancelled is called between layers: it gives a turn to others' short work (WithTurns), then
// reports whether the pass's context has ended, recording its error as the pass's (later arena
// calls are no-ops and the pass returns it).
func (s *pass[E]) cancelled() bool {
	GiveTurn(s.ctx)
	if err := stopped(s.ctx); err != nil {
		s.ar.Fail(err)
	}
	return s.ar.Err() != nil
}

// trainState is what a training pass keeps for its backward pass.
type trainState[E float] struct {
	acts       []layerActs[E]
	taps       []loraTap[E] // by linear id
	grads      [][]E        // per adapter param, added to
	keepMerged bool         // merged weights live from the forward to the backward pass
	// Recomputation (plan.go, recomputesLayers): the forward keeps only each layer's input, and
	// the backward runs each layer's forward again, saving its activations, just before its
	// backward. saving is false while a layer runs without keeping what its backward reads.
	recompute bool
	inputs    []mat[E] // by layer, when recompute
	saving    bool
}

// saving reports whether the layer running now keeps what its backward pass reads.
func (s *pass[E]) saving() bool { return s.train != nil && s.train.saving }

// layerActs are the activations of one decoder layer that its backward pass needs.
type layerActs[E float] struct {
	h, x1, inv1      mat[E]       // layer input, its norm, 1/rms per token
	yq, yk           mat[E]       // q, k projections before the head norms
	qInv, kInv       []E          // 1/rms per token and head (head norms)
	qh, qhT          mat[E]       // queries [B·KVH, G·T, hd] and transposed [B·KVH, hd, G·T]
	kh, khT, vh, vhT mat[E]       // keys and values [B·KVH, T, hd] and transposed [B·KVH, hd, T]
	p                mat[E]       // attention probabilities [B·KVH, G·T, T]; buf nil: recomputed
	o                mat[E]       // attention output, token layout [N, H·hd]
	h2, x2, inv2     mat[E]       // residual after attention, its norm, 1/rms
	dense            denseActs[E] // the feed-forward block's (denseFFN)
	gate             mat[E]       // gated attention: the gate rows of q_proj [N, H·hd] (o above is before σ(gate))
	dn               deltaActs[E] // a DeltaNet layer's mixer (deltanet.go)
}

// passParts are what differ between the passes the engine runs, all made by newPass.
type passParts[E float] struct {
	ctx      context.Context // nil: never cancelled
	lora     []*loraMats[E]  // by linear id, as loraOf makes them; nil entries: no LoRA
	scale    E               // LoRA alpha/rank
	segs     []loraSeg[E]    // forward-only passes over rows of several adapters (nil: lora for all)
	cos, sin []E             // rotary tables of at least as many slots as the pass's positions
	grads    [][]E           // a training pass's gradients, added to (nil: forward only)
	// The sampler's cache (nil: none): a prefill fills it on the way; a decode step, whose
	// tokens sit at positions pos, attends over it.
	cache *kvCache[E]
	pos   [][]int
	// recompute: a training pass keeps only each layer's input (plan.go, recomputesLayers).
	recompute bool
}

// newPass is how every pass is made, training, forward or sampling: B rows of T tokens computed
// in arena ar from parts p. Keys and values are the pass's own (passKV, filling the sampler's
// cache when there is one) unless p.pos places its tokens in the cache (cacheKV).
func newPass[E float](e *Engine, ar step[E], B, T int, p passParts[E]) *pass[E] {
	m := modelOf[E](e.base)
	s := &pass[E]{e: e, c: e.Config, m: m, ar: ar, B: B, T: T, cos: p.cos, sin: p.sin,
		lora: p.lora, scale: p.scale, segs: p.segs, merged: make([]mat[E], len(m.linears)), ctx: p.ctx}
	if p.pos == nil {
		s.kv = &passKV[E]{s: s, cache: p.cache}
	} else {
		s.kv = &cacheKV[E]{cache: p.cache, pos: p.pos}
	}
	if p.grads != nil {
		s.train = &trainState[E]{acts: make([]layerActs[E], e.Config.NumHiddenLayers),
			taps: make([]loraTap[E], len(m.linears)), grads: p.grads, keepMerged: e.keepsMerged(),
			recompute: p.recompute, saving: true}
		if p.recompute {
			s.train.inputs = make([]mat[E], e.Config.NumHiddenLayers)
			s.train.keepMerged = false // each layer merges again when it runs again
		}
	}
	return s
}

// embed looks up tokens [B][≤T]; positions past a row's end are zero.
func (s *pass[E]) embed(tok [][]int) mat[E] {
	D := s.c.HiddenSize
	h := s.ar.Zeros(s.B*s.T, D)
	var buf []float32
	if s.m.embedQ != nil {
		buf = make([]float32, D)
	}
	for b, row := range tok {
		for t, id := range row {
			n := b*s.T + t
			if s.m.embedQ != nil {
				embedRowQ(h.V[n*D:(n+1)*D], s.m, id, buf)
			} else if s.m.embed16 != nil {
				kernels.WidenBF16(h.V[n*D:(n+1)*D], s.m.embed16[id*D:(id+1)*D])
			} else {
				copy(h.V[n*D:(n+1)*D], s.m.embed.V[id*D:(id+1)*D])
			}
		}
	}
	s.placeImages(h)
	return h
}

// layers runs every decoder layer on h, allocated after mark m0. A forward-only pass gives back
// each layer's tensors as soon as the next has its input, so it holds one layer at a time; a
// training pass keeps them and returns where each layer's allocations begin (and where the
// last ends).
func (s *pass[E]) layers(h mat[E], m0 backend.Mark) (mat[E], []backend.Mark) {
	L := s.c.NumHiddenLayers
	if s.train == nil {
		for l := range L {
			if s.beforeLayer(l) {
				return h, nil
			}
			h = s.layer(l, h)
			s.addDeepstack(l, h)
			s.ar.ReleaseExcept(m0, h)
		}
		return h, nil
	}
	marks := make([]backend.Mark, L+1)
	for l := range L {
		if s.beforeLayer(l) {
			return h, nil
		}
		marks[l] = s.ar.Mark()
		if s.train.recompute {
			// Only the input is kept (allocated before this mark): the layer runs as a forward-only
			// one and gives back everything but its output.
			s.train.inputs[l] = h
			s.train.saving = false
			h = s.layer(l, h)
			s.train.saving = true
			s.ar.ReleaseExcept(marks[l], h)
		} else {
			h = s.layer(l, h)
		}
		s.addDeepstack(l, h)
	}
	marks[L] = s.ar.Mark()
	return h, marks
}

// beforeLayer runs the engine's test hook, if any, and reports whether the pass must stop.
func (s *pass[E]) beforeLayer(l int) bool {
	if s.e.layerHook != nil {
		s.e.layerHook(l)
	}
	return s.cancelled()
}

// unembed is the final norm and the head: logits [rows, V] and 1/rms per row (the sampler's,
// for the few rows it draws from; training and forward passes take the head in tiles, headRows).
func (s *pass[E]) unembed(h mat[E]) (logits, inv mat[E]) {
	hf, inv := s.finalNorm(h)
	return s.linear(hf, s.m.head), inv
}

// finalNorm is the norm before the head: h normalised, and 1/rms per row.
func (s *pass[E]) finalNorm(h mat[E]) (hf, inv mat[E]) {
	hf, inv = s.ar.Alloc(h.Dims[0], s.c.HiddenSize), s.ar.Alloc(h.Dims[0])
	s.rmsNorm(h, s.m.norm, hf, inv)
	return hf, inv
}

// layer runs decoder layer l on h [B·T, D]: its token mixer (attention or DeltaNet) on the
// input's norm, added to the input; then the feed-forward block on that sum's norm, added to it.
// A forward-only pass gives back the mixer's tensors before the block runs, and every merged
// weight after; a training pass keeps what the layer's backward pass reads (layerActs).
func (s *pass[E]) layer(l int, h mat[E]) mat[E] {
	start := s.ar.Mark()
	var la *layerActs[E]
	if s.saving() {
		la = &s.train.acts[l]
		*la = layerActs[E]{h: h}
	}
	L := &s.m.layers[l]
	x1, inv1 := s.ar.Alloc(s.B*s.T, s.c.HiddenSize), s.ar.Alloc(s.B*s.T)
	s.rmsNorm(h, L.inputNorm, x1, inv1)
	h2 := L.mix.forward(s, l, x1, la)
	s.ar.Add(h2, h)
	if la != nil {
		la.x1, la.inv1 = x1, inv1
	}
	if la == nil { // the mixer's tensors are spent
		s.dropMerged()
		s.ar.ReleaseExcept(start, h2)
	}
	out := s.feedForward(l, h2, la)
	if la == nil || !s.train.keepMerged {
		s.dropMerged()
	}
	return out
}

// forward is o_proj(attention(x1)) of layer l for its normed input x1, saving its activations
// into la (nil: a forward-only pass).
func (A *attentionLayer[E]) forward(s *pass[E], l int, x1 mat[E], la *layerActs[E]) mat[E] {
	c := s.c
	N := s.B * s.T
	yq := s.linear(x1, A.q)
	var gate mat[E]
	if c.family().gatedAttention {
		yq, gate = s.splitGate(yq)
	}
	yk := s.linear(x1, A.k)
	yv := s.linear(x1, A.v)
	keysT, values := s.kv.begin(l)
	qh, qhT, qInv, kInv := s.headsIn(A, l, yq, yk, yv, la != nil)
	probs, ot := s.attend(qh, keysT, values)
	o := ot
	if gate.V != nil {
		o = s.ar.Alloc(N, c.NumAttentionHeads*c.HeadDim)
		for i, g := range gate.V {
			o.V[i] = ot.V[i] * E(sigmoid(float64(g)))
		}
	}
	if la != nil {
		la.gate = gate
		la.yq, la.yk, la.qInv, la.kInv, la.qh, la.qhT, la.p, la.o = yq, yk, qInv, kInv, qh, qhT, probs, ot
		if s.e.recomputeProbs(s.T) {
			// Long sequences: the probabilities outweigh everything else a layer keeps, so the
			// backward pass computes them again (one more matmul) instead of holding them.
			s.ar.ReleaseOne(probs)
			la.p = mat[E]{}
		}
	}
	return s.linear(o, A.o)
}

// splitGate splits a gated attention's q_proj output [N, H·2·hd], each head's queries followed
// by its gate rows, into the queries [N, H·hd] and the gates [N, H·hd].
func (s *pass[E]) splitGate(yq mat[E]) (q, gate mat[E]) {
	N, H, hd := yq.Dims[0], s.c.NumAttentionHeads, s.c.HeadDim
	q, gate = s.ar.Alloc(N, H*hd), s.ar.Alloc(N, H*hd)
	for n := range N {
		for h := range H {
			src := yq.V[(n*H+h)*2*hd:]
			copy(q.V[(n*H+h)*hd:(n*H+h+1)*hd], src[:hd])
			copy(gate.V[(n*H+h)*hd:(n*H+h+1)*hd], src[hd:2*hd])
		}
	}
	return q, gate
}

// joinGate is splitGate's inverse, for gradients: [N, H·hd] twice into [N, H·2·hd].
func (s *pass[E]) joinGate(dq, dgate mat[E]) mat[E] {
	N, H, hd := dq.Dims[0], s.c.NumAttentionHeads, s.c.HeadDim
	out := s.ar.Alloc(N, 2*H*hd)
	for n := range N {
		for h := range H {
			dst := out.V[(n*H+h)*2*hd:]
			copy(dst[:hd], dq.V[(n*H+h)*hd:(n*H+h+1)*hd])
			copy(dst[hd:2*hd], dgate.V[(n*H+h)*hd:(n*H+h+1)*hd])
		}
	}
	return out
}

// headsIn puts layer l's query heads into the attention layout qh [B·KVH, G·T, hd], through the
// head norms and RoPE on the way, and its keys and values to the store. For a training pass it
// also returns Qᵀ [B·KVH, hd, G·T] and the head norms' 1/rms per token and head, which only
// serve the backward pass.
func (s *pass[E]) headsIn(L *attentionLayer[E], l int, yq, yk, yv mat[E], training bool) (qh, qhT mat[E], qInv, kInv []E) {
	c := s.c
	T, N := s.T, s.B*s.T
	H, KVH, hd := c.NumAttentionHeads, c.NumKeyValueHeads, c.HeadDim
	G, BK := H/KVH, s.B*KVH
	qh = s.ar.Alloc(BK, G*T, hd)
	if training {
		qhT = s.ar.Alloc(BK, hd, G*T)
		if L.qNorm != nil {
			qInv, kInv = make([]E, N*H), make([]E, N*KVH)
		}
	}
	kernels.ParallelRows(N, func(r0, r1 int) {
		buf, kr := make([]E, hd), make([]E, hd)
		var scratch E
		for n := r0; n < r1; n++ {
			b, t := n/T, n%T
			ps := s.kv.slot(b, t)
			cs, sn := s.ropeAt(b, t, ps)
			for hh := range H {
				kv, g := hh/G, hh%G
				src := yq.V[(n*H+hh)*hd : (n*H+hh+1)*hd]
				if L.qNorm != nil {
					inv := &scratch
					if qInv != nil {
						inv = &qInv[n*H+hh]
					}
					s.rmsNormHead(src, L.qNorm, buf, inv)
					src = buf
				}
				row := (b*KVH+kv)*G*T + g*T + t
				dst := qh.V[row*hd : (row+1)*hd]
				ropeRow(src, dst, cs, sn)
				if training {
					base := (b*KVH + kv) * hd * G * T
					for d, v := range dst {
						qhT.V[base+d*G*T+g*T+t] = v
					}
				}
			}
			for kv := range KVH {
				src := yk.V[(n*KVH+kv)*hd : (n*KVH+kv+1)*hd]
				if L.kNorm != nil {
					inv := &scratch
					if kInv != nil {
						inv = &kInv[n*KVH+kv]
					}
					s.rmsNormHead(src, L.kNorm, buf, inv)
					src = buf
				}
				ropeRow(src, kr, cs, sn)
				s.kv.put(l, b, t, kv, kr, yv.V[(n*KVH+kv)*hd:(n*KVH+kv+1)*hd])
			}
		}
	})
	return qh, qhT, qInv, kInv
}

// attend is softmax(q·kᵀ/√hd)·v over the slots each row sees: the probabilities [B·KVH, G·T, S]
// and the output in token layout [B·T, H·hd].
func (s *pass[E]) attend(qh, keysT, values mat[E]) (probs, ot mat[E]) {
	c, B, T := s.c, s.B, s.T
	H, KVH, hd := c.NumAttentionHeads, c.NumKeyValueHeads, c.HeadDim
	G, BK, S := H/KVH, B*KVH, values.Dims[1]
	scale := E(1 / math.Sqrt(float64(hd)))
	if n := s.attnChunks(BK, G*T, S); n > 0 {
		return mat[E]{}, s.attendInChunks(qh, keysT, values, n)
	}
	probs = s.ar.MatMul(qh, keysT, BK, false) // [BK, G·T, S]
	kernels.ParallelRows(BK*G*T, func(r0, r1 int) {
		for r := r0; r < r1; r++ {
			b, t := r/(KVH*G*T), r%T
			kernels.SoftmaxRow(probs.V[r*S:(r+1)*S], s.kv.slot(b, t), scale) // a row sees slots 0…its own
		}
	})
	o := s.ar.MatMul(probs, values, BK, false) // [BK, G·T, hd]
	ot = s.ar.Alloc(B*T, H*hd)
	headsToTokens(o.V, ot.V, B, T, KVH, G, hd)
	return probs, ot
}

// attnProbsBytes bounds the attention probabilities a forward-only pass holds at once.
const attnProbsBytes = 64 << 20

// attnChunks is how many chunks of query rows each kv head's attention runs in when a
// forward-only float32 pass's probabilities [BK, G·T, S] would pass attnProbsBytes (a long
// prompt's prefill: 27 GB a layer for 40,960 tokens of an 8B shape), 0 when they fit or when
// the pass keeps them (training). Chunks have more rows than kernels.FewRowsF32, so every row
// goes through the GEMM as it does in one product.
func (s *pass[E]) attnChunks(BK, GT, S int) int {
	if _, ok := any(s.ar).(step[float32]); !ok || s.saving() || !kernels.HaveGEMM() {
		return 0
	}
	rows := attnProbsBytes / 4 / S
	if s.e.attnChunk > 0 {
		rows = s.e.attnChunk
	} else if BK*GT <= rows {
		return 0
	}
	n := (GT + rows - 1) / rows
	return max(1, min(n, GT/(kernels.FewRowsF32()+1)))
}

// attendInChunks is attend for a forward-only pass, one kv head at a time and its G·T query rows
// in n chunks of nearly equal size: each chunk's probabilities [rows, S] are computed, masked
// and multiplied by the values, then given back. Each row is the same products as in one pass.
func (s *pass[E]) attendInChunks(qh, keysT, values mat[E], n int) mat[E] {
	c, B, T := s.c, s.B, s.T
	H, KVH, hd := c.NumAttentionHeads, c.NumKeyValueHeads, c.HeadDim
	G, BK, S := H/KVH, B*KVH, values.Dims[1]
	GT := G * T
	scale := float32(1 / math.Sqrt(float64(hd)))
	o := s.ar.Alloc(BK, GT, hd)
	of, qf := any(o.V).([]float32), any(qh.V).([]float32)
	kf, vf := any(keysT.V).([]float32), any(values.V).([]float32)
	for bk := range BK {
		for i := range n {
			r0, r1 := GT*i/n, GT*(i+1)/n
			m := s.ar.Mark()
			p := s.ar.Alloc(r1-r0, S)
			if s.ar.Err() != nil {
				break
			}
			pf := any(p.V).([]float32)
			kernels.MatMul(pf, qf[(bk*GT+r0)*hd:(bk*GT+r1)*hd], kf[bk*hd*S:(bk+1)*hd*S], 1, r1-r0, hd, S, false)
			kernels.ParallelRows(r1-r0, func(a0, a1 int) {
				for a := a0; a < a1; a++ {
					kernels.SoftmaxRow(pf[a*S:(a+1)*S], s.kv.slot(bk/KVH, (r0+a)%T), scale) // a row sees slots 0…its own
				}
			})
			kernels.MatMul(of[(bk*GT+r0)*hd:(bk*GT+r1)*hd], pf, vf[bk*S*hd:(bk+1)*S*hd], 1, r1-r0, S, hd, false)
			s.ar.Release(m, s.ar.Mark())
		}
	}
	ot := s.ar.Alloc(B*T, H*hd)
	headsToTokens(o.V, ot.V, B, T, KVH, G, hd)
	return ot
}

// feedForward is h2 + ffn(norm(h2)) of layer l, saving its activations into la (nil: a
// forward-only pass).
func (s *pass[E]) feedForward(l int, h2 mat[E], la *layerActs[E]) mat[E] {
	c, L := s.c, &s.m.layers[l]
	N, D := s.B*s.T, c.HiddenSize
	x2, inv2 := s.ar.Alloc(N, D), s.ar.Alloc(N)
	s.rmsNorm(h2, L.postNorm, x2, inv2)
	out := L.ffn.forward(s, x2, la)
	s.ar.Add(out, h2)
	if la != nil {
		la.h2, la.x2, la.inv2 = h2, x2, inv2
	}
	return out
}

// linear is x·W (+ bias) with the module's LoRA, if any, applied the way the pass's shape
// calls for.
func (s *pass[E]) linear(x mat[E], lin *linear[E]) mat[E] {
	var y mat[E]
	if s.segs != nil {
		y = s.segmentedLinear(x, lin)
	} else if lm := s.lora[lin.id]; lm != nil {
		y = s.loraWay(lin, x.Dims[0]).forward(s, x, lin, lm)
	} else {
		y = s.baseProduct(x, lin, false)
	}
	if lin.bias != nil {
		s.ar.AddBias(y, lin.bias)
	}
	return y
}

// dropMerged gives back the merged weights built so far: a pass holds one layer's worth, and
// the backward pass merges again (a rank-r matmul and one pass over the weight). Models whose
// merged weights are small next to the step budget keep them instead (Engine.keepsMerged).
func (s *pass[E]) dropMerged() {
	for id, f := range s.merged {
		if f.Buf != nil {
			s.ar.ReleaseOne(f)
			s.merged[id] = mat[E]{}
		}
	}
}

// headsToTokens copies o [B·KVH, G·T, hd] into token layout [B·T, H·hd].
func headsToTokens[E float](o, dst []E, B, T, KVH, G, hd int) {
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

// ropeRow rotates x into y by the angles whose cosines and sines are c and sn (HF rotate_half
// convention). Only the first 2·len(c) dims rotate (partial rotary, Qwen3.5); the rest pass
// through.
func ropeRow[E float](x, y, c, sn []E) {
	half := len(c)
	for i := range half {
		x1, x2 := x[i], x[i+half]
		y[i] = x1*c[i] - x2*sn[i]
		y[i+half] = x2*c[i] + x1*sn[i]
	}
	copy(y[2*half:], x[2*half:])
}

// rmsNorm is RMSNorm over rows of x with the model's eps, rounded as ggml-cpu does under
// ggmlNorms.
func (s *pass[E]) rmsNorm(x mat[E], w []E, y, inv mat[E]) {
	s.ar.RMSNorm(x, w, s.c.RMSNormEps, y, inv, s.e.ggmlNorms())
}

// rmsNormHead is rmsNormRow of one query or key head, or under ggmlNorms
// kernels.RMSNormRowGGML.
func (s *pass[E]) rmsNormHead(x, w, y []E, inv *E) {
	if xf, ok := any(x).([]float32); ok && s.e.ggmlNorms() {
		*inv = E(kernels.RMSNormRowGGML(xf, any(w).([]float32), s.c.RMSNormEps, any(y).([]float32)))
		return
	}
	rmsNormRow(x, w, s.c.RMSNormEps, y, inv)
}

// ggmlNorms: Options.GGMLActivations over a quantized base also rounds the RMSNorms as ggml-cpu
// does. An ulp of difference in a norm's output can move one of llama.cpp's activation roundings
// by a step, which moved the tiny Q4_K models' logits by up to 0.1; over float32 and bf16 bases
// the option changes nothing.
func (e *Engine) ggmlNorms() bool {
	return e.opts.GGMLActivations && quantFormat(e.opts.Precision) != nil
}

// rmsNormRow normalises one row (a query or key head), storing 1/rms in inv.
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
