package cpu

import (
	"math"
	"slices"

	"github.com/skein-ai/skein/engine/internal/backend"
)

// Mixtures of experts: routing, and each token's experts' outputs mixed by their weights. The
// expert products themselves are ordinary products over the rows routed to each expert.

// Route: per row, p = softmax(logits) (in E, max subtracted, as torch's softmax), the k largest
// p in decreasing order, a tie broken towards the lower expert, then w = p or p/Σp.
func (s *step[E]) Route(logits backend.Tensor[E], k int, renorm bool) (backend.Tensor[E], []int) {
	N, ne := logits.Dims[0], logits.Dims[1]
	w := s.Alloc(N, k)
	experts := make([]int, N*k)
	if s.Err() != nil {
		return w, experts
	}
	p := make([]E, ne)
	idx := make([]int, ne)
	for n := range N {
		softmaxRow(logits.V[n*ne:(n+1)*ne], p)
		for e := range idx {
			idx[e] = e
		}
		// Stable by index: equal probabilities keep the lower expert first.
		slices.SortStableFunc(idx, func(a, b int) int {
			switch {
			case p[a] > p[b]:
				return -1
			case p[a] < p[b]:
				return 1
			}
			return 0
		})
		var sum E
		for j := range k {
			e := idx[j]
			experts[n*k+j] = e
			w.V[n*k+j] = p[e]
			sum += p[e]
		}
		if renorm {
			for j := range k {
				w.V[n*k+j] /= sum
			}
		}
	}
	return w, experts
}

// softmaxRow writes softmax(x) into p.
func softmaxRow[E backend.Float](x, p []E) {
	m := x[0]
	for _, v := range x {
		m = max(m, v)
	}
	var sum E
	for i, v := range x {
		p[i] = E(math.Exp(float64(v - m)))
		sum += p[i]
	}
	for i := range p {
		p[i] /= sum
	}
}

// RouteBack: with g = dw, renormalised w_j = p_j/Σ_S p gives dlogit_j = w_j·(g_j − Σ_S w·g) on
// the selected experts and 0 elsewhere; plain w = p_S gives dlogit_m = p_m·(ĝ_m − Σ_S p·g) for
// every expert m (ĝ: g on the selected, 0 elsewhere), the softmax's backward.
func (s *step[E]) RouteBack(logits, w backend.Tensor[E], experts []int, dw backend.Tensor[E], renorm bool) backend.Tensor[E] {
	N, ne := logits.Dims[0], logits.Dims[1]
	k := w.Dims[1]
	d := s.Zeros(N, ne)
	if s.Err() != nil {
		return d
	}
	p := make([]E, ne)
	for n := range N {
		row := d.V[n*ne : (n+1)*ne]
		ws, gs, es := w.V[n*k:(n+1)*k], dw.V[n*k:(n+1)*k], experts[n*k:(n+1)*k]
		var dot E
		for j := range k {
			dot += ws[j] * gs[j]
		}
		if renorm {
			for j, e := range es {
				row[e] = ws[j] * (gs[j] - dot)
			}
			continue
		}
		softmaxRow(logits.V[n*ne:(n+1)*ne], p)
		for m := range ne {
			row[m] = -p[m] * dot
		}
		for j, e := range es {
			row[e] += p[e] * gs[j]
		}
	}
	return d
}

// MixRows: out[n] = Σ_j w[n, j]·y[pos[n·k+j]].
func (s *step[E]) MixRows(y, w backend.Tensor[E], pos []int) backend.Tensor[E] {
	N, k, C := w.Dims[0], w.Dims[1], y.Dims[len(y.Dims)-1]
	out := s.Zeros(N, C)
	if s.Err() != nil {
		return out
	}
	for n := range N {
		o := out.V[n*C : (n+1)*C]
		for j := range k {
			a := w.V[n*k+j]
			src := y.V[pos[n*k+j]*C : (pos[n*k+j]+1)*C]
			for i, v := range src {
				o[i] += a * v
			}
		}
	}
	return out
}

// MixRowsBack: dy[pos[n·k+j]] = w[n, j]·dOut[n], dw[n, j] = ⟨dOut[n], y[pos[n·k+j]]⟩.
func (s *step[E]) MixRowsBack(dOut, y, w backend.Tensor[E], pos []int) (backend.Tensor[E], backend.Tensor[E]) {
	N, k, C := w.Dims[0], w.Dims[1], y.Dims[len(y.Dims)-1]
	dy, dw := s.Zeros(y.Dims[0], C), s.Alloc(N, k)
	if s.Err() != nil {
		return dy, dw
	}
	for n := range N {
		g := dOut.V[n*C : (n+1)*C]
		for j := range k {
			r := pos[n*k+j]
			a := w.V[n*k+j]
			src, dst := y.V[r*C:(r+1)*C], dy.V[r*C:(r+1)*C]
			var dot E
			for i, v := range g {
				dot += v * src[i]
				dst[i] += a * v
			}
			dw.V[n*k+j] = dot
		}
	}
	return dy, dw
}

// ScatterAdd: dst[rows[i]] += src[i], i in order.
func (s *step[E]) ScatterAdd(dst, src backend.Tensor[E], rows []int) {
	if s.Err() != nil {
		return
	}
	C := dst.Dims[len(dst.Dims)-1]
	for i, r := range rows {
		d, v := dst.V[r*C:(r+1)*C], src.V[i*C:(i+1)*C]
		for j, x := range v {
			d[j] += x
		}
	}
}
