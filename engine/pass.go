package engine

import (
	"context"
	"fmt"
	"runtime/debug"

	"github.com/skein-ai/skein/engine/internal/backend"
)

// pass is one forward (and perhaps backward) pass over B rows of T tokens.
type pass[E float] struct {
	e        *Engine
	c        *Config
	m        *model[E]
	op       step[E] // the backend's step: the pass's memory and every op on it
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
		s.op.Fail(err)
	}
	return s.op.Err() != nil
}

// trainState is what a training pass keeps for its backward pass.
type trainState[E float] struct {
	acts       []layerActs[E]
	taps       []loraTap[E] // by linear id
	grads      []mat[E]     // per adapter param, added to
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
	dense            denseActs[E] // the feed-forward block's (denseFFN; a MoE block's shared expert)
	moe              *moeActs[E]  // a mixture of experts' (moeFFN)
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
	grads    []mat[E]        // a training pass's gradients, added to (nil: forward only)
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
	s := &pass[E]{e: e, c: e.Config, m: m, op: ar, B: B, T: T, cos: p.cos, sin: p.sin,
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

// runPass runs datums [lo,hi) of p through the transformer: their logprobs and per-token losses
// go into res, their gradients are added to grads (nil: a forward-only pass), and their summed
// loss is returned.
func runPass[E float](ctx context.Context, e *Engine, a *Adapter, p *prepared, lo, hi int, loss string, res *ForwardResult, grads []mat[E]) (total float64, err error) {
	defer recoverCompute(&err)
	// No padding rows and lengths only rounded up to a multiple of 16: a new shape costs a few
	// one-node matmul compiles (about 50 µs each), so power-of-two buckets would only waste work.
	B, T := hi-lo, padLen(longest(p.tokens[lo:hi]))
	ar := newStep[E](e)
	defer ar.Free()
	lora, scale := loraOf(ar, a, modelOf[E](e.base), true) // the adapter's matrices, read where it keeps them
	cos, sin := ropeTable[E](e.invFreq, T)
	s := newPass(e, ar, B, T, passParts[E]{ctx: ctx, lora: lora, scale: scale, cos: cos, sin: sin, grads: grads,
		recompute: grads != nil && e.recomputesLayers(B, T, a)})
	useImages(s, e, p.imageRows(lo, hi))
	// Memory: a training pass releases each layer's activations once its backward pass is done,
	// so it holds the forward activations, one layer's backward temporaries and the logits, not
	// everything it ever allocated; a forward-only pass holds one layer at a time.
	m0 := s.op.Mark()
	h, marks := s.layers(s.embed(p.tokens[lo:hi]), m0)
	if s.op.Err() != nil { // cancelled, or a failed allocation: the rest would compute nothing
		return 0, s.op.Err()
	}
	hf, invF := s.finalNorm(h)
	lp, dhf := s.headRows(hf, passLossInputs(loss, p, lo, hi, T), grads != nil)
	_, total = tokenLosses(loss, p, lo, hi, T, lp, res)
	if grads == nil || s.op.Err() != nil {
		return total, s.op.Err()
	}
	if !s.backward(h, invF, dhf, marks) {
		return 0, s.op.Err()
	}
	return total, s.op.Err()
}

// longest is the length of the longest sequence.
func longest(tokens [][]int) int {
	n := 0
	for _, t := range tokens {
		n = max(n, len(t))
	}
	return n
}

// recoverCompute turns a panic in the backend (a bug, not bad input: inputs are checked first)
// into an error, so one failed request does not take the server down. The caller's accumulators
// are left as they were (runChunks: summed beside them and added after success, or summed into
// zero ones in place and zeroed again on failure).
func recoverCompute(err *error) {
	if r := recover(); r != nil {
		*err = fmt.Errorf("engine: compute failed: %v\n%s", r, debug.Stack())
	}
}
