package cpu

import (
	"math"

	"github.com/skein-ai/skein/engine/internal/backend"
	"github.com/skein-ai/skein/engine/internal/kernels"
)

// LayerNorm: per row, y = (x − mean)/√(var + eps)·w + b (mean and variance in float64).
func (s *step[E]) LayerNorm(x, w, b backend.Tensor[E], eps float64) backend.Tensor[E] {
	dim := len(w.V)
	y := s.Alloc(x.Dims...)
	kernels.ParallelRows(len(x.V)/dim, func(r0, r1 int) {
		for r := r0; r < r1; r++ {
			xr, yr := x.V[r*dim:(r+1)*dim], y.V[r*dim:(r+1)*dim]
			var mean, vr float64
			for _, v := range xr {
				mean += float64(v)
			}
			mean /= float64(dim)
			for _, v := range xr {
				vr += (float64(v) - mean) * (float64(v) - mean)
			}
			inv := 1 / math.Sqrt(vr/float64(dim)+eps)
			for i, v := range xr {
				yr[i] = E((float64(v)-mean)*inv)*w.V[i] + b.V[i]
			}
		}
	})
	return y
}

// GELU in place: x·Φ(x) (erf), or with tanh, 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))).
func (s *step[E]) GELU(x backend.Tensor[E], tanh bool) {
	f := geluErf
	if tanh {
		f = geluTanh
	}
	v := x.V
	kernels.ParallelRows(len(v)/256+1, func(lo, hi int) {
		for i := lo * 256; i < min(hi*256, len(v)); i++ {
			v[i] = E(f(float64(v[i])))
		}
	})
}

func geluTanh(x float64) float64 {
	return 0.5 * x * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(x+0.044715*x*x*x)))
}

func geluErf(x float64) float64 { return 0.5 * x * (1 + math.Erf(x/math.Sqrt2)) }

// FrameAttention: qkv [n, 3·D] (each row q‖k‖v, heads of hd = D/H) split into heads, q and k
// rotated by row i of cos and sin [n, hd/2], full softmax attention within each of frames
// frames (n/frames rows each), heads back into rows [n, D].
func (s *step[E]) FrameAttention(qkv backend.Tensor[E], frames, H int, cos, sin []E) backend.Tensor[E] {
	n, D := qkv.Dims[0], qkv.Dims[1]/3
	hd, per := D/H, n/frames
	BH := frames * H
	q, k, v := s.Alloc(BH, per, hd), s.Alloc(BH, per, hd), s.Alloc(BH, per, hd)
	kernels.ParallelRows(n, func(r0, r1 int) {
		for i := r0; i < r1; i++ {
			f, t := i/per, i%per
			cs, sn := cos[i*hd/2:(i+1)*hd/2], sin[i*hd/2:(i+1)*hd/2]
			for hh := range H {
				dst := ((f*H+hh)*per + t) * hd
				src := qkv.V[i*3*D+hh*hd:]
				ropeRow(src[:hd], q.V[dst:dst+hd], cs, sn)
				ropeRow(src[D:D+hd], k.V[dst:dst+hd], cs, sn)
				copy(v.V[dst:dst+hd], src[2*D:2*D+hd])
			}
		}
	})
	p := s.MatMul(q, k, BH, true) // [BH, per, per]
	scale := E(1 / math.Sqrt(float64(hd)))
	kernels.ParallelRows(BH*per, func(r0, r1 int) {
		for r := r0; r < r1; r++ {
			kernels.SoftmaxRow(p.V[r*per:(r+1)*per], per-1, scale)
		}
	})
	o := s.MatMul(p, v, BH, false) // [BH, per, hd]
	ot := s.Alloc(n, D)
	kernels.ParallelRows(n, func(r0, r1 int) {
		for i := r0; i < r1; i++ {
			f, t := i/per, i%per
			for hh := range H {
				src := ((f*H+hh)*per + t) * hd
				copy(ot.V[i*D+hh*hd:i*D+(hh+1)*hd], o.V[src:src+hd])
			}
		}
	})
	return ot
}

// Reshape is a copy of x with other dimensions (the same number of elements).
func (s *step[E]) Reshape(x backend.Tensor[E], dims ...int) backend.Tensor[E] {
	out := s.Alloc(dims...)
	copy(out.V, x.V)
	return out
}

// PutRows: row rows[i] of h becomes vals[i] (add: has vals[i] added), each value rounded to E.
func (s *step[E]) PutRows(h backend.Tensor[E], rows []int, vals [][]float64, add bool) {
	D := h.Dims[len(h.Dims)-1]
	for i, n := range rows {
		dst := h.V[n*D : (n+1)*D]
		for k, x := range vals[i] {
			if add {
				dst[k] += E(x)
			} else {
				dst[k] = E(x)
			}
		}
	}
}
