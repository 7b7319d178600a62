package engine

import (
	"context"

	"github.com/skein-ai/skein/engine/internal/backend"
	"github.com/skein-ai/skein/engine/internal/par"
)

// The decode loop: one batch's key/value caches (and DeltaNet states), the adapters its rows
// read, and the passes (a prefill chunk, a decode step) over them; rows are forked, copied and
// filled from the prefix cache here.

// stepFunc feeds tokens [B][T] at positions [B][T] and returns the logits of the positions want
// accepts, indexed b·T+t (nil elsewhere). In a prefill, a row's prompt ends at the last position
// want accepts: tokens after it are padding (a hybrid model's recurrent state is taken there). Only those rows go through the unembedding: a prefill
// needs one row per sequence unless prompt logprobs were asked for.
// With a sink, each wanted row is offered to it as the head's tiles are computed, and only the
// rows it does not take are returned.
//
// lens (nil: every row's T tokens are real) is each row's count of real tokens in this step:
// a chunk of a prefill after the first, where rows whose prompt has ended carry padding, which
// must not move a hybrid model's recurrent state.
type stepFunc func(tok, pos [][]int, want func(b, t int) bool, lens []int, sink ...rowSink) ([][]float64, error)

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
	l := e.newDecodeLoop(ctx, rowAdapters, B, S, images)
	return l.step, l.free
}

// decodeLoop is one sampling loop's cache and its steps (kvDecoder, of the engine's dtype).
type decodeLoop interface {
	step(tok, pos [][]int, want func(b, t int) bool, lens []int, sink ...rowSink) ([][]float64, error)
	// forkFrom sets every row b's cache (keys, values, DeltaNet states) to row from[b]'s of src,
	// a loop of the same dtype and slots: a prompt prefilled once serves all its samples.
	forkFrom(src decodeLoop, from []int)
	// loadPrefix sets row b's keys and values at positions [0, len(blocks)·kvBlockTokens) to the
	// prefix cache's blocks (prefixcache.go); newBlock makes a block's tensors, in a step of
	// their own (kv nil: none could be had), and saveBlock copies row b's block i into one.
	loadPrefix(b int, blocks []*kvBlock)
	newBlock() (kv any, free func())
	saveBlock(b, i int, kv any) bool
	// takeState is a copy of row b's DeltaNet states (every such layer's conv history and
	// recurrent state), in a step of its own, with its bytes (st nil: none could be had);
	// loadState puts such a copy back into row b.
	takeState(b int) (st any, free func(), bytes int64)
	loadState(b int, st any)
	// interleave sets what runs after each step (nil: nothing) and the row-tokens a prefill
	// pass of this loop takes at most (0: prefillTokens): a continuous loop's decode step runs
	// between the passes of a newcomer's prefill (continuous.go); prefillLimit is that bound.
	interleave(between func() error, chunk int)
	betweenSteps() (between func() error, chunk int)
	prefillLimit() int
	// copyRowsFrom sets rows dst0… of this loop's cache (keys and values at every slot src has,
	// DeltaNet states) to rows from[i] of src, a loop of the same dtype with at most as many
	// slots: a continuous loop moves its running rows and a newcomer's into a loop of both.
	copyRowsFrom(src decodeLoop, dst0 int, from []int)
	slots() int // S: the positions a row's cache holds
	// setAdapters sets the weights each row samples (row b: rowAdapters[b], nil the base
	// model): a continuous loop puts a newcomer's row in a finished row's place.
	setAdapters(rowAdapters []*Adapter)
	free()
}

func (e *Engine) newDecodeLoop(ctx context.Context, rowAdapters []*Adapter, B, S int, images []*imageRow) decodeLoop {
	return e.newDecodeLoopOver(ctx, rowAdapters, B, S, images, true)
}

// newDecodeLoopOver is newDecodeLoop whose cache is zeroed only when zero is set: a loop every
// slot of whose rows is copied in before its first step (copyRowsFrom from loops of as many
// slots) skips writing it twice.
func (e *Engine) newDecodeLoopOver(ctx context.Context, rowAdapters []*Adapter, B, S int, images []*imageRow, zero bool) decodeLoop {
	if e.opts.Float64 {
		d := newKVDecoder[float64](e, rowAdapters, B, S, zero)
		d.images, d.ctx = images, ctx
		return d
	}
	d := newKVDecoder[float32](e, rowAdapters, B, S, zero)
	d.images, d.ctx = images, ctx
	return d
}

func (d *kvDecoder[E]) free() {
	d.e.base.prefix.stats.loopKVBytes.Add(-d.kvBytes)
	d.long.Free()
}

// attention is the cache's keys and values of attention layer l (a row's heads b·KVH…).
func (d *kvDecoder[E]) attention(l int) backend.KV[E] {
	return backend.KV[E]{KeysT: d.cache.keysT[l], Values: d.cache.values[l]}
}

// attnLayers are the indices of the attention layers, in order: the j-th one's heads are
// j·KVH… of a prefix cache block.
func (d *kvDecoder[E]) attnLayers() []int {
	var out []int
	for l, st := range d.cache.dn {
		if st == nil {
			out = append(out, l)
		}
	}
	return out
}

func (d *kvDecoder[E]) loadPrefix(b int, blocks []*kvBlock) {
	KVH := d.cache.KVH
	for i, blk := range blocks {
		kv := blk.kv.(backend.KV[E])
		for j, l := range d.attnLayers() {
			d.long.CopySlots(d.attention(l), kv, b*KVH, i*kvBlockTokens, j*KVH, 0, KVH, kvBlockTokens)
		}
	}
}

func (d *kvDecoder[E]) newBlock() (any, func()) {
	st := newStep[E](d.e)
	heads := len(d.attnLayers()) * d.cache.KVH
	kv := backend.KV[E]{KeysT: st.Alloc(heads, d.cache.hd, kvBlockTokens), Values: st.Alloc(heads, kvBlockTokens, d.cache.hd)}
	if st.Err() != nil {
		st.Free()
		return nil, nil
	}
	return kv, st.Free
}

func (d *kvDecoder[E]) takeState(b int) (any, func(), int64) {
	st := newStep[E](d.e)
	var out []backend.DeltaState[E]
	var n int
	for _, ds := range d.cache.dn {
		if ds == nil {
			continue
		}
		c := backend.DeltaState[E]{Conv: st.Alloc(append([]int{1}, ds.Conv.Dims[1:]...)...), S: st.Alloc(append([]int{1}, ds.S.Dims[1:]...)...)}
		st.CopyRows(c.Conv, 0, ds.Conv, b, 1)
		st.CopyRows(c.S, 0, ds.S, b, 1)
		out = append(out, c)
		n += elems(c.Conv.Dims) + elems(c.S.Dims)
	}
	if st.Err() != nil {
		st.Free()
		return nil, nil, 0
	}
	return out, st.Free, int64(n * d.e.elemSize())
}

func (d *kvDecoder[E]) loadState(b int, st any) {
	saved, j := st.([]backend.DeltaState[E]), 0
	for _, ds := range d.cache.dn {
		if ds == nil {
			continue
		}
		d.long.CopyRows(ds.Conv, b, saved[j].Conv, 0, 1)
		d.long.CopyRows(ds.S, b, saved[j].S, 0, 1)
		j++
	}
}

func (d *kvDecoder[E]) saveBlock(b, i int, kv any) bool {
	dst, KVH := kv.(backend.KV[E]), d.cache.KVH
	for j, l := range d.attnLayers() {
		d.long.CopySlots(dst, d.attention(l), j*KVH, 0, b*KVH, i*kvBlockTokens, KVH, kvBlockTokens)
	}
	return d.long.Err() == nil
}

func (d *kvDecoder[E]) interleave(between func() error, chunk int) {
	d.between, d.chunk = between, chunk
}

func (d *kvDecoder[E]) betweenSteps() (func() error, int) { return d.between, d.chunk }

func (d *kvDecoder[E]) slots() int { return d.cache.S }

// loraCopy is an adapter's LoRA matrices copied into a loop, with its scale.
type loraCopy[E float] struct {
	mats  []*loraMats[E]
	scale E
}

// setAdapters sets the weights each row samples: row b reads rowAdapters[b] (nil: the base
// model). Each adapter's matrices are copied into the loop once, at its first row.
func (d *kvDecoder[E]) setAdapters(rowAdapters []*Adapter) {
	if d.mats == nil {
		d.mats = map[*Adapter]loraCopy[E]{}
	}
	of := func(a *Adapter) loraCopy[E] {
		c, ok := d.mats[a]
		if !ok {
			c.mats, c.scale = loraOf(d.long, a, modelOf[E](d.e.base), false)
			d.mats[a] = c
		}
		return c
	}
	d.lora, d.scale, d.segs = nil, 0, nil
	if runs := adapterRuns(rowAdapters); len(runs) == 1 {
		// One adapter: the pass chooses how to apply it (merged or added) as training does.
		c := of(runs[0].a)
		d.lora, d.scale = c.mats, c.scale
	} else {
		for _, r := range runs {
			c := of(r.a)
			d.segs = append(d.segs, loraSeg[E]{b0: r.b0, b1: r.b1, lora: c.mats, scale: c.scale})
		}
	}
}

func (d *kvDecoder[E]) prefillLimit() int { return d.chunk }

func (d *kvDecoder[E]) copyRowsFrom(src decodeLoop, dst0 int, from []int) {
	s, KVH := src.(*kvDecoder[E]), d.cache.KVH
	for l := range d.cache.dn {
		if st := d.cache.dn[l]; st != nil {
			for i, b := range from {
				d.long.CopyRows(st.Conv, dst0+i, s.cache.dn[l].Conv, b, 1)
				d.long.CopyRows(st.S, dst0+i, s.cache.dn[l].S, b, 1)
			}
			continue
		}
		for i, b := range from {
			d.long.CopySlots(d.attention(l), s.attention(l), (dst0+i)*KVH, 0, b*KVH, 0, KVH, s.cache.S)
		}
	}
}

func (d *kvDecoder[E]) forkFrom(src decodeLoop, from []int) {
	s := src.(*kvDecoder[E])
	for l := range d.cache.dn {
		if st := d.cache.dn[l]; st != nil {
			d.long.CopyBlocks(st.Conv, s.cache.dn[l].Conv, from)
			d.long.CopyBlocks(st.S, s.cache.dn[l].S, from)
			continue
		}
		d.long.CopyBlocks(d.cache.keysT[l], s.cache.keysT[l], from)
		d.long.CopyBlocks(d.cache.values[l], s.cache.values[l], from)
	}
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
	kvBytes  int64                    // the cache's keys, values and DeltaNet states (SamplerStats.LoopKVBytes)
	mats     map[*Adapter]loraCopy[E] // setAdapters: each adapter's matrices, copied once
	between  func() error             // runs after each step (interleave)
	chunk    int                      // row-tokens of a prefill pass at most (interleave; 0: prefillTokens)
}

func newKVDecoder[E float](e *Engine, rowAdapters []*Adapter, B, S int, zero bool) *kvDecoder[E] {
	c := e.Config
	d := &kvDecoder[E]{e: e, B: B, long: newStep[E](e)}
	alloc := d.long.Zeros
	if !zero {
		alloc = d.long.Alloc
	}
	d.cache = &kvCache[E]{KVH: c.NumKeyValueHeads, hd: c.HeadDim, S: S}
	BK := B * c.NumKeyValueHeads
	d.cache.dn = make([]*backend.DeltaState[E], c.NumHiddenLayers)
	for l := range c.NumHiddenLayers {
		if c.isDeltaNet(l) {
			// A fixed-size state per row in place of keys and values (deltanet.go); every row's
			// prefill writes it before a decode step reads it.
			dd := c.dnDims()
			d.cache.dn[l] = &backend.DeltaState[E]{Conv: alloc(B, dd.C, max(dd.K-1, 1)), S: alloc(B, dd.Hv, dd.dk, dd.dv)}
			d.kvBytes += int64(B * (dd.C*max(dd.K-1, 1) + dd.Hv*dd.dk*dd.dv))
			d.cache.keysT, d.cache.values = append(d.cache.keysT, mat[E]{}), append(d.cache.values, mat[E]{})
			continue
		}
		// Slots are written before any query may attend to them; zeroing keeps stale values of a
		// reused buffer out of the masked-off products (0 × NaN would still be NaN).
		d.cache.keysT = append(d.cache.keysT, alloc(BK, c.HeadDim, S))
		d.cache.values = append(d.cache.values, alloc(BK, S, c.HeadDim))
		d.kvBytes += int64(2 * BK * S * c.HeadDim)
	}
	d.kvBytes *= int64(e.elemSize())
	e.base.prefix.stats.loopKVBytes.Add(d.kvBytes)
	d.setAdapters(rowAdapters)
	d.cos, d.sin = ropeTable[E](e.invFreq, S)
	return d
}

// step is the loop's stepFunc: one pass over tokens tok at positions pos, a prefill when every
// row's tokens sit at 0…T-1, a decode step over the cache otherwise; then what interleave set.
func (d *kvDecoder[E]) step(tok, pos [][]int, want func(b, t int) bool, lens []int, sink ...rowSink) ([][]float64, error) {
	out, err := d.pass(tok, pos, want, lens, sink...)
	if err == nil && d.between != nil {
		err = d.between()
	}
	return out, err
}

func (d *kvDecoder[E]) pass(tok, pos [][]int, want func(b, t int) bool, lens []int, sink ...rowSink) (_ [][]float64, err error) {
	defer recoverCompute(&err)
	if d.long.Err() != nil {
		return nil, d.long.Err()
	}
	e := d.e
	B, T := d.B, len(tok[0])
	if e.stepHook != nil {
		e.stepHook(B, T)
	}
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
	d.cache.lens = lens
	if fromStart && lens == nil {
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
		mark := s.op.Mark()
		hm := s.op.GatherRows(h, rows)
		logits, _ := s.unembed(hm)
		if s.op.Err() != nil {
			return nil, s.op.Err()
		}
		host := s.op.Download(logits)
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
		s.op.Release(mark, s.op.Mark())
	}
	return out, s.op.Err()
}
