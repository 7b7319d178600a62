package engine

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"math/rand/v2"

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

// sampleRow is one sequence being generated.
type sampleRow struct {
	req      int // index of its request
	prompt   []int
	params   SampleParams
	rng      *rand.Rand
	seq      SampledSequence
	done     bool
	stopTok  map[int]bool
	err      error // the draw failed (non-finite logits): the row's request fails
	sample   int   // index among its request's samples, for OnToken
	onToken  func(sample, token int, logprob float64) bool
	reported int         // tokens handed to onToken so far
	owner    *fedRequest // its request in a continuous loop (continuous.go); nil elsewhere
}

// decode runs one batched prefill + decode loop over the rows of some requests, request i
// sampling adapters[i] (nil: the base model).
func (e *Engine) decode(ctx context.Context, adapters []*Adapter, reqs []SampleRequest) ([]*SampleResult, error) {
	c, err := e.prefillCohort(ctx, adapters, reqs, nil)
	if err != nil {
		return nil, err
	}
	defer c.loop.free()
	if err := e.decodeSteps(ctx, c.loop.step, c.rows, c.next); err != nil {
		return nil, err
	}
	return gatherSequences(c.results, c.rows), nil
}

// cohort is the rows of some requests with their prompts prefilled: the loop holding their
// caches (the caller frees it), the logits that draw each row's next token, and each request's
// result so far (prompt logprobs, cached positions).
type cohort struct {
	loop    decodeLoop
	rows    []*sampleRow
	next    [][]float64 // next[b]: the logits predicting row b's next token
	results []*SampleResult
	S       int // the loop's cache slots
}

// prefillCohort makes the rows of reqs (request i sampling adapters[i]) and prefills their
// prompts in a loop of their own. between (nil: none) runs after each pass of the prefill: a
// continuous loop (continuous.go) takes one decode step of its running rows there, so that
// they wait at most one chunk of a newcomer's prompt; the prefill's chunks are then bounded by
// Options.PrefillChunk.
func (e *Engine) prefillCohort(ctx context.Context, adapters []*Adapter, reqs []SampleRequest, between func() error) (_ *cohort, err error) {
	rows, maxPrompt, maxLen := e.sampleRows(reqs)
	B := len(rows) // no padding rows: a new row count costs only a few matmul compiles
	if e.decodeHook != nil {
		e.decodeHook(B)
	}
	S := min(bucket(maxLen, 16), bucket(e.Config.MaxPositionEmbeddings, 16))
	images, err := e.sampleImageRows(reqs, rows)
	if err != nil {
		return nil, err
	}
	rowAdapters := make([]*Adapter, B)
	for b, r := range rows {
		rowAdapters[b] = adapters[r.req]
	}
	for _, r := range rows {
		e.base.prefix.stats.promptTokens.Add(int64(len(r.prompt)))
	}
	plan := e.planPrefixes(adapters, reqs, images)
	defer plan.release()
	loop := e.newDecodeLoop(ctx, rowAdapters, B, S, images)
	defer func() {
		if err != nil {
			loop.free()
		}
	}()
	chunk := 0
	if between != nil {
		chunk = e.prefillChunkTokens()
	}
	loop.interleave(between, chunk)
	defer loop.interleave(nil, 0)
	step := loop.step

	first := firstRows(rows)
	var logits [][]float64
	var T int
	var results []*SampleResult
	if images == nil && B > len(reqs) && !e.noPrefixShare {
		logits, T, results, err = e.prefillOnce(ctx, loop, adapters, reqs, rows, first, S, maxPrompt, plan)
	} else {
		plan.confirm()
		reqOf := make([]int, B)
		for b, r := range rows {
			reqOf[b] = r.req
		}
		rowOf := make([]int, len(reqs))
		for ri := range reqs {
			rowOf[ri] = first[ri]
		}
		start := plan.starts(reqOf, S)
		plan.load(loop, reqOf, start)
		prompts := e.newPromptLogprobs(reqs, first)
		if images == nil {
			logits, T, err = plan.prefillRows(e, loop, reqs, rows, first, rowOf, maxPrompt, prompts.take, start)
		} else { // in one pass (vlpass.go); the plan is off
			logits, T, err = prefill(step, reqs, rows, first, maxPrompt, 0, prompts.take, nil)
		}
		results = prompts.finish(rows)
		if err == nil {
			plan.store(loop, rowOf)
		}
	}
	plan.release() // the blocks are in the rows' caches now
	if err != nil {
		return nil, err
	}
	for ri, res := range results {
		res.CachedTokens = plan.served[ri]
	}
	stopFailed(rows)

	next := make([][]float64, B)
	for b := range B {
		next[b] = logits[b*T+len(rows[b].prompt)-1]
	}
	return &cohort{loop: loop, rows: rows, next: next, results: results, S: S}, nil
}

// prefillOnce prefills each request's prompt once, in a loop of a row per request, and forks the
// loop's cache into every sample's row of loop (prefix sharing: a group of 16 samples computes
// its prompt once, not 16 times); each sample's first token is drawn from its request's row of
// logits (read only). It returns the logits indexed b·T+t as prefill does (only each row's last
// prompt position is set) and the results with the prompt logprobs.
func (e *Engine) prefillOnce(ctx context.Context, loop decodeLoop, adapters []*Adapter, reqs []SampleRequest, rows []*sampleRow, first map[int]int, S, maxPrompt int, plan *prefixPlan) ([][]float64, int, []*SampleResult, error) {
	once := make([]*sampleRow, len(reqs)) // each request's first row stands for it
	firstOnce := make(map[int]int, len(reqs))
	reqOf := make([]int, len(reqs))
	for ri := range reqs {
		once[ri], firstOnce[ri], reqOf[ri] = rows[first[ri]], ri, ri
	}
	e.prefilled.Add(int64(len(reqs)))
	pre := e.newDecodeLoop(ctx, adapters, len(reqs), S, nil)
	defer pre.free()
	pre.interleave(loop.betweenSteps())
	// A prompt starting with cached blocks (prefixcache.go) computes only the rest.
	plan.confirm()
	start := plan.starts(reqOf, S)
	plan.load(pre, reqOf, start)
	prompts := e.newPromptLogprobs(reqs, firstOnce)
	preLogits, T, err := plan.prefillRows(e, pre, reqs, once, firstOnce, reqOf, maxPrompt, prompts.take, start)
	if err != nil {
		return nil, 0, nil, err
	}
	plan.store(pre, reqOf)
	results := prompts.finish(once)
	from := make([]int, len(rows))
	logits := make([][]float64, len(rows)*T)
	for b, r := range rows {
		from[b] = r.req
		last := len(r.prompt) - 1
		logits[b*T+last] = preLogits[r.req*T+last]
	}
	loop.forkFrom(pre, from)
	return logits, T, results, nil
}

// sampleRows makes the rows of a decode loop, NumSamples of each request in order, each with
// its stop tokens (the request's and the model's end-of-sequence ids) and its random stream; with
// the longest prompt and the longest prompt plus its MaxTokens.
func (e *Engine) sampleRows(reqs []SampleRequest) (rows []*sampleRow, maxPrompt, maxLen int) {
	eos := e.Config.EOSTokens()
	for ri, r := range reqs {
		stop := map[int]bool{}
		for _, t := range r.Params.StopTokens {
			stop[t] = true
		}
		for _, t := range eos {
			stop[t] = true
		}
		for i := range r.NumSamples {
			seed := rand.Uint64()
			if r.Params.Seed != nil {
				seed = uint64(*r.Params.Seed)
			}
			k := r.firstSample + i // the sample's index in its request, also in a part of one
			rows = append(rows, &sampleRow{req: ri, prompt: r.Prompt, params: r.Params,
				rng: rand.New(rand.NewPCG(seed, uint64(k))), stopTok: stop, sample: k, onToken: r.OnToken})
		}
		maxPrompt = max(maxPrompt, len(r.Prompt))
		maxLen = max(maxLen, len(r.Prompt)+r.Params.MaxTokens)
	}
	return rows, maxPrompt, maxLen
}

// firstRows maps each request to its first row.
func firstRows(rows []*sampleRow) map[int]int {
	first := map[int]int{}
	for b := len(rows) - 1; b >= 0; b-- {
		first[rows[b].req] = b
	}
	return first
}

// prefill runs every row's prompt through the model from position 0, filling the cache, and
// returns the logits of each prompt's last token (and those prompt logprobs take through sink),
// indexed b·T+t, with T the padded prompt length. A prefill of more than prefillTokens row-tokens
// runs in chunks of positions (chunk tokens each, a multiple of 16): the first from position 0,
// the next over the cache, as decode steps do, each row's real tokens counted (lens) so that a
// hybrid model's recurrent state stops at its own prompt's end. Each chunk is a pass whose layers
// give turns to others' work, so one long prefill does not hold every other tenant's sample for
// its whole length (a DeltaNet layer over 64 rows × 128 tokens took seconds).
//
// start (nil: every row from 0) is where each row's computation starts, its positions before
// it already in the cache (a prefix cache's blocks): every pass then runs over the cache, row b
// from position start[b], and the passes cover the longest rest rounded up to a multiple of 16
// (padLen); logits stay indexed by position. The caller keeps start[b] plus that span within
// the cache's slots.
func prefill(step stepFunc, reqs []SampleRequest, rows []*sampleRow, first map[int]int, maxPrompt, chunk int, sink rowSink, start []int) ([][]float64, int, error) {
	B, T := len(rows), bucket(maxPrompt, 16)
	from := func(b int) int {
		if start == nil {
			return 0
		}
		return start[b]
	}
	span := T // with a start: the longest rest rounded up to a multiple of 16, not a power of 2
	if start != nil {
		span = padLen(leftToPrefill(rows, start))
	}
	if chunk <= 0 || chunk >= span {
		chunk = span
	}
	want := func(b, t int) bool {
		r := rows[b]
		if t == len(r.prompt)-1 {
			return true
		}
		req := reqs[r.req]
		return first[r.req] == b && t < len(r.prompt)-1 && (req.PromptLogprobs || req.TopKPromptLogprobs > 0)
	}
	logits := make([][]float64, B*T)
	for c0 := 0; c0 < span; c0 += chunk {
		c1 := min(span, c0+chunk)
		tok, pos := make([][]int, B), make([][]int, B)
		var lens []int
		if c1 < span || c0 > 0 || start != nil {
			lens = make([]int, B)
		}
		for b := range B {
			s0 := from(b)
			tok[b], pos[b] = make([]int, c1-c0), make([]int, c1-c0)
			if p := rows[b].prompt; s0+c0 < len(p) {
				copy(tok[b], p[s0+c0:min(s0+c1, len(p))])
			}
			for t := range c1 - c0 {
				pos[b][t] = s0 + c0 + t
			}
			if lens != nil {
				lens[b] = max(0, min(c1, len(rows[b].prompt)-s0)-c0)
			}
		}
		var take rowSink
		if sink != nil {
			take = func(b, t int, row []float64) bool { return sink(b, from(b)+c0+t, row) }
		}
		part, err := step(tok, pos, func(b, t int) bool { return want(b, from(b)+c0+t) }, lens, take)
		if err != nil {
			return nil, 0, err
		}
		for b := range B {
			for t := range c1 - c0 {
				if q := from(b) + c0 + t; q < T {
					logits[b*T+q] = part[b*(c1-c0)+t]
				}
			}
		}
	}
	return logits, T, nil
}

// leftToPrefill is the most prompt positions a row has left to compute from its start (nil:
// 0).
func leftToPrefill(rows []*sampleRow, start []int) int {
	n := 0
	for b, r := range rows {
		s := 0
		if start != nil {
			s = start[b]
		}
		n = max(n, len(r.prompt)-s)
	}
	return n
}

// promptLogprobs starts each request's result and fills in its prompt logprobs where it asked
// for them, from its first row's prefill logits as the head computes them (take, a rowSink): the
// row at position t predicts the prompt's token t+1. Non-finite logits fail that row (finish).
type promptLogprobs struct {
	e       *Engine
	reqs    []SampleRequest
	results []*SampleResult
	asking  map[int]int // a first row asking for prompt logprobs → its request
	bad     [][]error   // per request asking, per prompt position: its logits were not finite
}

func (e *Engine) newPromptLogprobs(reqs []SampleRequest, first map[int]int) *promptLogprobs {
	p := &promptLogprobs{e: e, reqs: reqs, results: make([]*SampleResult, len(reqs)), asking: map[int]int{}, bad: make([][]error, len(reqs))}
	for ri, r := range reqs {
		res := &SampleResult{}
		p.results[ri] = res
		if !r.PromptLogprobs && r.TopKPromptLogprobs == 0 {
			continue
		}
		P := len(r.Prompt)
		p.asking[first[ri]] = ri
		p.bad[ri] = make([]error, P)
		res.PromptLogprobs = make([]float64, P)
		res.PromptLogprobs[0] = math.NaN()
		if r.TopKPromptLogprobs > 0 {
			res.TopKPrompt = make([][]TokenLogprob, P)
		}
	}
	return p
}

// take is the prefill's rowSink: a prompt position's row of a request asking for its logprobs
// becomes that logprob and top-k; every other row (each prompt's last, which samples) is left
// to the prefill's result.
func (p *promptLogprobs) take(b, t int, row []float64) bool {
	ri, ok := p.asking[b]
	if !ok || t >= len(p.reqs[ri].Prompt)-1 {
		return false
	}
	r, res, pos := p.reqs[ri], p.results[ri], t+1
	if err := finiteLogits(row); err != nil {
		p.bad[ri][pos] = err
		return true
	}
	res.PromptLogprobs[pos] = p.e.logprobOf(row, r.Prompt[pos]) // as a training pass computes it
	if r.TopKPromptLogprobs > 0 {
		res.TopKPrompt[pos] = topK(logSoftmax(row), r.TopKPromptLogprobs)
	}
	return true
}

// finish fails the first row of each request whose prompt logits were not finite somewhere,
// naming the first such position, and clears what came after it; it returns the results.
func (p *promptLogprobs) finish(rows []*sampleRow) []*SampleResult {
	for b, ri := range p.asking {
		for pos, err := range p.bad[ri] {
			if err == nil {
				continue
			}
			rows[b].err = fmt.Errorf("prompt logprobs at position %d: %w", pos, err)
			res := p.results[ri]
			clear(res.PromptLogprobs[pos:])
			if res.TopKPrompt != nil {
				clear(res.TopKPrompt[pos:])
			}
			break
		}
	}
	return p.results
}

// decodeSteps draws every running row's next token from next, hands it to OnToken and feeds it
// back for the following logits, until every row is done (or ctx ends, between steps).
func (e *Engine) decodeSteps(ctx context.Context, step stepFunc, rows []*sampleRow, next [][]float64) error {
	for {
		feed, fpos := e.drawTokens(rows, next)
		reportTokens(rows)
		stopFailed(rows)
		active := false
		for _, r := range rows {
			active = active || !r.done
		}
		if !active {
			return nil
		}
		if err := stopped(ctx); err != nil {
			return err
		}
		logits, err := step(feed, fpos, func(b, _ int) bool { return !rows[b].done }, nil)
		if err != nil {
			return err
		}
		for b := range rows {
			next[b] = logits[b]
		}
	}
}

// drawTokens draws the next token of every running row, and returns the step that feeds them:
// each row's token and its position (0 and 0 for a row that is done). Rows draw in parallel:
// each has its own random stream and state, so the outcome does not depend on scheduling.
func (e *Engine) drawTokens(rows []*sampleRow, next [][]float64) (feed, fpos [][]int) {
	B := len(rows)
	feed = make([][]int, B)
	fpos = make([][]int, B)
	par.Rows(B, func(b0, b1 int) {
		for b := b0; b < b1; b++ {
			feed[b], fpos[b] = []int{0}, []int{0}
			if rows[b].done {
				continue
			}
			if t, ok := e.drawToken(rows[b], next[b]); ok {
				feed[b][0] = t
				fpos[b][0] = len(rows[b].prompt) + len(rows[b].seq.Tokens) - 1
			}
		}
	})
	return feed, fpos
}

// drawToken draws row r's next token from the logits that predict it and appends it to the
// row's sequence, ending the row on a stop token or string or at MaxTokens. A failed draw
// (non-finite logits) ends the row with its error and reports false.
func (e *Engine) drawToken(r *sampleRow, logits []float64) (int, bool) {
	t, lp, err := sampleToken(logits, r.params, r.rng)
	if err != nil {
		r.err = fmt.Errorf("sampling token %d: %w", len(r.seq.Tokens), err)
		r.done = true
		return 0, false
	}
	r.seq.Tokens = append(r.seq.Tokens, t)
	r.seq.Logprobs = append(r.seq.Logprobs, lp)
	switch {
	case r.stopTok[t] || e.hitsStopString(r.seq.Tokens, r.params.StopStrings):
		r.seq.StopReason, r.done = "stop", true
	case len(r.seq.Tokens) == r.params.MaxTokens:
		r.seq.StopReason, r.done = "length", true
	}
	return t, true
}

// gatherSequences adds each row's sequence to its request's result, in row order; a request
// one of whose rows failed is answered by the error of its first failed row alone.
func gatherSequences(results []*SampleResult, rows []*sampleRow) []*SampleResult {
	for _, r := range rows {
		results[r.req].Sequences = append(results[r.req].Sequences, r.seq)
	}
	for _, r := range rows {
		if r.err != nil && results[r.req].Err == nil {
			results[r.req] = &SampleResult{Err: r.err}
		}
	}
	return results
}

// reportTokens hands each row's newly drawn token to its request's OnToken, one row after the
// other (the callback need not be safe for concurrent use); a false answer ends the row.
func reportTokens(rows []*sampleRow) {
	for _, r := range rows {
		n := len(r.seq.Tokens)
		if r.onToken == nil || r.err != nil || n == r.reported {
			continue
		}
		r.reported = n
		if !r.onToken(r.sample, r.seq.Tokens[n-1], r.seq.Logprobs[n-1]) && !r.done {
			r.seq.StopReason, r.done = "stop", true
		}
	}
}

// stopFailed ends every row of a request one of whose rows failed: the request's answer is its
// error, so decoding the others would be wasted.
func stopFailed(rows []*sampleRow) {
	failed := map[int]error{}
	for _, r := range rows {
		if r.err != nil {
			failed[r.req] = r.err
		}
	}
	for _, r := range rows {
		if _, ok := failed[r.req]; ok {
			r.done = true
		}
	}
}

// prefillTokens bounds the row-tokens of one prefill pass (rows × positions): a larger prefill
// runs in chunks of positions (prefill), each a pass with turns between its layers.
const prefillTokens = 2048

// prefillChunk is how many positions one pass of loop's prefill of B rows with prompts of up
// to maxPrompt tokens takes: all of them when B × the padded length fits prefillTokens (or the
// engine's test setting, or the loop's own bound: interleave), else a multiple of 16 that does
// (at least 16). 0: no chunks.
func (e *Engine) prefillChunk(loop decodeLoop, B, maxPrompt int) int {
	limit := prefillTokens
	if e.prefillLimit > 0 {
		limit = e.prefillLimit
	}
	if n := loop.prefillLimit(); n > 0 {
		limit = min(limit, n)
	}
	T := bucket(maxPrompt, 16)
	if B*T <= limit {
		return 0
	}
	return max(16, limit/B/16*16)
}

// prefillChunkTokens bounds the row-tokens of a prefill pass while other rows decode
// (Options.PrefillChunk).
func (e *Engine) prefillChunkTokens() int {
	return cmp.Or(e.opts.PrefillChunk, DefaultPrefillChunk)
}
