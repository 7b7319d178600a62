package cpu

import (
	"math"

	"github.com/skein-ai/skein/engine/internal/backend"
	"github.com/skein-ai/skein/engine/internal/kernels"
)

// Linear products over frozen base weights, the way the path and the weight's form call for.

// baseProduct returns x·W for module lin's base weight, or x·Wᵀ when transposed (an input
// gradient); bias and LoRA are the caller's. A float32 pass over a weight kept in bf16 reads the
// bits where they are. Kept as pairs of rows (loaded on a path with the bf16 unit): few rows
// through the pairs kernels, more through the bf16 GEMM, the rows rounded to bf16 as PyTorch's
// bf16 autocast does. Kept as rows: up to kernels.FewRowsBF16() rows through the few-row kernels
// (the weight widened in registers), more through the bf16 GEMM where the path has one.
// Everything else widens the weight for the float32 matmul.
func (s *step[E]) baseProduct(x backend.Tensor[E], lin *weight[E], transposed bool) backend.Tensor[E] {
	if lin.qw != nil {
		return s.quantProduct(x, lin, transposed)
	}
	transB := lin.outIn != transposed // the stored layout multiplied transposed
	k, n := lin.in, lin.out
	if transposed {
		k, n = n, k
	}
	if xf, ok := any(x.V).([]float32); ok && lin.w2 != nil && len(x.Dims) == 2 && x.Dims[1] == k {
		// Kept as pairs of rows of [in, out]: x·W multiplies the pairs as stored, x·Wᵀ as its
		// transpose's.
		rows := x.Dims[0]
		if rows <= kernels.FewRowsBF16() || kernels.HaveBF16GEMM() {
			y := s.Alloc(rows, n)
			if s.Err() == nil {
				if rows <= kernels.FewRowsBF16() {
					kernels.PairsProduct(any(y.V).([]float32), xf, lin.w2, rows, k, n, transposed)
				} else {
					kernels.PairsMatMul(any(y.V).([]float32), xf, lin.w2, rows, k, n, transposed)
				}
			}
			return y
		}
	}
	if xf, ok := any(x.V).([]float32); ok && kernels.FewRowKernels() && len(x.Dims) == 2 && x.Dims[1] == k {
		rows := x.Dims[0]
		if lin.w16 != nil && rows <= kernels.FewRowsBF16() {
			y := s.Alloc(rows, n)
			if s.Err() == nil { // a failed step computes nothing more, as the matmul path
				kernels.BF16Product(any(y.V).([]float32), xf, lin.w16, rows, k, n, transB)
			}
			return y
		}
		if lin.w16 != nil && kernels.HaveBF16GEMM() {
			y := s.Alloc(rows, n)
			if s.Err() == nil {
				kernels.BF16MatMul(any(y.V).([]float32), xf, lin.w16, rows, k, n, transB)
			}
			return y
		}
		if wf, ok := any(lin.w.V).([]float32); ok && lin.w16 == nil && lin.w2 == nil && rows <= kernels.FewRowsF32() {
			y := s.Alloc(rows, n)
			if s.Err() == nil {
				kernels.F32Product(any(y.V).([]float32), xf, wf, rows, k, n, transB)
			}
			return y
		}
	}
	if nc := s.widenChunk(x, lin); nc > 0 {
		return s.widenedChunkProduct(x, lin, nc, transposed)
	}
	w, done := s.widened(lin)
	y := s.MatMul(x, w, 0, transB)
	done()
	return y
}

// widened returns a module's weight in the pass's dtype and a function that gives back the
// widened copy when the weight is kept in bf16 (a no-op otherwise). Use it right before the
// product and call done right after.
func (s *step[E]) widened(lin *weight[E]) (w backend.Tensor[E], done func()) {
	if lin.w2 != nil {
		w = s.Alloc(lin.w.Dims...)
		kernels.WidenPairs(w.V, lin.w2, lin.in, lin.out)
		return w, func() { s.ReleaseOne(w) }
	}
	if lin.qw != nil { // [in, out], as the other layouts: dequantized [out, in], transposed
		f, done := s.quantWeight(lin)
		w = s.Alloc(lin.w.Dims...)
		transpose(f.V, w.V, lin.out, lin.in, 1)
		done()
		return w, func() { s.ReleaseOne(w) }
	}
	if lin.w16 == nil {
		return lin.w, func() {}
	}
	w = s.Alloc(lin.w.Dims...)
	kernels.WidenBF16(w.V, lin.w16)
	return w, func() { s.ReleaseOne(w) }
}

// quantFewRows is the most rows a quantized product reads the blocks for directly: a decode step
// of a whole batch (engine.MaxSampleRows). Widening the blocks for the GEMM is a pass over the
// whole weight, which only many rows (training, prefill) repay.
const quantFewRows = backend.MaxFewRows

// quantProduct is x·W (or x·Wᵀ when transposed, an input gradient) over quantized blocks (Q8_0,
// Q4_K): few rows of a float32 pass read the blocks directly, in float32 (the format's Product:
// decode steps, where the weight's bytes are the cost). More rows go through the bf16 GEMM where the path has one, the
// blocks widened into pairs (d·q rounded to bf16, the rows too, as autocast does: training over
// Q8_0 at bf16 speed), else through the float32 GEMM over the weight dequantized into a step
// buffer, given back right after (a pass holds at most one such weight, as with bf16). So on a
// bf16 path the sampler's logprobs differ from a forward pass's by bf16 rounding (≈1e-3).
func (s *step[E]) quantProduct(x backend.Tensor[E], lin *weight[E], transposed bool) backend.Tensor[E] {
	rows := x.Dims[0]
	if xf, ok := any(x.V).([]float32); ok && s.opts.GGML && !transposed && len(x.Dims) == 2 && x.Dims[1] == lin.in {
		// llama.cpp's way (Options.GGMLActivations): the rows rounded to 8-bit blocks, integer
		// dots. Forward only: an input gradient stays over the dequantized weight.
		y := s.Alloc(rows, lin.out)
		if s.Err() == nil {
			yf := any(y.V).([]float32)
			lin.qf.GGMLProduct(yf, xf, lin.qw, rows, lin.in, lin.out, kernels.ParallelRows)
			nonFiniteRows(yf, xf, rows, lin.in, lin.out)
		}
		return y
	}
	if xf, ok := any(x.V).([]float32); ok && !transposed && len(x.Dims) == 2 && x.Dims[1] == lin.in && rows <= quantFewRows {
		y := s.Alloc(rows, lin.out)
		if s.Err() == nil {
			product := lin.qf.Product
			if product == nil {
				product = rowsProductOf(lin.qf)
			}
			product(any(y.V).([]float32), xf, lin.qw, rows, lin.in, lin.out, kernels.ParallelRows)
		}
		return y
	}
	if xf, ok := any(x.V).([]float32); ok && kernels.HaveBF16GEMM() && len(x.Dims) == 2 {
		// Through the bf16 GEMM, as bf16 weights are, over the blocks widened into pairs.
		if nc := pairsChunkOutputs(s.opts.PairsChunk, lin.in, lin.out); nc < lin.out {
			return s.quantChunkedProduct(x, xf, lin, nc, transposed)
		}
		k, n := lin.in, lin.out
		if transposed {
			k, n = n, k
		}
		w2 := s.widenedPairs(lin, 0, lin.out)
		y := s.Alloc(rows, n)
		if s.Err() == nil {
			kernels.PairsMatMul(any(y.V).([]float32), xf, w2, rows, k, n, transposed)
		}
		return y
	}
	if nc := s.widenChunk(x, lin); nc > 0 {
		return s.widenedChunkProduct(x, lin, nc, transposed)
	}
	w, done := s.quantWeight(lin)
	y := s.MatMul(x, w, 0, !transposed) // x·W = x·(Q [out, in])ᵀ; an input gradient dy·Q
	done()
	return y
}

// pairsChunkBytes bounds the pairs one quantized product widens at a time (step.qPairs): a
// weight whose pairs are larger (an 8B shape's head, 1.05 GB) is multiplied a chunk of its
// outputs at a time (quantChunkedProduct).
const pairsChunkBytes = 64 << 20

// pairsChunkOutputs is how many of a quantized [out, in] weight's outputs one chunk of its pairs
// holds: all of them when they fit in pairsChunkBytes, else a multiple of 16 that does (at
// least 16). Tests set StepOptions.PairsChunk to force chunks on small models.
func pairsChunkOutputs(pairsChunk, in, out int) int {
	limit := pairsChunkBytes / 4 // words
	if pairsChunk > 0 {
		limit = pairsChunk * (in / 2)
	}
	if in/2*out <= limit {
		return out
	}
	return max(16, limit/(in/2)/16*16)
}

// widenedPairs is outputs [o0, o1) of a quantized weight widened into bf16 pairs, in the pass's
// pairs buffer; widened again only when the buffer holds something else (the head's tiles
// multiply by the same weight one after another, forward and back).
func (s *step[E]) widenedPairs(lin *weight[E], o0, o1 int) []uint32 {
	words := lin.in / 2 * (o1 - o0)
	if len(s.qPairs) < words {
		s.b.putPairs(s.qPairs)
		s.qPairs, s.qPairsOf = s.b.takePairs(words), nil
	}
	w2 := s.qPairs[:words]
	if s.qPairsOf != lin || s.qPairsAt != [2]int{o0, o1} {
		rowBytes := lin.in / lin.qf.Block * lin.qf.BlockBytes
		lin.qf.Pairs(w2, lin.qw[o0*rowBytes:o1*rowBytes], lin.in, o1-o0, kernels.ParallelRows)
		s.qPairsOf, s.qPairsAt = lin, [2]int{o0, o1}
	}
	return w2
}

// quantChunkedProduct is quantProduct's bf16 GEMM over a weight too large to widen at once: nc
// outputs at a time, x·W into y's columns of each chunk, or (transposed) dy's columns of each
// chunk times its rows of W summed into dx. Forward chunks go up and input-gradient chunks come
// down, so the chunk left in the buffer is the next product's first (a head tile's backward
// starts where its forward ended, the next tile's forward where that ended).
func (s *step[E]) quantChunkedProduct(x backend.Tensor[E], xf []float32, lin *weight[E], nc int, transposed bool) backend.Tensor[E] {
	rows, in, out := x.Dims[0], lin.in, lin.out
	n := out
	if transposed {
		n = in
	}
	y := s.Alloc(rows, n)
	yf, _ := any(y.V).([]float32)
	chunks := (out + nc - 1) / nc
	for i := range chunks {
		c := i
		if transposed {
			c = chunks - 1 - i
		}
		o0, o1 := c*nc, min(out, (c+1)*nc)
		w2 := s.widenedPairs(lin, o0, o1)
		if s.Err() != nil {
			return y
		}
		m := s.Mark()
		if !transposed {
			part := s.Alloc(rows, o1-o0)
			pf, _ := any(part.V).([]float32)
			kernels.PairsMatMul(pf, xf, w2, rows, in, o1-o0, false)
			setColumns(yf, pf, rows, out, o0, o1)
		} else {
			cols := s.Alloc(rows, o1-o0)
			cf, _ := any(cols.V).([]float32)
			columnsOf(cf, xf, rows, out, o0, o1)
			if i == 0 {
				kernels.PairsMatMul(yf, cf, w2, rows, o1-o0, in, true)
			} else {
				part := s.Alloc(rows, in)
				pf, _ := any(part.V).([]float32)
				kernels.PairsMatMul(pf, cf, w2, rows, o1-o0, in, true)
				kernels.AddScaled(yf, pf, 1)
			}
		}
		s.Release(m, s.Mark())
	}
	return y
}

// quantWeight dequantizes a quantized weight into a step buffer in its stored layout [out, in].
func (s *step[E]) quantWeight(lin *weight[E]) (backend.Tensor[E], func()) {
	w := s.Alloc(lin.out, lin.in)
	if s.Err() != nil {
		return w, func() {}
	}
	if wf, ok := any(w.V).([]float32); ok {
		lin.qf.Dequantize(wf, lin.qw)
	} else {
		f := make([]float32, lin.out*lin.in)
		lin.qf.Dequantize(f, lin.qw)
		for i, v := range f {
			w.V[i] = E(v)
		}
	}
	return w, func() { s.ReleaseOne(w) }
}

// widenChunkBytes bounds a bf16 or quantized weight widened into float32 for the float32 GEMM
// (on a path without the bf16 GEMM): a larger one is multiplied a chunk of its outputs at a time
// (widenedChunkProduct). Widened whole, an 8B shape's head was 2.1 GB of the step.
const widenChunkBytes = WidenChunkBytes

// WidenChunkBytes bounds a weight widened into float32 for one product (the memory plan's).
const WidenChunkBytes = 64 << 20

// widenChunk is how many outputs of lin's weight one float32 chunk holds when x·W runs in chunks
// (a float32 pass through the float32 GEMM over a bf16 or quantized weight larger than
// widenChunkBytes): a multiple of 16 that fits (at least 16). 0: the weight is widened whole, or
// not at all. Tests set StepOptions.PairsChunk to force chunks on small models.
func (s *step[E]) widenChunk(x backend.Tensor[E], lin *weight[E]) int {
	if _, ok := any(x.V).([]float32); !ok || !kernels.HaveGEMM() || len(x.Dims) != 2 || (lin.w16 == nil && lin.qw == nil) {
		return 0
	}
	limit := widenChunkBytes / 4
	if s.opts.PairsChunk > 0 {
		limit = s.opts.PairsChunk * lin.in
	}
	if lin.in*lin.out <= limit {
		return 0
	}
	return max(16, limit/lin.in/16*16)
}

// widenedChunkProduct is x·W (x·Wᵀ when transposed, an input gradient) through the float32 GEMM
// for a bf16 or quantized weight too large to widen at once: nc outputs at a time, each chunk
// widened into a step buffer and given back after its product. Forward, x times the chunk fills
// y's columns of the chunk (each the same product as over the whole weight); transposed, dy's
// columns of the chunk times the chunk are summed into dx, chunk after chunk (float32 rounding
// apart from one product).
func (s *step[E]) widenedChunkProduct(x backend.Tensor[E], lin *weight[E], nc int, transposed bool) backend.Tensor[E] {
	lf := any(lin).(*weight[float32]) // widenChunk: float32 passes only
	xf := any(x.V).([]float32)
	rows, in, out := x.Dims[0], lin.in, lin.out
	var y backend.Tensor[E]
	if transposed {
		y = s.Zeros(rows, in)
	} else {
		y = s.Alloc(rows, out)
	}
	yf := any(y.V).([]float32)
	for o0 := 0; o0 < out && s.Err() == nil; o0 += nc {
		o1 := min(out, o0+nc)
		m := s.Mark()
		c := s.Alloc(o1-o0, in)
		if s.Err() != nil {
			break
		}
		outMajor := widenOutputs(any(c.V).([]float32), lf, o0, o1)
		if !outMajor {
			c.Dims = []int{in, o1 - o0}
		}
		if !transposed {
			part := s.MatMul(x, c, 0, outMajor)
			pf, _ := any(part.V).([]float32)
			setColumns(yf, pf, rows, out, o0, o1)
		} else {
			cols := s.Alloc(rows, o1-o0)
			cf, _ := any(cols.V).([]float32)
			columnsOf(cf, xf, rows, out, o0, o1)
			s.MatMulAdd(y, cols, c, !outMajor)
		}
		s.Release(m, s.Mark())
	}
	return y
}

// widenOutputs widens outputs [o0, o1) of a bf16 or quantized weight into dst in float32 and
// reports whether it wrote them as rows ([o1−o0, in]: quantized blocks and a tied head, stored
// [out, in]) or as columns ([in, o1−o0]: the [in, out] rows of the other bf16 weights).
func widenOutputs(dst []float32, lin *weight[float32], o0, o1 int) (outMajor bool) {
	in := lin.in
	switch {
	case lin.qw != nil:
		rowBytes := in / lin.qf.Block * lin.qf.BlockBytes
		kernels.ParallelRows(o1-o0, func(lo, hi int) {
			lin.qf.Dequantize(dst[lo*in:hi*in], lin.qw[(o0+lo)*rowBytes:(o0+hi)*rowBytes])
		})
		return true
	case lin.outIn:
		kernels.WidenBF16(dst, lin.w16[o0*in:o1*in])
		return true
	default:
		kernels.WidenBF16Cols(dst, lin.w16, in, lin.out, o0, o1)
		return false
	}
}

// columnsOf copies columns [c0, c1) of src, a [rows, cols] matrix, into dst ([rows, c1−c0]).
func columnsOf(dst, src []float32, rows, cols, c0, c1 int) {
	for r := range rows {
		copy(dst[r*(c1-c0):(r+1)*(c1-c0)], src[r*cols+c0:r*cols+c1])
	}
}

// setColumns copies src ([rows, c1−c0]) into columns [c0, c1) of dst, a [rows, cols] matrix.
func setColumns(dst, src []float32, rows, cols, c0, c1 int) {
	for r := range rows {
		copy(dst[r*cols+c0:r*cols+c1], src[r*(c1-c0):(r+1)*(c1-c0)])
	}
}

// nonFiniteRows makes every output row NaN whose input row holds a NaN or ±Inf: rounded to
// llama.cpp's 8-bit blocks such a row becomes garbage or zeros (uniform logits), where every
// other product carries the NaN on and the request fails (ErrNonFinite).
func nonFiniteRows(y, x []float32, rows, in, out int) {
	for r := range rows {
		for _, v := range x[r*in : (r+1)*in] {
			if v-v != 0 { // NaN or ±Inf
				nan := float32(math.NaN())
				for j := range out {
					y[r*out+j] = nan
				}
				break
			}
		}
	}
}
