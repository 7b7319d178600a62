package engine

import "github.com/skein-ai/skein/engine/internal/backend"

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
	scale  E // its adapter's alpha/rank (the linears' few-row products fold it into bTs)
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
// y[r0:r1] += (x[r0:r1]·Aᵀ)·(scale·Bᵀ), as addedLoRA does for one adapter (the backend's
// AddLoRARuns: few-row kernels for a decode step's runs, the GEMM for a prefill's).
func (s *pass[E]) segmentedLinear(x mat[E], lin *linear[E]) mat[E] {
	y := s.baseProduct(x, lin, false)
	var runs []backend.LoRARun[E]
	for _, g := range s.rowRuns(x.Dims[0]) {
		if lm := s.segLoRA(g, lin); lm != nil {
			runs = append(runs, backend.LoRARun[E]{R0: g.r0, R1: g.r1, A: lm.a, B: lm.b, BTs: lm.bTs, Scale: s.scale})
		}
	}
	if len(runs) > 0 {
		s.op.AddLoRARuns(x, y, runs, s.e.ggmlNorms())
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
