package engine

import (
	"context"
	"math"

	"github.com/skein-ai/skein/engine/internal/backend"
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
	merged   []mat[E]       // by linear id: W + scale·(B·A)ᵀ while kept (buf nil: none)
	train    *trainState[E] // nil for forward-only passes
	// Vision-language passes (vlpass.go, mrope.go): rotary angles other than by slot, and image
	// features placed at and added to the image tokens' rows. nil: a text pass.
	rope *ropeOverride[E]
	vis  *visualInputs
	ctx  context.Context // nil: never cancelled; checked between layers
	// Made once a pass for every layer's attention (rotation, slots).
	rot  backend.Rotation[E]
	slot []int
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
	qInv, kInv       mat[E]       // 1/rms per token and head (head norms)
	qh, qhT          mat[E]       // queries [B·KVH, G·T, hd] and transposed [B·KVH, hd, G·T]
	kh, khT, vh, vhT mat[E]       // keys and values [B·KVH, T, hd] and transposed [B·KVH, hd, T]
	p                mat[E]       // attention probabilities [B·KVH, G·T, T]; buf nil: recomputed
	o                mat[E]       // attention output, token layout [N, H·hd]
	h2, x2, inv2     mat[E]       // residual after attention, its norm, 1/rms
	dense            denseActs[E] // the feed-forward block's (denseFFN)
	gate             mat[E]       // gated attention: the gate rows of q_proj [N, H·hd] (o above is before σ(gate))
	dn               any          // a DeltaNet layer's core, as the backend kept it (DeltaNet)
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
	h := s.ar.Embed(s.m.embed, tok, s.T)
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
		yq, gate = s.ar.SplitGate(yq, c.NumAttentionHeads, c.HeadDim)
	}
	yk := s.linear(x1, A.k)
	yv := s.linear(x1, A.v)
	hi := &backend.HeadsIn[E]{Heads: s.heads(), Q: yq, K: yk, V: yv, QNorm: A.qNorm, KNorm: A.kNorm,
		Eps: c.RMSNormEps, GGML: s.e.ggmlNorms(), Rot: s.rotation(), Slot: s.slots()}
	s.kv.begin(l, hi) // where keys and values go, and where attention reads them
	H, KVH, hd, T := c.NumAttentionHeads, c.NumKeyValueHeads, c.HeadDim, s.T
	G, BK := H/KVH, s.B*KVH
	hi.QH = s.ar.Alloc(BK, G*T, hd)
	if la != nil { // Qᵀ and the head norms' 1/rms serve only the backward pass
		hi.QHT = s.ar.Alloc(BK, hd, G*T)
		if A.qNorm != nil {
			hi.QInv, hi.KInv = s.ar.Alloc(N*H), s.ar.Alloc(N*KVH)
		}
	}
	s.ar.HeadsIn(hi)
	probs, ot := s.ar.Attend(&backend.Attention[E]{Heads: hi.Heads, QH: hi.QH, KeysT: hi.KeysT, Values: hi.Values,
		Slot: hi.Slot, KeepProbs: la != nil, ChunkRows: s.e.attnChunk})
	o := ot
	if gate.Dims != nil {
		o = s.ar.Gate(ot, gate)
	}
	if la != nil {
		la.gate = gate
		la.yq, la.yk, la.qInv, la.kInv, la.qh, la.qhT, la.p, la.o = yq, yk, hi.QInv, hi.KInv, hi.QH, hi.QHT, probs, ot
		if s.e.recomputeProbs(s.T) {
			// Long sequences: the probabilities outweigh everything else a layer keeps, so the
			// backward pass computes them again (one more matmul) instead of holding them.
			s.ar.ReleaseOne(probs)
			la.p = mat[E]{}
		}
	}
	return s.linear(o, A.o)
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

// ggmlNorms: Options.GGMLActivations over a quantized base also rounds the RMSNorms as ggml-cpu
// does. An ulp of difference in a norm's output can move one of llama.cpp's activation roundings
// by a step, which moved the tiny Q4_K models' logits by up to 0.1; over float32 and bf16 bases
// the option changes nothing.
func (e *Engine) ggmlNorms() bool {
	return e.opts.GGMLActivations && quantFormat(e.opts.Precision) != nil
}
