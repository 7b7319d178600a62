package engine

import (
	"context"
	"fmt"
	"github.com/skein-ai/skein/engine/internal/kernels"
	"runtime/debug"
)

// runPass runs datums [lo,hi) of p through the transformer: their logprobs and per-token losses
// go into res, their gradients are added to grads (nil: a forward-only pass), and their summed
// loss is returned.
func runPass[E float](ctx context.Context, e *Engine, a *Adapter, p *prepared, lo, hi int, loss string, res *ForwardResult, grads [][]float64) (total float64, err error) {
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
	s := newPass[E](e, newArena[E](e.base.mm), a, B, T)
	defer s.ar.free()
	s.ctx = ctx
	s.kv = &passKV[E]{s: s}
	s.cos, s.sin = ropeTable[E](e.invFreq, T)
	useImages(s, e, p.imageRows(lo, hi))
	if grads != nil {
		s.train = &trainState[E]{acts: make([]layerActs[E], c.NumHiddenLayers),
			taps: make([]loraTap[E], len(s.m.linears)), grads: grads, keepMerged: e.keepsMerged()}
	}
	// Memory: a training pass releases each layer's activations once its backward pass is done,
	// so it holds the forward activations, one layer's backward temporaries and the logits, not
	// everything it ever allocated; a forward-only pass holds one layer at a time.
	m0 := s.ar.mark()
	h, marks := s.layers(s.embed(p.tokens[lo:hi]), m0)
	if s.ar.err != nil { // cancelled, or a failed allocation: the rest would compute nothing
		return 0, s.ar.err
	}
	logits, invF := s.unembed(h)
	D := c.HiddenSize
	V := c.VocabSize

	// Per token: log p(target) = logit[target] − logsumexp. The logits row is overwritten by
	// exp(logit − max) on the way, which is all the backward pass needs of it.
	lp := make([]float64, N)
	sumExp := make([]float64, N)
	target := make([]int, N)
	for b := range n {
		copy(target[b*T:], p.targets[lo+b])
	}
	kernels.ParallelRows(N, func(r0, r1 int) {
		for r := r0; r < r1; r++ {
			lp[r], sumExp[r] = tokenLogprob(logits.v[r*V:(r+1)*V], target[r])
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
	kernels.ParallelRows(N, func(r0, r1 int) {
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
	dhf := *s.linearBack(logits, s.m.head, true)
	dh := s.ar.alloc(N, D)
	kernels.RMSNormBack(dhf.v, h.v, invF, s.m.norm, dh.v, false)
	for l := c.NumHiddenLayers - 1; l >= 0; l-- {
		if s.cancelled() {
			return 0, s.ar.err
		}
		m := s.ar.mark()
		dh = s.layerBack(l, dh)
		s.ar.release(m, s.ar.mark())
		s.ar.release(marks[l], marks[l+1])
		for _, lin := range s.m.layers[l].linears() { // this layer's merged weights were in the ranges just released
			s.merged[lin.id] = mat[E]{}
		}
	}
	return total, s.ar.err
}

// recoverCompute turns a panic in the backend (a bug, not bad input: inputs are checked first)
// into an error, so one failed request does not take the server down. The caller's accumulators
// are only updated after a pass succeeds.
func recoverCompute(err *error) {
	if r := recover(); r != nil {
		*err = fmt.Errorf("engine: compute failed: %v\n%s", r, debug.Stack())
	}
}
