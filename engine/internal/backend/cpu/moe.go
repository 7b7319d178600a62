package cpu

import (
	"math"
	"slices"

	"github.com/skein-ai/skein/engine/internal/backend"
	"github.com/skein-ai/skein/engine/internal/kernels"
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

// Grouped products: a mixture of experts' rows grouped by expert, each group multiplied by its
// own matrix, in one tensor. Where the step's products read Go memory (float32 on the kernels'
// GEMM) a group's rows are a view of the grouped tensor and each product writes into its rows
// of the output: a step allocates a few tensors of the grouped size, the same every pass,
// rather than one per expert whose sizes change with the routing (the pool keeps buffers by
// shape: a training step of the small-moe preset left 1.3 GB to the collector). Elsewhere
// (float64, the scalar path) the groups are copied out and back.

// views reports whether this step's products take views of a tensor's rows.
func (s *step[E]) views() bool {
	var zero E
	_, f32 := any(zero).(float32)
	return f32 && kernels.HaveGEMM()
}

// rowsOf is rows [r0, r1) of a 2-D x: a view where products take them, else a copy.
func (s *step[E]) rowsOf(x backend.Tensor[E], r0, r1 int, view bool) backend.Tensor[E] {
	if view {
		c := x.Dims[1]
		return backend.Tensor[E]{Dims: []int{r1 - r0, c}, V: x.V[r0*c : r1*c]}
	}
	return s.Rows(x, r0, r1)
}

// into runs op, whose result has out's rows [r0, r1), writing it there: straight into them
// where the step can (AllocInto), else copied.
func (s *step[E]) into(out backend.Tensor[E], r0, r1 int, view bool, op func() backend.Tensor[E]) {
	c := out.Dims[1]
	dst := out.V[r0*c : r1*c]
	if view {
		s.AllocInto(dst)
	}
	y := op()
	s.AllocInto(nil)
	if s.Err() != nil || len(y.V) == 0 || &y.V[0] == &dst[0] {
		return
	}
	copy(dst, y.V)
	s.ReleaseOne(y)
}

// ProductGrouped: rows [offs[g], offs[g+1]) of x times ws[g].
func (s *step[E]) ProductGrouped(x backend.Tensor[E], ws []backend.Weight, offs []int, transposed bool) backend.Tensor[E] {
	in, out := ws[0].Shape()
	if transposed {
		out = in
	}
	res := s.Alloc(x.Dims[0], out)
	view := s.views()
	for g, w := range ws {
		r0, r1 := offs[g], offs[g+1]
		if r0 == r1 || s.Err() != nil {
			continue
		}
		part := s.rowsOf(x, r0, r1, view)
		s.into(res, r0, r1, view, func() backend.Tensor[E] { return s.Product(part, w, transposed) })
		if !view {
			s.ReleaseOne(part)
		}
	}
	return res
}

// MatMulGrouped: group g's rows of x times block g of y (its rows [g·block, (g+1)·block)),
// transposed when transB.
func (s *step[E]) MatMulGrouped(x, y backend.Tensor[E], offs []int, block int, transB bool) backend.Tensor[E] {
	n := y.Dims[1]
	if transB {
		n = block
	}
	res := s.Alloc(x.Dims[0], n)
	view := s.views()
	for g := range len(offs) - 1 {
		r0, r1 := offs[g], offs[g+1]
		if r0 == r1 || s.Err() != nil {
			continue
		}
		part := s.rowsOf(x, r0, r1, view)
		yg := s.rowsOf(y, g*block, (g+1)*block, view)
		s.into(res, r0, r1, view, func() backend.Tensor[E] { return s.MatMul(part, yg, 0, transB) })
		if !view {
			s.ReleaseOne(part)
			s.ReleaseOne(yg)
		}
	}
	return res
}

// MatMulGroupedTN: block g of the result [G·a, b] is x_gᵀ·y_g over group g's rows (zero for an
// empty group).
func (s *step[E]) MatMulGroupedTN(x, y backend.Tensor[E], offs []int) backend.Tensor[E] {
	G, a := len(offs)-1, x.Dims[1]
	res := s.Zeros(G*a, y.Dims[1])
	view := s.views()
	for g := range G {
		r0, r1 := offs[g], offs[g+1]
		if r0 == r1 || s.Err() != nil {
			continue
		}
		xg := s.rowsOf(x, r0, r1, view)
		xt := s.Transpose(xg, 1) // [a, n_g]
		yg := s.rowsOf(y, r0, r1, view)
		s.into(res, g*a, (g+1)*a, view, func() backend.Tensor[E] { return s.MatMul(xt, yg, 0, false) })
		s.ReleaseOne(xt)
		if !view {
			s.ReleaseOne(xg)
			s.ReleaseOne(yg)
		}
	}
	return res
}
