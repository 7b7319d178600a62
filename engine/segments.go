package engine

import "github.com/skein-ai/skein/engine/internal/kernels"

// Rows of several adapters in one pass (S-LoRA's and Punica's batching): the sampler batches the
// rows of every adapter waiting on a replica into one decode step, so the base model's weights
// are read once per step for all of them, and each run of rows adds only its own adapter's
// low-rank term, x·Aᵀ·(scale·Bᵀ) on those rows (Punica's SGMV, here as small products per run).
// Rows of one adapter are side by side (SampleBatch orders them so), so a pass has one run per
// adapter.

// loraSeg is the LoRA of batch rows [b0, b1) of a pass: lora by linear id (nil entries, or a nil
// slice: those rows read the base model alone).
type loraSeg[E float] struct {
	b0, b1 int
	lora   []*loraMats[E]
}

// adapterRun is a run of batch rows [b0, b1) that read one adapter (nil: the base model).
type adapterRun struct {
	b0, b1 int
	a      *Adapter
}

// adapterRuns cuts rows into runs of the same adapter.
func adapterRuns(rows []*Adapter) []adapterRun {
	var runs []adapterRun
	for b, a := range rows {
		if n := len(runs); n > 0 && runs[n-1].a == a {
			runs[n-1].b1 = b + 1
			continue
		}
		runs = append(runs, adapterRun{b0: b, b1: b + 1, a: a})
	}
	if len(runs) == 0 {
		runs = []adapterRun{{}}
	}
	return runs
}

// rowRun is a run of a product's rows [r0, r1) in segment seg.
type rowRun struct{ r0, r1, seg int }

// rowRuns cuts the rows of a product in this pass into runs of one segment. A product has a row
// per token (B·T), or, for the head, the rows wantedLogits picked (rowBatch).
func (s *pass[E]) rowRuns(rows int) []rowRun {
	segOf := func(b int) int {
		for i, g := range s.segs {
			if b >= g.b0 && b < g.b1 {
				return i
			}
		}
		return -1
	}
	var runs []rowRun
	for r := range rows {
		b := r / s.T
		if s.rowBatch != nil {
			b = s.rowBatch[r]
		}
		seg := segOf(b)
		if n := len(runs); n > 0 && runs[n-1].seg == seg && runs[n-1].r1 == r {
			runs[n-1].r1 = r + 1
			continue
		}
		runs = append(runs, rowRun{r0: r, r1: r + 1, seg: seg})
	}
	return runs
}

// segmentedLinear is x·W for every row at once, then each run's LoRA term added to its rows:
// y[r0:r1] += (x[r0:r1]·Aᵀ)·(scale·Bᵀ), as addedLoRA does for one adapter. Runs of few rows (a
// decode step has one row per sample) go through the few-row kernels, runs side by side on the
// cores; longer runs (a prefill) through the GEMM.
func (s *pass[E]) segmentedLinear(x mat[E], lin *linear[E]) mat[E] {
	y := s.baseProduct(x, lin, false)
	var few []rowRun
	for _, g := range s.rowRuns(x.Dims[0]) {
		lm := s.segLoRA(g, lin)
		if lm == nil || s.ggmlLoRA(x, y, lin, lm, g.r0, g.r1) {
			continue
		}
		if s.fewRows(x, g) {
			few = append(few, g)
			continue
		}
		n := g.r1 - g.r0
		xs := s.ar.Alloc(n, lin.in)
		if s.ar.Err() != nil {
			return y
		}
		copy(xs.V, x.V[g.r0*lin.in:g.r1*lin.in])
		xa := s.ar.MatMul(xs, lm.a, 0, true) // [n, r]
		ys := mat[E]{V: y.V[g.r0*lin.out : g.r1*lin.out], Dims: []int{n, lin.out}}
		s.ar.MatMulAdd(ys, xa, lm.bTs, false)
		s.ar.ReleaseOne(xa)
		s.ar.ReleaseOne(xs)
	}
	if len(few) > 0 && s.ar.Err() == nil {
		xf, yf := any(x.V).([]float32), any(y.V).([]float32)
		kernels.ParallelRows(len(few), func(lo, hi int) {
			for _, g := range few[lo:hi] {
				fewRowLoRA(xf, yf, lin, s.segLoRA(g, lin), g)
			}
		})
	}
	return y
}

// segLoRA is the LoRA of module lin for a run's rows; nil: none.
func (s *pass[E]) segLoRA(g rowRun, lin *linear[E]) *loraMats[E] {
	if g.seg < 0 || s.segs[g.seg].lora == nil {
		return nil
	}
	return s.segs[g.seg].lora[lin.id]
}

// fewRows reports whether a run's LoRA term goes through the few-row kernels: float32 rows, no
// more than the few-row products take. The GEMM driver's packing and calls would cost more than
// these rank-r products themselves.
func (s *pass[E]) fewRows(x mat[E], g rowRun) bool {
	_, ok := any(x.V).([]float32)
	return ok && kernels.FewRowKernels() && g.r1-g.r0 <= kernels.FewRowsF32()
}

// fewRowLoRA adds a run's LoRA term row by row (kernels.LoRARows).
func fewRowLoRA[E float](x, y []float32, lin *linear[E], lm *loraMats[E], g rowRun) {
	in, out := lin.in, lin.out
	a, bTs := any(lm.a.V).([]float32), any(lm.bTs.V).([]float32)
	kernels.LoRARows(y[g.r0*out:g.r1*out], x[g.r0*in:g.r1*in], a, bTs, g.r1-g.r0, in, lm.a.Dims[0], out)
}
