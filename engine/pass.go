package engine

import (
	"context"
	"fmt"
	"runtime/debug"
)

// runPass runs datums [lo,hi) of p through the transformer: their logprobs and per-token losses
// go into res, their gradients are added to grads (nil: a forward-only pass), and their summed
// loss is returned.
func runPass[E float](ctx context.Context, e *Engine, a *Adapter, p *prepared, lo, hi int, loss string, res *ForwardResult, grads [][]E) (total float64, err error) {
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
	m0 := s.ar.Mark()
	h, marks := s.layers(s.embed(p.tokens[lo:hi]), m0)
	if s.ar.Err() != nil { // cancelled, or a failed allocation: the rest would compute nothing
		return 0, s.ar.Err()
	}
	hf, invF := s.finalNorm(h)
	target := passTargets(p.targets[lo:hi], T)
	var dlp func(r int, lp float64) float64
	if grads != nil {
		dlp = rowLossGrad(loss, p, lo, hi, T)
	}
	lp, dhf := s.headRows(hf, target, dlp)
	_, total = tokenLosses(loss, p, lo, hi, T, lp, res)
	if grads == nil || s.ar.Err() != nil {
		return total, s.ar.Err()
	}
	if !s.backward(h, invF, dhf, marks) {
		return 0, s.ar.Err()
	}
	return total, s.ar.Err()
}

// longest is the length of the longest sequence.
func longest(tokens [][]int) int {
	n := 0
	for _, t := range tokens {
		n = max(n, len(t))
	}
	return n
}

// passTargets lays out each sequence's target tokens in the pass's rows of T (0 past its end).
func passTargets(targets [][]int, T int) []int {
	target := make([]int, len(targets)*T)
	for b, tt := range targets {
		copy(target[b*T:], tt)
	}
	return target
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
