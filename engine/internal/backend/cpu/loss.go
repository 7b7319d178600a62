package cpu

import (
	"math"

	"github.com/skein-ai/skein/engine/internal/backend"
	"github.com/skein-ai/skein/engine/internal/kernels"
)

// TargetLogprobs: per row r, lp[r] = logit[target] − logsumexp(row), sumExp[r] = Σ exp(logit −
// max); each row is overwritten by exp(logit − max) on the way, all LogitsGrad needs of it.
func (s *step[E]) TargetLogprobs(logits backend.Tensor[E], target []int) (lp, sumExp []float64) {
	N, V := len(target), logits.Dims[len(logits.Dims)-1]
	lp = make([]float64, N)
	sumExp = make([]float64, N)
	kernels.ParallelRows(N, func(r0, r1 int) {
		for r := r0; r < r1; r++ {
			lp[r], sumExp[r] = RowLogprob(logits.V[r*V:(r+1)*V], target[r])
		}
	})
	return lp, sumExp
}

// LogitsGrad: each row, exp(logit − max) as TargetLogprobs left it, becomes d loss/d logits =
// dlp·(onehot(target) − softmax), in place.
func (s *step[E]) LogitsGrad(logits backend.Tensor[E], dlp, sumExp []float64, target []int) {
	V := logits.Dims[len(logits.Dims)-1]
	kernels.ParallelRows(len(target), func(r0, r1 int) {
		for r := r0; r < r1; r++ {
			row := logits.V[r*V : (r+1)*V]
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
}

// RowLogprob is log softmax(row)[target] and Σ exp(row − max). The row is overwritten by
// exp(row − max). Training, forward passes and the sampler's prompt logprobs (on rows that
// reached the host) all take their logprobs from here, so they agree bit for bit.
func RowLogprob[E backend.Float](row []E, target int) (lp, sumExp float64) {
	m := kernels.RowMax(row)
	picked := row[target]
	se := kernels.ExpShift(row, 1, m)
	return float64(picked-m) - math.Log(se), se
}

// SetRows copies src into rows [r0, r0+len) of dst.
func (s *step[E]) SetRows(dst, src backend.Tensor[E], r0 int) {
	w := dst.Dims[len(dst.Dims)-1]
	copy(dst.V[r0*w:], src.V[:len(src.V)])
}

// GatherRows is rows rows[i] of x, in that order.
func (s *step[E]) GatherRows(x backend.Tensor[E], rows []int) backend.Tensor[E] {
	w := x.Dims[len(x.Dims)-1]
	out := s.Alloc(len(rows), w)
	if s.Err() != nil {
		return out
	}
	for i, n := range rows {
		copy(out.V[i*w:(i+1)*w], x.V[n*w:(n+1)*w])
	}
	return out
}

// Download is t's numbers on the host: on the CPU, its own memory, valid until t is given back.
func (s *step[E]) Download(t backend.Tensor[E]) []E { return t.V }
