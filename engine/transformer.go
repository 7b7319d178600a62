package engine

import (
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

// embed looks up tokens [B][≤T]; positions past a row's end are zero.
func (s *pass[E]) embed(tok [][]int) mat[E] {
	h := s.op.Embed(s.m.embed, tok, s.T)
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
			s.op.ReleaseExcept(m0, h)
		}
		return h, nil
	}
	marks := make([]backend.Mark, L+1)
	for l := range L {
		if s.beforeLayer(l) {
			return h, nil
		}
		marks[l] = s.op.Mark()
		if s.train.recompute {
			// Only the input is kept (allocated before this mark): the layer runs as a forward-only
			// one and gives back everything but its output.
			s.train.inputs[l] = h
			s.train.saving = false
			h = s.layer(l, h)
			s.train.saving = true
			s.op.ReleaseExcept(marks[l], h)
		} else {
			h = s.layer(l, h)
		}
		s.addDeepstack(l, h)
	}
	marks[L] = s.op.Mark()
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
	hf, inv = s.op.Alloc(h.Dims[0], s.c.HiddenSize), s.op.Alloc(h.Dims[0])
	s.rmsNorm(h, s.m.norm, hf, inv)
	return hf, inv
}

// layer runs decoder layer l on h [B·T, D]: its token mixer (attention or DeltaNet) on the
// input's norm, added to the input; then the feed-forward block on that sum's norm, added to it.
// A forward-only pass gives back the mixer's tensors before the block runs, and every merged
// weight after; a training pass keeps what the layer's backward pass reads (layerActs).
func (s *pass[E]) layer(l int, h mat[E]) mat[E] {
	start := s.op.Mark()
	var la *layerActs[E]
	if s.saving() {
		la = &s.train.acts[l]
		*la = layerActs[E]{h: h}
	}
	L := &s.m.layers[l]
	x1, inv1 := s.op.Alloc(s.B*s.T, s.c.HiddenSize), s.op.Alloc(s.B*s.T)
	s.rmsNorm(h, L.inputNorm, x1, inv1)
	h2 := L.mix.forward(s, l, x1, la)
	s.op.Add(h2, h)
	if la != nil {
		la.x1, la.inv1 = x1, inv1
	}
	if la == nil { // the mixer's tensors are spent
		s.dropMerged()
		s.op.ReleaseExcept(start, h2)
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
		yq, gate = s.op.SplitGate(yq, c.NumAttentionHeads, c.HeadDim)
	}
	yk := s.linear(x1, A.k)
	yv := s.linear(x1, A.v)
	hi := &backend.HeadsIn[E]{Heads: s.heads(), Q: yq, K: yk, V: yv, QNorm: A.qNorm, KNorm: A.kNorm,
		Eps: c.RMSNormEps, GGML: s.e.ggmlNorms(), Rot: s.rotation(), Slot: s.slots()}
	s.kv.begin(l, hi) // where keys and values go, and where attention reads them
	H, KVH, hd, T := c.NumAttentionHeads, c.NumKeyValueHeads, c.HeadDim, s.T
	G, BK := H/KVH, s.B*KVH
	hi.QH = s.op.Alloc(BK, G*T, hd)
	if la != nil { // Qᵀ and the head norms' 1/rms serve only the backward pass
		hi.QHT = s.op.Alloc(BK, hd, G*T)
		if A.qNorm.Dims != nil {
			hi.QInv, hi.KInv = s.op.Alloc(N*H), s.op.Alloc(N*KVH)
		}
	}
	s.op.HeadsIn(hi)
	probs, ot := s.op.Attend(&backend.Attention[E]{Heads: hi.Heads, QH: hi.QH, KeysT: hi.KeysT, Values: hi.Values,
		Slot: hi.Slot, KeepProbs: la != nil, ChunkRows: s.e.attnChunk})
	o := ot
	if gate.Dims != nil {
		o = s.op.Gate(ot, gate)
	}
	if la != nil {
		la.gate = gate
		la.yq, la.yk, la.qInv, la.kInv, la.qh, la.qhT, la.p, la.o = yq, yk, hi.QInv, hi.KInv, hi.QH, hi.QHT, probs, ot
		if s.e.recomputeProbs(s.T) {
			// Long sequences: the probabilities outweigh everything else a layer keeps, so the
			// backward pass computes them again (one more matmul) instead of holding them.
			s.op.ReleaseOne(probs)
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
	x2, inv2 := s.op.Alloc(N, D), s.op.Alloc(N)
	s.rmsNorm(h2, L.postNorm, x2, inv2)
	out := L.ffn.forward(s, x2, la)
	s.op.Add(out, h2)
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
	if lin.bias.Dims != nil {
		s.op.AddBias(y, lin.bias)
	}
	return y
}

// dropMerged gives back the merged weights built so far: a pass holds one layer's worth, and
// the backward pass merges again (a rank-r matmul and one pass over the weight). Models whose
// merged weights are small next to the step budget keep them instead (Engine.keepsMerged).
func (s *pass[E]) dropMerged() {
	for id, f := range s.merged {
		if f.Dims != nil {
			s.op.ReleaseOne(f)
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

// rmsNorm is RMSNorm over rows of x with the model's eps, rounded as ggml-cpu does under
// ggmlNorms.
func (s *pass[E]) rmsNorm(x, w, y, inv mat[E]) {
	s.op.RMSNorm(x, w, s.c.RMSNormEps, y, inv, s.e.ggmlNorms())
}

// ggmlNorms: Options.GGMLActivations over a quantized base also rounds the RMSNorms as ggml-cpu
// does. An ulp of difference in a norm's output can move one of llama.cpp's activation roundings
// by a step, which moved the tiny Q4_K models' logits by up to 0.1; over float32 and bf16 bases
// the option changes nothing.
func (e *Engine) ggmlNorms() bool {
	return e.opts.GGMLActivations && quantFormat(e.opts.Precision) != nil
}
