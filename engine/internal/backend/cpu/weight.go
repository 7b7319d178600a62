package cpu

import (
	"fmt"
	"sync"

	"github.com/skein-ai/skein/engine/internal/backend"
	"github.com/skein-ai/skein/engine/internal/kernels"
	"github.com/skein-ai/skein/engine/internal/quant"
	"github.com/skein-ai/skein/engine/internal/tensor"
)

// weight is a frozen base weight as the CPU keeps it: values of the engine's element type, bf16
// bits as rows or packed in pairs of rows for the bf16 unit, or quantized blocks.
type weight[E backend.Float] struct {
	w       backend.Tensor[E] // [in, out]; [out, in] when outIn. Only its dims when kept otherwise
	w16     []uint16          // the weight's bf16 bits in w's layout (nil unless kept in bf16 as rows)
	qw      []byte            // or blocks of the weight as the file has it, [out, in] (blocks along in)
	qf      *quant.Format     // qw's format
	w2      []uint32          // or the bits as pairs of rows of [in, out] (kernels.PackPairs), on a bf16 path
	outIn   bool              // stored [out, in]: an embedding, and a tied head multiplied by it transposed
	in, out int
}

var _ backend.Weight = (*weight[float32])(nil)

func (w *weight[E]) Shape() (in, out int) { return w.in, w.out }
func (w *weight[E]) OutIn() bool          { return w.outIn }

// AddsLoRA: kept in bf16 on a path with a bf16 GEMM, or quantized, the base product reads the
// weight as it is; a merged weight would be float32.
func (w *weight[E]) AddsLoRA() bool {
	return (w.w16 != nil || w.w2 != nil) && kernels.HaveBF16GEMM() || w.qw != nil
}

// Host is a weight as loading made it, in one of its forms (the others nil).
type Host[E backend.Float] struct {
	F      backend.Tensor[E] // values, [in, out] (or [out, in] when OutIn); only dims when kept otherwise
	BF16   []uint16          // bf16 bits in F's layout
	Blocks []byte            // quantized rows of in, [out, in]
	Format *quant.Format
	OutIn  bool
}

// NewWeight keeps a loaded weight the way this CPU multiplies it: bf16 rows of an [in, out]
// weight are packed into pairs for the bf16 unit where the path has one (the same bytes; the
// rows are let go of).
func NewWeight[E backend.Float](h Host[E]) backend.Weight {
	w := &weight[E]{w: h.F, w16: h.BF16, qw: h.Blocks, qf: h.Format, outIn: h.OutIn}
	switch {
	case h.Blocks != nil:
		w.in, w.out = h.F.Dims[0], h.F.Dims[1]
	case h.OutIn:
		w.in, w.out = h.F.Dims[1], h.F.Dims[0]
	default:
		w.in, w.out = h.F.Dims[0], h.F.Dims[1]
		if w.w16 != nil && kernels.HaveBF16GEMM() {
			w.w2, w.w16 = kernels.PackPairs(w.w16, w.in, w.out), nil
		}
	}
	return w
}

// Info is what tests read of a weight's form.
type Info struct {
	BF16Rows []uint16
	Pairs    []uint32
	Blocks   []byte
	Format   *quant.Format
	OutIn    bool
}

// Inspect is w's form (tests).
func Inspect(w backend.Weight) Info {
	switch w := w.(type) {
	case *weight[float32]:
		return Info{BF16Rows: w.w16, Pairs: w.w2, Blocks: w.qw, Format: w.qf, OutIn: w.outIn}
	case *weight[float64]:
		return Info{BF16Rows: w.w16, Pairs: w.w2, Blocks: w.qw, Format: w.qf, OutIn: w.outIn}
	}
	panic(fmt.Sprintf("cpu: %T is not a CPU weight", w))
}

// weightOf is w as this step's element type keeps it.
func weightOf[E backend.Float](w backend.Weight) *weight[E] { return w.(*weight[E]) }

// Product is x·W, or x·Wᵀ when transposed (an input gradient).
func (s *step[E]) Product(x backend.Tensor[E], w backend.Weight, transposed bool) backend.Tensor[E] {
	return s.baseProduct(x, weightOf[E](w), transposed)
}

// Merge: m ← W + scale·m, m in W's stored layout (a LoRA's B·A, or Aᵀ·Bᵀ, merged into it).
func (s *step[E]) Merge(m backend.Tensor[E], w backend.Weight, scale E) {
	wt, done := s.widened(weightOf[E](w))
	kernels.ScaleAdd(m.V, wt.V, scale)
	done()
}

// Embed: row b·T+t is row tokens[b][t] of the embedding (bf16 widened, blocks dequantized);
// positions past a row's end are zero.
func (s *step[E]) Embed(w backend.Weight, tokens [][]int, T int) backend.Tensor[E] {
	ew := weightOf[E](w)
	D := ew.in
	h := s.Zeros(len(tokens)*T, D)
	var buf []float32
	if ew.qw != nil {
		buf = make([]float32, D)
	}
	for b, row := range tokens {
		for t, id := range row {
			n := b*T + t
			dst := h.V[n*D : (n+1)*D]
			switch {
			case ew.qw != nil:
				rowBytes := D / ew.qf.Block * ew.qf.BlockBytes
				ew.qf.Dequantize(buf[:D], ew.qw[id*rowBytes:(id+1)*rowBytes])
				for i, v := range buf[:D] {
					dst[i] = E(v)
				}
			case ew.w16 != nil:
				kernels.WidenBF16(dst, ew.w16[id*D:(id+1)*D])
			default:
				copy(dst, ew.w.V[id*D:(id+1)*D])
			}
		}
	}
	return h
}

// pairs is the buffer steps widen quantized weights into for the bf16 GEMM (step.qPairs),
// kept between steps (as big as the largest such weight: each step would otherwise leave one
// behind for the collector, a gigabyte for an 8B shape's head).
type pairs struct {
	mu  sync.Mutex
	buf []uint32
}

// takePairs is the pairs buffer with room for n words (nil while another step holds it: then a
// new one, which putPairs keeps if it is the bigger).
func (b *Backend) takePairs(n int) []uint32 {
	b.pairs.mu.Lock()
	p := b.pairs.buf
	b.pairs.buf = nil
	b.pairs.mu.Unlock()
	if cap(p) < n {
		p = make([]uint32, n)
	}
	return p[:n]
}

// putPairs gives a step's pairs buffer back.
func (b *Backend) putPairs(p []uint32) {
	if p == nil {
		return
	}
	b.pairs.mu.Lock()
	if cap(p) > cap(b.pairs.buf) {
		b.pairs.buf = p
	}
	b.pairs.mu.Unlock()
}

// PairsChunkWords is the most words of pairs a product over a quantized [out, in] weight widens
// at once (the memory plan's).
func PairsChunkWords(w backend.Weight, pairsChunk int) int {
	in, out := w.Shape()
	if i := Inspect(w); i.Blocks == nil {
		return 0
	}
	return in / 2 * pairsChunkOutputs(pairsChunk, in, out)
}

// transpose writes dst [cols, rows] = scale·srcᵀ for src [rows, cols].
func transpose[E backend.Float](src, dst []E, rows, cols int, scale E) {
	for i := range rows {
		for j := range cols {
			dst[j*rows+i] = scale * src[i*cols+j]
		}
	}
}

// PairsWords is the capacity of the pairs buffer kept between steps (tests: the widest chunk a
// product widened).
func (b *Backend) PairsWords() int {
	b.pairs.mu.Lock()
	defer b.pairs.mu.Unlock()
	return cap(b.pairs.buf)
}

// NewValues is a weight tensor (norms, biases, small tables; the values of a float32 or float64
// linear weight) holding v rounded to E, and its size in bytes.
func NewValues[E backend.Float](v []float64, dims ...int) (backend.Tensor[E], int, error) {
	t, size, err := tensor.NewWeight[E](dims...)
	if err != nil {
		return t, 0, err
	}
	for i, x := range v {
		t.V[i] = E(x)
	}
	return t, size, nil
}
