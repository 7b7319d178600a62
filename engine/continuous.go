package engine

import (
	"cmp"
	"context"
	"errors"
	"slices"
)

// Continuous batching: a sampling loop that takes new requests while it decodes. Between two
// decode steps the loop asks its feed for requests (up to the rows it has room for); their
// prompts are prefilled in a loop of their own, in chunks of Options.PrefillChunk row-tokens
// with one decode step of the running rows after each chunk. Their rows then take finished
// rows' places in the running loop (placeInFinished: only their caches are copied), or both
// loops' live rows move into one new loop (merge; copyRowsFrom: keys, values, DeltaNet
// states). Finished rows are left out of a move, and of a compaction once half the loop's rows
// are done, so a step computes mostly rows still drawing. A request is answered the step its
// last sample ends, not when the loop does.
//
// Each row keeps its own random stream (its seed and its index in its request), so a request
// draws what it draws sampled alone; only the products' rounding differs with the batch
// (logprobs within 1e-4 in f32), as between any two batches of SampleBatch.

// FedRequest is a request of a continuous sampling loop, with its own answer.
type FedRequest struct {
	// Req names its weights in Adapter ("" the base model); at most MaxSampleRows samples and no
	// images (SampleBatch serves those).
	Req SampleRequest
	// Ctx (nil: none) is its client's: once it ends the request's rows stop and Done gets the
	// wrapped error.
	Ctx context.Context
	// Done is called once, on the loop's goroutine, with the request's result or its error
	// (an invalid request, its weights missing, non-finite logits, its Ctx ended, or the loop's
	// compute failing). It must not block.
	Done func(*SampleResult, error)
}

// ContinuousSampler is a compute that runs continuous sampling loops: the in-process engine. A
// worker's client is not one (a loop runs where the model is); its batches are SampleBatch calls.
type ContinuousSampler interface {
	SampleContinuous(ctx context.Context, first []FedRequest, feed func(rows int) []FedRequest) error
}

var _ ContinuousSampler = (*Engine)(nil)

// MaxFedSamples is the most samples a FedRequest may ask for: a loop holds MaxSampleRows rows.
const MaxFedSamples = MaxSampleRows

// SampleContinuous samples first and then whatever feed hands it between decode steps (feed
// nil: nothing more; rows is the room left, at least 1), until every request taken is answered
// and feed has nothing. It returns an error only when the loop's compute failed or ctx ended;
// every request taken has been answered by then.
func (e *Engine) SampleContinuous(ctx context.Context, first []FedRequest, feed func(rows int) []FedRequest) error {
	c := &continuous{e: e, ctx: ctx}
	defer c.free()
	var waiting []waitingRequest
	intake := func(f FedRequest, step int) {
		if n := f.Req.NumSamples; n > MaxFedSamples { // it could never fit the loop's room
			(&fedRequest{FedRequest: f}).answer(nil, inputErr(-1, "num_samples", "%d samples cannot join a sampling loop (at most %d)", n, MaxFedSamples))
			return
		}
		waiting = append(waiting, waitingRequest{f, step})
	}
	for _, f := range first {
		intake(f, 0)
	}
	for step := 0; ; step++ {
		if err := stopped(ctx); err != nil {
			c.failAll(err, waiting)
			return err
		}
		room := MaxSampleRows - c.active() - rowsOf(waiting)
		if feed != nil && room > 0 {
			for _, f := range feed(room) {
				intake(f, step)
				c.lastArrival = step
			}
		}
		// Joining may move every running row (merge): newcomers wait until they are a fair
		// share of the loop or fit in finished rows' places, or for joinWaitSteps steps; one
		// needing more slots than the loop has waits for the share alone (growing the slots
		// moves every row; the running rows end meanwhile).
		n := rowsOf(waiting)
		grow := c.active() > 0 && c.needsMoreSlots(waiting)
		if n > 0 && (c.active() == 0 || joinShare*n >= c.active() || (!grow && (step-waiting[0].since >= joinWaitSteps || c.fitsInFinished(waiting)))) {
			var take []FedRequest
			room := MaxSampleRows - c.active()
			for len(waiting) > 0 && max(waiting[0].Req.NumSamples, 1) <= room {
				room -= max(waiting[0].Req.NumSamples, 1)
				take, waiting = append(take, waiting[0].FedRequest), waiting[1:]
			}
			if len(take) > 0 {
				if err := c.admit(take); err != nil {
					c.failAll(err, waiting)
					return err
				}
				c.answerFinished() // a request whose prompt logprobs failed has ended already
			}
		}
		if c.active() == 0 {
			if len(waiting) == 0 {
				return nil
			}
			continue
		}
		c.step = step
		if err := c.advance(); err != nil {
			c.failAll(err, waiting)
			return err
		}
	}
}

// A request waits to join a running loop until the rows waiting are at least 1/joinShare of
// the loop's, or for joinWaitSteps decode steps: each join moves every running row into a new
// loop, which for a request of a few rows joining a loop of many cost more than the step itself
// (measured: BenchmarkArrivingSamples, design notes).
const (
	joinShare     = 2
	joinWaitSteps = 8
)

// fitsInFinished reports whether the requests waiting would take finished rows' places
// (placeInFinished), costing no move of the running rows.
func (c *continuous) fitsInFinished(waiting []waitingRequest) bool {
	return c.loop != nil && rowsOf(waiting) <= len(c.reusable()) && !c.needsMoreSlots(waiting)
}

// needsMoreSlots reports whether a request waiting needs more cache slots than the loop has
// (its prompt and MaxTokens, as prefillCohort sizes a loop).
func (c *continuous) needsMoreSlots(waiting []waitingRequest) bool {
	ctx := bucket(c.e.Config.MaxPositionEmbeddings, 16)
	for _, w := range waiting {
		if min(bucket(len(w.Req.Prompt)+cmp.Or(w.Req.Params.MaxTokens, DefaultMaxTokens), 16), ctx) > c.S {
			return true
		}
	}
	return false
}

// waitingRequest is a request taken and not yet admitted, with the step it came at.
type waitingRequest struct {
	FedRequest
	since int
}

// rowsOf counts the rows of requests waiting.
func rowsOf(w []waitingRequest) int {
	n := 0
	for _, q := range w {
		n += max(q.Req.NumSamples, 1)
	}
	return n
}

// continuous is a running continuous loop: its rows (row b of loop), each with the logits
// that draw its next token.
type continuous struct {
	e    *Engine
	ctx  context.Context
	loop decodeLoop // nil: no rows yet
	S    int
	rows []*sampleRow
	next [][]float64
	// step is the loop's count of decode steps, lastArrival the step a request last came at
	// (compactions wait joinWaitSteps after it: a newcomer would rather take a finished row's
	// place than move every row twice).
	step, lastArrival int
}

// fedRequest is a request taken into the loop: its rows, its result so far, its weights.
type fedRequest struct {
	FedRequest
	adapter  *Adapter
	result   *SampleResult
	rows     []*sampleRow
	answered bool
}

func (c *continuous) free() {
	if c.loop != nil {
		c.loop.free()
		c.loop = nil
	}
}

// active counts the rows still drawing.
func (c *continuous) active() int {
	n := 0
	for _, r := range c.rows {
		if !r.done {
			n++
		}
	}
	return n
}

// admit validates reqs (each failing alone), prefills the valid ones' prompts with a decode step
// of the running rows between chunks, and moves both into one loop.
func (c *continuous) admit(reqs []FedRequest) error {
	e := c.e
	var fed []*fedRequest
	var sreqs []SampleRequest
	var adapters []*Adapter
	for _, f := range reqs {
		q := &fedRequest{FedRequest: f}
		if err := c.check(q); err != nil {
			q.answer(nil, err)
			continue
		}
		fed, sreqs, adapters = append(fed, q), append(sreqs, q.Req), append(adapters, q.adapter)
	}
	if len(fed) == 0 {
		return nil
	}
	var between func() error
	if c.active() > 0 {
		between = c.advance
	}
	co, err := e.prefillCohort(c.ctx, adapters, sreqs, between)
	if err != nil {
		for _, q := range fed {
			q.answer(nil, err)
		}
		return err
	}
	for ri, q := range fed {
		q.result = co.results[ri]
	}
	for _, r := range co.rows {
		r.owner = fed[r.req]
		r.owner.rows = append(r.owner.rows, r)
	}
	c.merge(co)
	return nil
}

// check validates a fed request and finds its adapter.
func (c *continuous) check(q *fedRequest) error {
	if q.Req.Images != nil {
		return inputErr(-1, "images", "a request with images cannot join a running sampling loop")
	}
	if n := q.Req.NumSamples; n > MaxFedSamples {
		return inputErr(-1, "num_samples", "%d samples cannot join a running sampling loop (at most %d)", n, MaxFedSamples)
	}
	if err := c.e.validateSample(&q.Req); err != nil {
		return err
	}
	if q.Req.Adapter != "" {
		a, err := c.e.adapter(q.Req.Adapter)
		if err != nil {
			return err
		}
		q.adapter = a
	}
	return stopped(q.Ctx)
}

// merge moves the running rows still drawing and a prefilled cohort's rows (nil: none, a
// compaction) into one new loop, each adapter's rows side by side (one run of the batch each),
// and frees the loops they came from.
func (c *continuous) merge(co *cohort) {
	type src struct {
		loop decodeLoop
		b    int
		row  *sampleRow
		next []float64
	}
	if co != nil && c.placeInFinished(co) {
		return
	}
	var moved []src
	for b, r := range c.rows {
		if !r.done {
			moved = append(moved, src{c.loop, b, r, c.next[b]})
		}
	}
	S := c.S
	if co != nil {
		if len(moved) == 0 { // nothing to move: the cohort's loop is the loop
			c.free()
			c.loop, c.S, c.rows, c.next = co.loop, co.S, co.rows, co.next
			return
		}
		for b, r := range co.rows {
			moved = append(moved, src{co.loop, b, r, co.next[b]})
		}
		S = max(S, co.S)
	}
	uid := func(r *sampleRow) uint64 {
		if a := r.owner.adapter; a != nil {
			return a.uid
		}
		return 0
	}
	slices.SortStableFunc(moved, func(x, y src) int { return cmp.Compare(uid(x.row), uid(y.row)) })
	rowAdapters := make([]*Adapter, len(moved))
	rows := make([]*sampleRow, len(moved))
	next := make([][]float64, len(moved))
	for i, m := range moved {
		rowAdapters[i], rows[i], next[i] = m.row.owner.adapter, m.row, m.next
	}
	// Every slot of every row is copied in when all come from loops of S slots.
	whole := !slices.ContainsFunc(moved, func(m src) bool { return m.loop.slots() != S })
	loop := c.e.newDecodeLoopOver(c.ctx, rowAdapters, len(moved), S, nil, !whole)
	// Runs of rows from one loop move together.
	for i := 0; i < len(moved); {
		j := i + 1
		for j < len(moved) && moved[j].loop == moved[i].loop {
			j++
		}
		from := make([]int, j-i)
		for k := range from {
			from[k] = moved[i+k].b
		}
		loop.copyRowsFrom(moved[i].loop, i, from)
		i = j
	}
	c.free()
	if co != nil {
		co.loop.free()
	}
	c.loop, c.S, c.rows, c.next = loop, S, rows, next
}

// placeInFinished puts a cohort's rows in the places of finished rows of the running loop
// (their keys, values and states copied over), when it has enough of them and as many slots:
// a join then moves only the newcomers' rows, not every running row. A finished row whose
// request failed is not reused (its cache may hold non-finite values; the slots past a
// newcomer's own are read as masked-off zeros' partners).
func (c *continuous) placeInFinished(co *cohort) bool {
	if c.loop == nil || co.S > c.S {
		return false
	}
	free := c.reusable()
	if len(free) < len(co.rows) {
		return false
	}
	for i, r := range co.rows {
		b := free[i]
		c.loop.copyRowsFrom(co.loop, b, []int{i})
		c.rows[b], c.next[b] = r, co.next[i]
	}
	co.loop.free()
	adapters := make([]*Adapter, len(c.rows))
	for b, r := range c.rows {
		adapters[b] = r.owner.adapter
	}
	c.loop.setAdapters(adapters)
	return true
}

// reusable lists the finished rows whose places a newcomer may take: those whose request did
// not fail, or failed only because its client went.
func (c *continuous) reusable() []int {
	var out []int
	for b, r := range c.rows {
		if r.done && !slices.ContainsFunc(r.owner.rows, func(o *sampleRow) bool {
			return o.err != nil && !errors.Is(o.err, ErrCancelled)
		}) {
			out = append(out, b)
		}
	}
	return out
}

// advance is one step of the running rows: each draws its next token (from next), requests
// whose rows have all ended are answered, and the rows still drawing are fed back for the
// following logits. Once half the loop's rows have ended and no request came for
// joinWaitSteps steps, the rest move into a loop of their own first.
func (c *continuous) advance() error {
	for _, r := range c.rows {
		if !r.done && r.owner.Ctx != nil && r.owner.Ctx.Err() != nil {
			r.err, r.done = stopped(r.owner.Ctx), true
		}
	}
	c.e.drawTokens(c.rows, c.next)
	reportTokens(c.rows)
	c.stopFailed()
	c.answerFinished()
	n := c.active()
	if n == 0 {
		return nil
	}
	if dead := len(c.rows) - n; 2*dead >= len(c.rows) && c.step-c.lastArrival >= joinWaitSteps {
		c.merge(nil)
	}
	// Each row still drawing feeds the token it just drew, at its position.
	feed, fpos := make([][]int, len(c.rows)), make([][]int, len(c.rows))
	for b, r := range c.rows {
		feed[b], fpos[b] = []int{0}, []int{0}
		if !r.done {
			feed[b][0] = r.seq.Tokens[len(r.seq.Tokens)-1]
			fpos[b][0] = len(r.prompt) + len(r.seq.Tokens) - 1
		}
	}
	logits, err := c.loop.step(feed, fpos, func(b, _ int) bool { return !c.rows[b].done }, nil)
	if err != nil {
		return err
	}
	copy(c.next, logits)
	return nil
}

// stopFailed ends every row of a request one of whose rows failed (stopFailed across cohorts).
func (c *continuous) stopFailed() {
	for _, r := range c.rows {
		if r.err != nil {
			for _, o := range r.owner.rows {
				o.done = true
			}
		}
	}
}

// answerFinished answers each request whose rows have all ended: its sequences in sample
// order, or the first failed row's error.
func (c *continuous) answerFinished() {
	for _, r := range c.rows {
		q := r.owner
		if q.answered || slices.ContainsFunc(q.rows, func(o *sampleRow) bool { return !o.done }) {
			continue
		}
		var err error
		for _, o := range q.rows {
			if o.err != nil {
				err = o.err
				break
			}
			q.result.Sequences = append(q.result.Sequences, o.seq)
		}
		if err != nil {
			q.answer(nil, err)
		} else {
			q.answer(q.result, nil)
		}
	}
}

// failAll answers every request in the loop not yet answered, and those still waiting, with err.
func (c *continuous) failAll(err error, waiting []waitingRequest) {
	for _, r := range c.rows {
		r.done = true
		r.owner.answer(nil, err)
	}
	for _, w := range waiting {
		(&fedRequest{FedRequest: w.FedRequest}).answer(nil, err)
	}
}

func (q *fedRequest) answer(res *SampleResult, err error) {
	if q.answered {
		return
	}
	q.answered = true
	if q.Done != nil {
		q.Done(res, err)
	}
}
