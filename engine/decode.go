package engine

import (
	"context"

	"github.com/skein-ai/skein/engine/internal/backend"
	"github.com/skein-ai/skein/engine/internal/par"
)

// The sampler's passes (prefill and each decode step) are the transformer's layer
// (transformer.go) over a KV cache: a prefill, whose tokens sit at positions 0…T-1, attends
// over its own keys and values exactly as a training pass does and fills the cache on the way;
// a decode step writes its tokens' keys and values into the cache at their rows' positions and
// attends over the cache. Both are forward-only passes: one layer's tensors at a time.

// stepFunc feeds tokens [B][T] at positions [B][T] and returns the logits of the positions want
// accepts, indexed b·T+t (nil elsewhere). In a prefill, a row's prompt ends at the last position
// want accepts: tokens after it are padding (a hybrid model's recurrent state is taken there). Only those rows go through the unembedding: a prefill
// needs one row per sequence unless prompt logprobs were asked for.
// With a sink, each wanted row is offered to it as the head's tiles are computed, and only the
// rows it does not take are returned.
type stepFunc func(tok, pos [][]int, want func(b, t int) bool, sink ...rowSink) ([][]float64, error)

// rowSink takes one wanted row's logits (b, t), widened to float64, instead of the step returning
// it, and reports whether it did. Prompt logprobs reduce each prompt position to its logprob and
// top-k this way, so a long prompt never holds [prompt × vocabulary] logits (a 4096-token prompt
// over Qwen3's 151,936 tokens was 7.5 GB of them). It must not keep row, and is called from
// several goroutines at once, each with its own rows.
type rowSink func(b, t int, row []float64) bool

// newDecodeStep returns the step function of one sampling loop over B rows and S cache slots, and
// a function that frees its cache.
func (e *Engine) newDecodeStep(a *Adapter, B, S int) (stepFunc, func()) {
	return e.newDecodeStepImages(context.Background(), a, B, S, nil)
}

// newDecodeStepImages is newDecodeStep over rows whose prompts may hold images (vlpass.go; nil:
// none has). A step stops between layers once ctx ends.
func (e *Engine) newDecodeStepImages(ctx context.Context, a *Adapter, B, S int, images []*imageRow) (stepFunc, func()) {
	rows := make([]*Adapter, B)
	for b := range rows {
		rows[b] = a
	}
	return e.newDecodeStepRows(ctx, rows, B, S, images)
}

// newDecodeStepRows is newDecodeStepImages over rows of several adapters: row b samples
// rowAdapters[b] (nil: the base model).
func (e *Engine) newDecodeStepRows(ctx context.Context, rowAdapters []*Adapter, B, S int, images []*imageRow) (stepFunc, func()) {
	if e.opts.Float64 {
		d := newKVDecoder[float64](e, rowAdapters, B, S)
		d.images, d.ctx = images, ctx
		return d.step, d.long.Free
	}
	d := newKVDecoder[float32](e, rowAdapters, B, S)
	d.images, d.ctx = images, ctx
	return d.step, d.long.Free
}

type kvDecoder[E float] struct {
	e        *Engine
	B        int
	long     step[E] // cache and LoRA matrices: live for the whole loop
	cache    *kvCache[E]
	lora     []*loraMats[E] // one adapter for every row
	scale    E
	segs     []loraSeg[E] // or runs of rows of several adapters (nil: one)
	cos, sin []E          // [S, hd/2]
	images   []*imageRow  // per row; nil: no row has images
	shift    []int        // per row: decode positions' mRoPE delta (set at the first decode step)
	ctx      context.Context
}

func newKVDecoder[E float](e *Engine, rowAdapters []*Adapter, B, S int) *kvDecoder[E] {
	c := e.Config
	d := &kvDecoder[E]{e: e, B: B, long: newStep[E](e)}
	d.cache = &kvCache[E]{KVH: c.NumKeyValueHeads, hd: c.HeadDim, S: S}
	BK := B * c.NumKeyValueHeads
	d.cache.dn = make([]*backend.DeltaState[E], c.NumHiddenLayers)
	for l := range c.NumHiddenLayers {
		if c.isDeltaNet(l) {
			// A fixed-size state per row in place of keys and values (deltanet.go); every row's
			// prefill writes it before a decode step reads it.
			dd := c.dnDims()
			d.cache.dn[l] = &backend.DeltaState[E]{Conv: d.long.Zeros(B, dd.C, max(dd.K-1, 1)), S: d.long.Zeros(B, dd.Hv, dd.dk, dd.dv)}
			d.cache.keysT, d.cache.values = append(d.cache.keysT, mat[E]{}), append(d.cache.values, mat[E]{})
			continue
		}
		// Slots are written before any query may attend to them; zeroing keeps stale values of a
		// reused buffer out of the masked-off products (0 × NaN would still be NaN).
		d.cache.keysT = append(d.cache.keysT, d.long.Zeros(BK, c.HeadDim, S))
		d.cache.values = append(d.cache.values, d.long.Zeros(BK, S, c.HeadDim))
	}
	if runs := adapterRuns(rowAdapters); len(runs) == 1 {
		// One adapter: the pass chooses how to apply it (merged or added) as training does.
		d.lora, d.scale = loraOf(d.long, runs[0].a, modelOf[E](e.base), false)
	} else {
		for _, r := range runs {
			lora, _ := loraOf(d.long, r.a, modelOf[E](e.base), false)
			d.segs = append(d.segs, loraSeg[E]{b0: r.b0, b1: r.b1, lora: lora})
		}
	}
	d.cos, d.sin = ropeTable[E](e.invFreq, S)
	return d
}

// step is the loop's stepFunc: one pass over tokens tok at positions pos, a prefill when every
// row's tokens sit at 0…T-1, a decode step over the cache otherwise.
func (d *kvDecoder[E]) step(tok, pos [][]int, want func(b, t int) bool, sink ...rowSink) (_ [][]float64, err error) {
	defer recoverCompute(&err)
	if d.long.Err() != nil {
		return nil, d.long.Err()
	}
	e := d.e
	B, T := d.B, len(tok[0])
	fromStart, err := d.checkPositions(pos, T)
	if err != nil {
		return nil, err
	}
	ar := newStep[E](e)
	defer ar.Free()
	parts := passParts[E]{ctx: d.ctx, lora: d.lora, scale: d.scale, segs: d.segs, cos: d.cos, sin: d.sin, cache: d.cache}
	if !fromStart {
		parts.pos = pos
	}
	d.cache.lens = nil
	if fromStart {
		d.cache.lens = prefillLens(B, T, want)
	}
	s := newPass(e, ar, B, T, parts)
	d.useImages(s, fromStart)
	m0 := ar.Mark()
	h, _ := s.layers(s.embed(tok), m0)
	if ar.Err() != nil {
		return nil, ar.Err()
	}
	var take rowSink
	if len(sink) > 0 {
		take = sink[0]
	}
	return s.wantedLogits(h, want, take)
}

// prefillLens is each row's prompt length in a prefill: one past the last position want
// accepts (a prefill always asks for the logits at each prompt's last token, and none after
// it; see stepFunc). The DeltaNet state of a row is taken there, not at the padded end.
func prefillLens(B, T int, want func(b, t int) bool) []int {
	lens := make([]int, B)
	for b := range B {
		lens[b] = T
		for t := T - 1; t >= 0; t-- {
			if want(b, t) {
				lens[b] = t + 1
				break
			}
		}
	}
	return lens
}

// checkPositions checks every position of a step [B][T] lies in the cache, and reports whether
// every row's tokens sit at positions 0…T-1: a prefill.
func (d *kvDecoder[E]) checkPositions(pos [][]int, T int) (fromStart bool, err error) {
	fromStart = true
	for b := range d.B {
		for t := range T {
			if pos[b][t] < 0 || pos[b][t] >= d.cache.S {
				return false, inputErr(-1, "prompt", "position %d outside the cache of %d", pos[b][t], d.cache.S)
			}
			fromStart = fromStart && pos[b][t] == t
		}
	}
	return fromStart, nil
}

// wantedLogits are the logits of the rows of h [B·T, D] that want accepts, widened to float64
// and indexed b·T+t (nil elsewhere, and where sink took the row). Only those rows go through the
// unembedding, in tiles of the head's rows (headTileRows: at most 64 MB of logits), each given
// back before the next.
func (s *pass[E]) wantedLogits(h mat[E], want func(b, t int) bool, sink rowSink) ([][]float64, error) {
	T, V := s.T, s.c.VocabSize
	N := s.B * T
	var picked []int
	for n := range N {
		if want(n/T, n%T) {
			picked = append(picked, n)
		}
	}
	out := make([][]float64, N)
	defer func() { s.rowBatch = nil }()
	tile := s.e.headTileRows()
	for i0 := 0; i0 < len(picked); i0 += tile {
		rows := picked[i0:min(len(picked), i0+tile)]
		if s.segs != nil { // the head's rows are the picked ones: each keeps its adapter
			s.rowBatch = make([]int, len(rows))
			for i, n := range rows {
				s.rowBatch[i] = n / T
			}
		}
		mark := s.ar.Mark()
		hm := s.ar.GatherRows(h, rows)
		logits, _ := s.unembed(hm)
		if s.ar.Err() != nil {
			return nil, s.ar.Err()
		}
		host := s.ar.Download(logits)
		par.Rows(len(rows), func(r0, r1 int) {
			var row []float64 // reused while the sink takes the rows
			for i := r0; i < r1; i++ {
				if row == nil {
					row = make([]float64, V)
				}
				for j, v := range host[i*V : (i+1)*V] {
					row[j] = float64(v)
				}
				n := rows[i]
				if sink != nil && sink(n/T, n%T, row) {
					continue
				}
				out[n], row = row, nil
			}
		})
		s.ar.Release(mark, s.ar.Mark())
	}
	return out, s.ar.Err()
}
