package cpu

import (
	"math"

	"github.com/skein-ai/skein/engine/internal/backend"
	"github.com/skein-ai/skein/engine/internal/kernels"
)

// RowLogprob is log softmax(row)[target] and Σ exp(row − max). The row is overwritten by
// exp(row − max). Training, forward passes (HeadLoss) and the sampler's prompt logprobs (on rows that
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

// HeadLoss: per row r of the tile, lp[r0+r] = RowLogprob(row, target); with grad, the row
// becomes dlp·(onehot(target) − softmax), dlp the loss's derivative at lp (0 for padding).
func (s *step[E]) HeadLoss(logits backend.Tensor[E], in *backend.LossInputs, r0 int, lp []float64, grad bool) {
	V := logits.Dims[len(logits.Dims)-1]
	rows := len(logits.V) / V
	kernels.ParallelRows(rows, func(a0, a1 int) {
		for r := a0; r < a1; r++ {
			n := r0 + r
			row := logits.V[r*V : (r+1)*V]
			l, se := RowLogprob(row, in.Target[n])
			lp[n] = l
			if !grad {
				continue
			}
			var g float64
			if in.Live[n] {
				_, g = in.TokenLoss(l, in.Weight[n], in.OldLP[n], in.Adv[n])
			}
			if g == 0 {
				clear(row)
				continue
			}
			k := E(-g / se)
			for i := range row {
				row[i] *= k
			}
			row[in.Target[n]] += E(g)
		}
	})
}
