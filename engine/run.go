package engine

import (
	"context"
	"math"
)

// ForwardResult is what forward and forward_backward return.
type ForwardResult struct {
	Logprobs [][]float64 // per datum, target-token logprobs
	Losses   [][]float64 // per datum, per-token loss
	Loss     float64     // sum of all per-token losses
	Metrics  map[string]float64
}

func isFinite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

// isFinite32 reports whether v is finite as a float32 too.
func isFinite32(v float64) bool { return isFinite(v) && math.Abs(v) <= math.MaxFloat32 }

// finiteResult refuses a pass whose logprobs or losses are not finite float32s (the dtype they
// are answered in): extreme loss inputs (a sampling logprob of -1e30 makes exp(lp − q)
// overflow) are the user's to fix, and NaN cannot be answered in JSON anyway.
func finiteResult(res *ForwardResult) error {
	for i := range res.Losses {
		for t := range res.Losses[i] {
			if !isFinite32(res.Losses[i][t]) || !isFinite32(res.Logprobs[i][t]) {
				return inputErr(i, "loss_fn_inputs", "%v: the loss at position %d is %v (logprob %v); nothing was changed (check the magnitudes of weights, logprobs and advantages)",
					ErrNonFinite, t, res.Losses[i][t], res.Logprobs[i][t])
			}
		}
	}
	if !isFinite(res.Loss) {
		return inputErr(-1, "loss_fn_inputs", "%v: the summed loss is %v; nothing was changed", ErrNonFinite, res.Loss)
	}
	return nil
}

// run runs a validated batch through adapter a (nil: the base model), plain forwards and
// training passes alike: images through the vision tower, then the chunks of the memory plan one
// after another. With backward, the gradients are added to the adapter's accumulator only once
// every chunk has run and every sum is finite.
func (e *Engine) run(ctx context.Context, a *Adapter, p *prepared, backward bool) (*ForwardResult, error) {
	data := p.data
	var err error
	if p.feats, err = e.encodeImages(p.images); err != nil {
		return nil, err
	}
	res := &ForwardResult{Logprobs: make([][]float64, len(data)), Losses: make([][]float64, len(data))}
	nTokens := 0
	for _, t := range p.tokens {
		nTokens += len(t)
	}
	if e.opts.Float64 {
		err = runChunks[float64](ctx, e, a, p, res, backward)
	} else {
		err = runChunks[float32](ctx, e, a, p, res, backward)
	}
	if err != nil {
		return nil, err
	}
	res.Metrics = map[string]float64{"loss:sum": res.Loss, "num_tokens:sum": float64(nTokens)}
	return res, nil
}

// runChunks is run's chunks in element type E. With backward, the batch's gradients are summed
// in E: straight into the adapter's accumulator when it is zero (the first forward_backward since
// an optim_step, a load or a create: the common loop of one forward_backward a step), which a
// failed batch zeroes again, so it is left exactly as it was found; otherwise beside it, and
// added to it at the end. Summing in place saves one copy of the adapter's size (336 MB for an
// 8B shape at rank 32), and, since zero + g is g, gives the same accumulator bit for bit.
func runChunks[E float](ctx context.Context, e *Engine, a *Adapter, p *prepared, res *ForwardResult, backward bool) error {
	var grads []mat[E]
	inPlace, kept := false, false
	st := newStep[E](e) // the gradients' bookkeeping: zeroing, checks, sums
	defer st.Free()
	if backward {
		if grads, inPlace = accumulatorIfZero[E](a); inPlace {
			defer func() { // an error or a panic: back to zero
				if !kept {
					st.Clear(grads...)
				}
			}()
		} else {
			grads = batchGrads[E](a, st)
			defer putGrads(a, grads)
		}
	}
	lengths := make([]int, len(p.tokens))
	for i, t := range p.tokens {
		lengths[i] = len(t)
	}
	// Chunks run one after another: each already keeps every core busy (matmuls and kernels are
	// multi-threaded), and summing in chunk order keeps results independent of scheduling.
	for _, c := range e.chunks(lengths, a) {
		if err := stopped(ctx); err != nil {
			return err
		}
		l, err := runPass[E](ctx, e, a, p, c[0], c[1], p.loss, res, grads)
		if err != nil {
			return err
		}
		res.Loss += l
	}
	if err := finiteResult(res); err != nil {
		return err
	}
	// The last moment a cancel is seen: from here the gradients are added whole.
	if err := stopped(ctx); err != nil {
		return err
	}
	if backward && inPlace {
		if !st.AllFinite(grads) {
			return errGradsNotFinite()
		}
		a.pendingGrads, kept = true, true
		return nil
	}
	if backward {
		// Every sum is checked before any is changed: a refused batch leaves the accumulator as
		// it was.
		acc := make([]mat[E], len(a.params))
		for i, pr := range a.params {
			acc[i] = numbersOf[E](pr).g
		}
		if !st.AddChecked(acc, grads) {
			return errGradsNotFinite()
		}
		a.pendingGrads = true
	}
	return nil
}

// accumulatorIfZero returns adapter a's gradient accumulators and true when they are known to be
// zero (no forward_backward since the last optim_step, load or create), so a batch may sum into
// them in place.
func accumulatorIfZero[E float](a *Adapter) ([]mat[E], bool) {
	if a.pendingGrads {
		return nil, false
	}
	g := make([]mat[E], len(a.params))
	for i, pr := range a.params {
		q := numbersOf[E](pr)
		if q.g.Dims == nil {
			return nil, false // a sampler snapshot's weights: no accumulator
		}
		g[i] = q.g
	}
	return g, true
}

func errGradsNotFinite() error {
	return inputErr(-1, "loss_fn_inputs", "%v: the gradients are not finite (nothing was changed; check the magnitudes of weights, logprobs and advantages)", ErrNonFinite)
}
