package cpu

import (
	"math"

	"github.com/skein-ai/skein/engine/internal/backend"
	"github.com/skein-ai/skein/engine/internal/tensor"
)

// An adapter's parameters on the CPU: Go memory in GoMLX shared buffers (so that products on
// every path read them where they are), outside any step.

// NewParam is a zeroed parameter tensor of the given dimensions.
func NewParam[E backend.Float](dims ...int) backend.Tensor[E] {
	t, _, err := tensor.NewWeight[E](dims...)
	if err != nil { // the Go backend's shared buffers are Go slices; it fails only on bad shapes
		panic(err)
	}
	clear(t.V)
	return t
}

// ParamOf is a parameter tensor holding v rounded to E.
func ParamOf[E backend.Float](v []float64, dims ...int) backend.Tensor[E] {
	t := NewParam[E](dims...)
	for i, x := range v {
		t.V[i] = E(x)
	}
	return t
}

// Values are a tensor's numbers on the host: the CPU's own memory (a checkpoint reads them, a
// test looks at them).
func Values[E backend.Float](t backend.Tensor[E]) []E { return t.V }

// Copy is a step tensor holding t's numbers.
func (s *step[E]) Copy(t backend.Tensor[E]) backend.Tensor[E] {
	out := s.Alloc(t.Dims...)
	copy(out.V, t.V)
	return out
}

// GradNorm: √Σg², summed again scaled by max|g| when the sum of squares overflows.
func (s *step[E]) GradNorm(gs []backend.Tensor[E]) float64 {
	var sq float64
	for _, g := range gs {
		for _, x := range g.V {
			sq += float64(x) * float64(x)
		}
	}
	if !math.IsInf(sq, 1) {
		return math.Sqrt(sq)
	}
	var scale float64
	for _, g := range gs {
		for _, x := range g.V {
			scale = max(scale, math.Abs(float64(x)))
		}
	}
	sq = 0
	for _, g := range gs {
		for _, x := range g.V {
			sq += (float64(x) / scale) * (float64(x) / scale)
		}
	}
	return scale * math.Sqrt(sq)
}

// AllFinite: no NaN, no ±Inf.
func (s *step[E]) AllFinite(ts []backend.Tensor[E]) bool {
	for _, t := range ts {
		for _, x := range t.V {
			if !isFinite(float64(x)) {
				return false
			}
		}
	}
	return true
}

// AddChecked: every dst[i][j] + src[i][j] checked first, then added.
func (s *step[E]) AddChecked(dst, src []backend.Tensor[E]) bool {
	for i, d := range dst {
		for j, g := range src[i].V {
			if !isFinite(float64(d.V[j] + g)) {
				return false
			}
		}
	}
	for i, d := range dst {
		for j, g := range src[i].V {
			d.V[j] += g
		}
	}
	return true
}

// Clear zeroes ts.
func (s *step[E]) Clear(ts ...backend.Tensor[E]) {
	for _, t := range ts {
		clear(t.V)
	}
}

// AdamW runs each element's update twice: first only to check that every new weight and moment
// is finite in E (a huge learning rate, or an eps tiny against a vanishing second moment, can
// overflow), then to apply it. A refused step changes nothing, and the arithmetic is the same
// both times, so what is checked is what is stored. The gradients are left for the caller to
// clear.
func (s *step[E]) AdamW(ps []backend.Param[E], h backend.AdamW) (updSq float64, bad int, w, m, v float64) {
	update := func(q backend.Param[E], j int) (w, m, v E) {
		g := float64(q.G.V[j]) * h.Clip
		mf := h.Beta1*float64(q.M.V[j]) + (1-h.Beta1)*g
		vf := h.Beta2*float64(q.V.V[j]) + (1-h.Beta2)*g*g
		wf := float64(q.W.V[j]) * (1 - h.LR*h.WeightDecay)
		upd := h.LR * (mf / h.BC1) / (math.Sqrt(vf/h.BC2) + h.Eps)
		return E(wf - upd), E(mf), E(vf)
	}
	for i, q := range ps {
		for j := range q.W.V {
			if w, m, v := update(q, j); !isFinite(float64(w)) || !isFinite(float64(m)) || !isFinite(float64(v)) {
				return 0, i, float64(w), float64(m), float64(v)
			}
		}
	}
	for _, q := range ps {
		for j := range q.W.V {
			nw, m, v := update(q, j)
			d := float64(nw) - float64(q.W.V[j])
			updSq += d * d
			q.W.V[j], q.M.V[j], q.V.V[j] = nw, m, v
		}
	}
	return updSq, -1, 0, 0, 0
}

func isFinite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
