package cpu

import (
	"fmt"

	"github.com/skein-ai/skein/engine/internal/backend"
	"github.com/skein-ai/skein/engine/internal/kernels"
)

// Upload is a new tensor holding v.
func (s *step[E]) Upload(v []E, dims ...int) backend.Tensor[E] {
	t := s.Alloc(dims...)
	copy(t.V, v)
	return t
}

// ReadsInPlace: float32 products on the kernels' GEMM read any Go memory; GoMLX's products (the
// float64 engine's, the scalar path's) take only its buffers, which a step's Copy is.
func (s *step[E]) ReadsInPlace() bool {
	_, f32 := any(s).(*step[float32])
	return f32 && kernels.HaveGEMM()
}

// Transpose: out [cols, rows] = scale·srcᵀ for src [rows, cols].
func (s *step[E]) Transpose(src backend.Tensor[E], scale E) backend.Tensor[E] {
	rows, cols := src.Dims[0], src.Dims[1]
	out := s.Alloc(cols, rows)
	transpose(src.V, out.V, rows, cols, scale)
	return out
}

// Scale: out = scale·src.
func (s *step[E]) Scale(src backend.Tensor[E], scale E) backend.Tensor[E] {
	out := s.Alloc(src.Dims...)
	for i, v := range src.V[:len(out.V)] {
		out.V[i] = scale * v
	}
	return out
}

// AddGrad: g += d, or with transposed, g [cols, rows] += dᵀ for d [rows, cols].
func (s *step[E]) AddGrad(gt, d backend.Tensor[E], transposed bool) {
	g := gt.V
	if !transposed {
		for i, v := range d.V {
			g[i] += v
		}
		return
	}
	rows, cols := d.Dims[0], d.Dims[1]
	for j := range rows {
		for o := range cols {
			g[o*rows+j] += d.V[j*cols+o]
		}
	}
}

// Rows is a copy of rows [r0, r1) of a 2-D tensor.
func (s *step[E]) Rows(x backend.Tensor[E], r0, r1 int) backend.Tensor[E] {
	w := x.Dims[1]
	out := s.Alloc(r1-r0, w)
	if s.Err() == nil {
		copy(out.V, x.V[r0*w:r1*w])
	}
	return out
}

// AddLoRARuns: for each run, y[r0:r1] += (x[r0:r1]·Aᵀ)·BTs, BTs = scale·Bᵀ [r, out]. Runs of few
// rows (a decode step has one row per sample) go through the few-row kernels, side by side on
// the cores; longer runs (a prefill) through the GEMM. Under ggml each run's term is added as
// llama.cpp adds it (kernels.LoRARowsGGML, from A and B and the scale).
func (s *step[E]) AddLoRARuns(x, y backend.Tensor[E], runs []backend.LoRARun[E], ggml bool) {
	in, out := x.Dims[1], y.Dims[1]
	var few []backend.LoRARun[E]
	for _, g := range runs {
		if ggml {
			if s.Err() == nil {
				s.loraRowsGGML(x, y, g)
			}
			continue
		}
		if s.fewRows(x, g) {
			few = append(few, g)
			continue
		}
		xs := s.Rows(x, g.R0, g.R1)
		if s.Err() != nil {
			return
		}
		xa := s.MatMul(xs, g.A, 0, true) // [n, r]
		ys := backend.Tensor[E]{V: y.V[g.R0*out : g.R1*out], Dims: []int{g.R1 - g.R0, out}}
		s.MatMulAdd(ys, xa, g.BTs, false)
		s.ReleaseOne(xa)
		s.ReleaseOne(xs)
	}
	if len(few) > 0 && s.Err() == nil {
		xf, yf := any(x.V).([]float32), any(y.V).([]float32)
		kernels.ParallelRows(len(few), func(lo, hi int) {
			for _, g := range few[lo:hi] {
				a, bTs := any(g.A.V).([]float32), any(g.BTs.V).([]float32)
				kernels.LoRARows(yf[g.R0*out:g.R1*out], xf[g.R0*in:g.R1*in], a, bTs, g.R1-g.R0, in, g.A.Dims[0], out)
			}
		})
	}
}

// fewRows reports whether a run's LoRA term goes through the few-row kernels: float32 rows, no
// more than the few-row products take. The GEMM driver's packing and calls would cost more than
// these rank-r products themselves.
func (s *step[E]) fewRows(x backend.Tensor[E], g backend.LoRARun[E]) bool {
	_, ok := any(x.V).([]float32)
	return ok && kernels.FewRowKernels() && g.R1-g.R0 <= kernels.FewRowsF32()
}

// AddLoRAGGML adds rows [r0, r1)'s LoRA term to y as llama.cpp does (float32).
func (s *step[E]) AddLoRAGGML(x, y backend.Tensor[E], run backend.LoRARun[E]) {
	if s.Err() == nil {
		s.loraRowsGGML(x, y, run)
	}
}

func (s *step[E]) loraRowsGGML(x, y backend.Tensor[E], g backend.LoRARun[E]) {
	in, out := x.Dims[1], y.Dims[1]
	xf, yf := any(x.V).([]float32), any(y.V).([]float32)
	a, b := any(g.A.V).([]float32), any(g.B.V).([]float32)
	kernels.LoRARowsGGML(yf[g.R0*out:g.R1*out], xf[g.R0*in:g.R1*in], a, b, g.R1-g.R0, in, g.A.Dims[0], out, float32(g.Scale))
}

// CopyBlocks: dst block i ← src block from[i], blocks of len(dst)/len(from) elements.
func (s *step[E]) CopyBlocks(dst, src backend.Tensor[E], from []int) {
	if len(from) == 0 || s.Err() != nil {
		return
	}
	n := len(dst.V) / len(from)
	for i, j := range from {
		copy(dst.V[i*n:(i+1)*n], src.V[j*n:(j+1)*n])
	}
}

// CopyRows: dst rows d0… ← src rows s0…, a row being the product of the trailing dimensions.
func (s *step[E]) CopyRows(dst backend.Tensor[E], d0 int, src backend.Tensor[E], s0, n int) {
	if s.Err() != nil || n <= 0 {
		return
	}
	row := 1
	for _, d := range dst.Dims[1:] {
		row *= d
	}
	srow := 1
	for _, d := range src.Dims[1:] {
		srow *= d
	}
	if row != srow || d0 < 0 || s0 < 0 || d0+n > dst.Dims[0] || s0+n > src.Dims[0] {
		s.Fail(fmt.Errorf("cpu: CopyRows of %d rows from %d of %v to %d of %v", n, s0, src.Dims, d0, dst.Dims))
		return
	}
	copy(dst.V[d0*row:(d0+n)*row], src.V[s0*row:(s0+n)*row])
}
