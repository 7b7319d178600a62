package engine

import (
	"cmp"
	"context"
	"fmt"
	"math"
)

// Prefill: a batch's prompts computed once per request (its samples fork the row), from where
// the prefix cache leaves each, in chunks when long, with prompt logprobs taken as the rows go.

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
