package replica

// Sampling: requests for the same weights on the same replica are served together. Requests that
// arrive while the replica is busy wait in a queue, and the next job takes them all and decodes
// every sample of every request in shared loops (engine.SampleBatch): an RL step's hundred
// concurrent sample calls become a few batched decodes instead of a hundred batch-of-one ones.
// Sampler weights other than the base model are read-only copies loaded from disk, kept in
// memory up to SamplerCopies per replica, least recently used first out.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/skein-ai/skein/engine"
)

// DefaultMaxQueuedSamples is how many sampling requests may wait on one replica; past it Sample
// answers ErrSamplingFull (the gateway's 429, the SDK's back-pressure signal).
const DefaultMaxQueuedSamples = 4096

// SamplerCopies bounds the read-only sampler weights (ephemeral snapshots, checkpoint copies) a
// replica keeps in memory besides its training adapters; the least recently used go, and reload
// from disk if sampled again.
const SamplerCopies = 8

// ErrSamplingFull is Sample's answer when the replica's sampling queue is full.
var ErrSamplingFull = errors.New("the replica's sampling queue is full")

// Weights names what a sampling request reads: the base model (ID "") or a read-only copy of
// saved adapter weights (ID names the copy, Dir holds the saved weights); Lane is the tenant
// asking, whose requests take turns with other tenants' in a batch (takeBatch).
type Weights struct {
	ID, Dir, Lane string
}

// SampleJob is one sampling request.
type SampleJob struct {
	Req engine.SampleRequest // validated by ModelInfo.ValidateSample
	// Ctx is the asking client's, while it waits on its connection: once every request of a
	// batch has such a client and all of them have gone, the batch's decode stops. nil: none (a
	// Tinker future outlives its request).
	Ctx context.Context
	// Done is called once, on the replica's worker, with the request's outcome; it must not block.
	Done func(SampleOutcome)
}

// SampleOutcome is one request's answer.
type SampleOutcome struct {
	Result  *engine.SampleResult
	Err     error     // the request failed (alone, or with its whole batch)
	Start   time.Time // when its batch's decode started
	Seconds float64   // its time in the decode: from joining a continuous loop to its answer, or its share of a whole batch's
}

type samplingState struct {
	mu        sync.Mutex
	limit     int
	pending   []queuedSample // every weights' requests, oldest first
	scheduled bool           // a job on the worker will take from pending
	stats     SamplingStats
}

type queuedSample struct {
	w   Weights
	job SampleJob
}

// SamplingLane is the lane sampling batches wait in: one batch serves every tenant's requests
// (taken in turn by their Weights.Lane), and it also runs inside other lanes' long ops.
const SamplingLane = "\x01sampling" // no tenant is named so: header values hold no control bytes

// SamplingStats count the sampling batches a replica ran (for /metrics).
type SamplingStats struct {
	Batches  int64 // continuous loops and SampleBatch calls
	Rows     int64 // samples decoded, all batches together
	Adapters int64 // distinct weights per batch, summed
}

// SetSamplingLimit bounds the sampling requests waiting here: 0 means DefaultMaxQueuedSamples,
// a negative n refuses every request (a replica that only trains).
func (r *Replica) SetSamplingLimit(n int) {
	if n == 0 {
		n = DefaultMaxQueuedSamples
	}
	r.sampling.mu.Lock()
	r.sampling.limit = n
	r.sampling.mu.Unlock()
}

// SamplingLimit is the bound SetSamplingLimit set.
func (r *Replica) SamplingLimit() int {
	r.sampling.mu.Lock()
	defer r.sampling.mu.Unlock()
	return r.sampling.limit
}

// SamplingWaiting counts the sampling requests queued here and not yet taken by a batch.
func (r *Replica) SamplingWaiting() int {
	r.sampling.mu.Lock()
	defer r.sampling.mu.Unlock()
	return len(r.sampling.pending)
}

// SamplingStats is what the batches run so far add up to.
func (r *Replica) SamplingStats() SamplingStats {
	r.sampling.mu.Lock()
	defer r.sampling.mu.Unlock()
	return r.sampling.stats
}

// SamplingFull reports whether Sample would answer ErrSamplingFull now.
func (r *Replica) SamplingFull() bool {
	r.sampling.mu.Lock()
	defer r.sampling.mu.Unlock()
	return len(r.sampling.pending) >= r.sampling.limit
}

// Sample queues a request for w; job.Done gets its answer. Every request waiting on the replica,
// whatever weights it reads, joins the next batch: rows of different adapters decode together,
// sharing the base model's products (engine.SampleBatch).
func (r *Replica) Sample(w Weights, job SampleJob) error {
	st := &r.sampling
	st.mu.Lock()
	defer st.mu.Unlock()
	if len(st.pending) >= st.limit {
		return ErrSamplingFull
	}
	st.pending = append(st.pending, queuedSample{w: w, job: job})
	if st.scheduled {
		return nil // the job already queued on the worker will take this one too
	}
	// Never wait for room here, holding the queue: the worker takes it to start a batch.
	if err := r.tryEnqueue(SamplingLane, queuedOp{fn: r.runSamples, interleaved: true}); err != nil {
		st.pending = st.pending[:len(st.pending)-1]
		if errors.Is(err, errNoRoom) {
			return ErrSamplingFull
		}
		return err
	}
	st.scheduled = true
	return nil
}

// takeBatch takes the next batch from the requests waiting: in turn by lane (tenant), up to
// engine.MaxSampleRows samples (at least one request) and the replica's bound of distinct sampler
// copies (SetSamplerCopies),
// so every copy the batch reads stays in memory while it runs. It reports whether requests are
// left for a next batch.
func (r *Replica) takeBatch() ([]queuedSample, bool) {
	maxCopies := r.copyLimit()
	st := &r.sampling
	st.mu.Lock()
	defer st.mu.Unlock()
	st.scheduled = false
	copies := map[string]bool{}
	rows := 0
	batch := st.takeInTurn(func(q queuedSample) pick {
		n := max(q.job.Req.NumSamples, 1)
		newCopy := q.w.ID != "" && !copies[q.w.ID]
		if rows > 0 && (rows+n > engine.MaxSampleRows || (newCopy && len(copies) == maxCopies)) {
			return pickSkip
		}
		rows += n
		if newCopy {
			copies[q.w.ID] = true
		}
		return pickTake
	})
	more := len(st.pending) > 0
	if more {
		st.scheduled = true // by runSamples, below
	}
	return batch, more
}

// pick is takeInTurn's verdict on a lane's oldest request.
type pick int

const (
	pickTake pick = iota // take it
	pickSkip             // leave it, and the lane's others, for now; other lanes go on
	pickStop             // leave it and take nothing more
)

// takeInTurn takes requests from pending in turn by lane (tenant): each round offers every
// lane's oldest request left to choose, until a round takes none (or it says pickStop). The
// requests taken leave pending, the others keep their order. Called with st.mu held.
func (st *samplingState) takeInTurn(choose func(queuedSample) pick) []queuedSample {
	var lanes []string
	byLane := map[string][]int{}
	for i, q := range st.pending {
		if _, ok := byLane[q.w.Lane]; !ok {
			lanes = append(lanes, q.w.Lane)
		}
		byLane[q.w.Lane] = append(byLane[q.w.Lane], i)
	}
	taken := make([]bool, len(st.pending))
	var out []queuedSample
	for progress := true; progress; {
		progress = false
		for _, lane := range lanes {
			idx := byLane[lane]
			if len(idx) == 0 {
				continue
			}
			q := st.pending[idx[0]]
			switch choose(q) {
			case pickStop:
				progress = false
			case pickSkip:
				continue
			case pickTake:
				byLane[lane] = idx[1:]
				taken[idx[0]] = true
				out = append(out, q)
				progress = true
				continue
			}
			break
		}
	}
	if len(out) > 0 {
		left := st.pending[:0:0]
		for i, q := range st.pending {
			if !taken[i] {
				left = append(left, q)
			}
		}
		st.pending = left
	}
	return out
}

// runSamples runs on the worker: it takes a batch of the requests waiting and decodes them
// together, each with its own weights. Requests left over wait for a next job, behind the work
// that came meanwhile (or, with the replica's queue full, run next in this one).
func (r *Replica) runSamples() {
	for {
		batch, more := r.takeBatch()
		r.runBatch(batch)
		if !more || r.tryEnqueue(SamplingLane, queuedOp{fn: r.runSamples, interleaved: true}) == nil {
			return
		}
	}
}

// runBatch decodes a batch of requests together. With continuous batching on a compute that
// runs continuous loops (the in-process engine), the requests that can join one run as a
// continuous loop (runContinuous), after the others' batch.
func (r *Replica) runBatch(batch []queuedSample) {
	cs := continuousOf(r.compute)
	if cs == nil || !r.continuous.Load() {
		r.runWhole(batch)
		return
	}
	var whole, joining []queuedSample
	for _, q := range batch {
		if canJoin(q) {
			joining = append(joining, q)
		} else {
			whole = append(whole, q)
		}
	}
	r.runWhole(whole)
	r.runContinuous(cs, joining)
}

// continuousOf is the compute's continuous sampler: the in-process engine, also behind object
// storage's wrapper (Stored: its loop reads only weights already loaded); nil for a worker's
// client.
func continuousOf(c engine.Compute) engine.ContinuousSampler {
	switch c := c.(type) {
	case engine.ContinuousSampler:
		return c
	case *Stored:
		return continuousOf(c.Compute)
	}
	return nil
}

// SetContinuousBatching makes the replica run its sampling batches as continuous loops, where
// requests arriving meanwhile join (on an in-process engine), instead of whole (false, the
// default: one SampleBatch call; requests arriving meanwhile wait for the next batch, or run
// inside it between its layers): serve's --continuous-batching. Off by default until rows of
// different lengths stop paying the longest row's slots (design notes, issue 39 item 3).
func (r *Replica) SetContinuousBatching(on bool) { r.continuous.Store(on) }

// canJoin reports whether a request may run in a continuous loop: no images, and at most
// engine.MaxFedSamples samples (SampleBatch splits bigger ones into loops of their own).
func canJoin(q queuedSample) bool {
	return q.job.Req.Images == nil && q.job.Req.NumSamples <= engine.MaxFedSamples
}

// loadCopies loads every sampler copy the batch reads that is not in memory; it answers the
// requests whose copy cannot load and returns the others.
func (r *Replica) loadCopies(ctx context.Context, batch []queuedSample, answered []bool) []int {
	failed := map[string]error{}
	for _, q := range batch {
		id := q.w.ID
		if id == "" || failed[id] != nil {
			continue
		}
		if !r.compute.HasAdapter(ctx, id) {
			// A read-only copy: the compute knows it takes no LoRA slot.
			if err := r.compute.LoadSnapshot(ctx, id, q.w.Dir); err != nil {
				failed[id] = fmt.Errorf("loading sampler weights: %w", err)
				continue
			}
		}
		r.keepCopy(ctx, id)
	}
	var ok []int
	for i, q := range batch {
		if err := failed[q.w.ID]; err != nil {
			answered[i] = true
			q.job.Done(SampleOutcome{Err: err})
			continue
		}
		ok = append(ok, i)
	}
	return ok
}

// answerPanic answers, with a recovered panic v, every request of batch not yet answered (a
// compute bug must not leave them pending).
func (r *Replica) answerPanic(v any, batch []queuedSample, answered []bool) {
	slog.Error("sampling panicked", "replica", r.id, "panic", v, "stack", string(debug.Stack()))
	err := &PanicError{Replica: r.id, Value: v, Stack: string(debug.Stack())}
	for i, q := range batch {
		if !answered[i] {
			answered[i] = true
			q.job.Done(SampleOutcome{Err: err})
		}
	}
}

// runWhole decodes a batch of requests in one SampleBatch call.
func (r *Replica) runWhole(batch []queuedSample) {
	if len(batch) == 0 {
		return
	}
	answered := make([]bool, len(batch))
	defer func() {
		if v := recover(); v != nil {
			r.answerPanic(v, batch, answered)
		}
	}()
	jobs := make([]SampleJob, len(batch))
	for i, q := range batch {
		jobs[i] = q.job
	}
	ctx, stop := batchContext(jobs)
	defer stop()
	ctx = r.withTurns(ctx)
	// Every sampler copy the batch reads, in memory; a copy that cannot load fails its requests.
	var reqs []engine.SampleRequest
	var of []int // batch index of each request sent
	weights := map[string]bool{}
	for _, i := range r.loadCopies(ctx, batch, answered) {
		q := batch[i]
		req := q.job.Req
		req.Adapter = q.w.ID
		reqs = append(reqs, req)
		of = append(of, i)
		weights[q.w.ID] = true
	}
	if len(reqs) == 0 {
		return
	}
	start := time.Now()
	results, err := r.compute.SampleBatch(ctx, "", reqs)
	if err == nil && len(results) != len(reqs) {
		err = fmt.Errorf("sampling answered %d results for %d requests", len(results), len(reqs))
	}
	r.countBatch(reqs, len(weights))
	if err != nil {
		for _, i := range of {
			answered[i] = true
			batch[i].job.Done(SampleOutcome{Err: err})
		}
		return
	}
	prompt, generated := 0, 0
	for k, q := range reqs {
		prompt += len(q.Prompt)
		if results[k] != nil {
			for _, seq := range results[k].Sequences {
				generated += len(seq.Tokens)
			}
		}
	}
	// One line a batch: tokens and tokens/s are the generated ones.
	r.logOp("sample", "", start, generated, "requests", len(reqs), "prompt_tokens", prompt)
	share := time.Since(start).Seconds() / float64(len(reqs))
	for k, i := range of {
		out := SampleOutcome{Result: results[k], Start: start, Seconds: share}
		if results[k] == nil {
			out.Result, out.Err = nil, errors.New("sampling answered no result for this request")
		} else if results[k].Err != nil { // this request failed alone; the others were served
			out.Result, out.Err = nil, results[k].Err
		}
		answered[i] = true
		batch[i].job.Done(out)
	}
}

// runContinuous runs a batch as a continuous loop (engine.SampleContinuous): requests queued
// while it decodes join it between two decode steps (joinSamples), and each is answered as its
// last sample ends. It gives no turns between its layers: sampling requests join it instead of
// running inside it, and it stops taking them once other work waits (or while it runs as a
// turn inside another op), so it never holds the replica longer than its rows need.
func (r *Replica) runContinuous(cs engine.ContinuousSampler, batch []queuedSample) {
	if len(batch) == 0 {
		return
	}
	taken := slices.Clone(batch)
	answered := make([]bool, len(batch))
	defer func() { // taken and answered grow as requests join
		if v := recover(); v != nil {
			r.answerPanic(v, taken, answered)
		}
	}()
	ctx := context.Background() // each request stops with its own client (FedRequest.Ctx)
	start := time.Now()
	prompt, generated, counted := 0, 0, false
	weights := map[string]bool{}
	// The loop's statistics count each request as it is fed, before any is answered: a client
	// that reads them after its answer sees its own request counted.
	fed := func(i int) engine.FedRequest {
		q := taken[i]
		req := q.job.Req
		req.Adapter = q.w.ID
		prompt = prompt + len(req.Prompt)
		newWeights := 0
		if !weights[q.w.ID] {
			weights[q.w.ID], newWeights = true, 1
		}
		r.countLoop(!counted, max(req.NumSamples, 1), newWeights)
		counted = true
		joined := time.Now()
		return engine.FedRequest{Req: req, Ctx: q.job.Ctx, Done: func(res *engine.SampleResult, err error) {
			if answered[i] {
				return
			}
			answered[i] = true
			if res != nil {
				for _, seq := range res.Sequences {
					generated += len(seq.Tokens)
				}
			}
			q.job.Done(SampleOutcome{Result: res, Err: err, Start: joined, Seconds: time.Since(joined).Seconds()})
		}}
	}
	var first []engine.FedRequest
	for _, i := range r.loadCopies(ctx, batch, answered) {
		first = append(first, fed(i))
	}
	if len(first) == 0 {
		return
	}
	err := cs.SampleContinuous(ctx, first, func(room int) []engine.FedRequest {
		joining := r.joinSamples(room)
		n := len(taken)
		taken, answered = append(taken, joining...), append(answered, make([]bool, len(joining))...)
		var out []engine.FedRequest
		for _, i := range r.loadCopies(ctx, taken[n:], answered[n:]) {
			out = append(out, fed(n+i))
		}
		return out
	})
	if err != nil {
		slog.Error("sampling loop failed", "replica", r.id, "err", err)
	}
	r.logOp("sample", "", start, generated, "requests", len(taken), "prompt_tokens", prompt)
}

// joinSamples takes the requests waiting that may join a running continuous loop with room
// rows free, in turn by lane as takeBatch does, up to the first that cannot (its rows do not
// fit, it has images or too many samples, or its sampler copy is not in memory and the replica
// keeps as many copies as it may: it waits for the next batch, and nothing behind it jumps
// ahead). It takes none while other work waits on
// the replica, or while the loop runs as a turn inside another op.
func (r *Replica) joinSamples(room int) []queuedSample {
	if r.inTurn {
		return nil
	}
	r.mu.Lock()
	others := false
	for lane, ops := range r.lanes {
		others = others || (lane != SamplingLane && len(ops) > 0)
	}
	r.mu.Unlock()
	if others {
		return nil
	}
	st := &r.sampling
	st.mu.Lock()
	defer st.mu.Unlock()
	// A sampler copy not in memory loads as it joins (loadCopies), only while the replica has
	// room for it: evicting another copy could take one the loop is reading.
	copyRoom, loads := r.copyRoom(), map[string]bool{}
	return st.takeInTurn(func(q queuedSample) pick {
		n := max(q.job.Req.NumSamples, 1)
		load := q.w.ID != "" && !r.HoldsCopy(q.w.ID) && !loads[q.w.ID]
		if n > room || !canJoin(q) || (load && len(loads) == copyRoom) {
			return pickStop
		}
		if load {
			loads[q.w.ID] = true
		}
		room -= n
		return pickTake
	})
}

// countLoop adds a request fed to a continuous loop to the replica's sampling statistics: its
// rows, its weights if the loop had not read them yet, and the loop itself if it is the first.
func (r *Replica) countLoop(first bool, rows, weights int) {
	st := &r.sampling
	st.mu.Lock()
	if first {
		st.stats.Batches++
	}
	st.stats.Rows += int64(rows)
	st.stats.Adapters += int64(weights)
	st.mu.Unlock()
}

// countBatch adds a batch to the replica's sampling statistics.
func (r *Replica) countBatch(reqs []engine.SampleRequest, weights int) {
	rows := 0
	for _, q := range reqs {
		rows += max(q.NumSamples, 1)
	}
	st := &r.sampling
	st.mu.Lock()
	st.stats.Batches++
	st.stats.Rows += int64(rows)
	st.stats.Adapters += int64(weights)
	st.mu.Unlock()
}

// batchContext is the context a batch samples under: it ends once every request's client has
// gone. A request without a client context (a Tinker future, polled later) keeps it running.
func batchContext(batch []SampleJob) (context.Context, func()) {
	for _, j := range batch {
		if j.Ctx == nil {
			return context.Background(), func() {}
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	var left atomic.Int64
	left.Store(int64(len(batch)))
	stops := make([]func() bool, 0, len(batch))
	for _, j := range batch {
		stops = append(stops, context.AfterFunc(j.Ctx, func() {
			if left.Add(-1) == 0 {
				cancel()
			}
		}))
	}
	return ctx, func() {
		for _, stop := range stops {
			stop()
		}
		cancel()
	}
}

// copyLRU lists the sampler copies in memory, least recently used first.
type copyLRU struct {
	mu    sync.Mutex
	ids   []string
	limit int // 0: SamplerCopies
}

// SetSamplerCopies bounds the sampler copies kept in memory here (n ≤ 0: SamplerCopies).
func (r *Replica) SetSamplerCopies(n int) {
	c := &r.copies
	c.mu.Lock()
	c.limit = n
	c.mu.Unlock()
}

// copyLimit is the bound SetSamplerCopies set.
func (r *Replica) copyLimit() int {
	c := &r.copies
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.limit <= 0 {
		return SamplerCopies
	}
	return c.limit
}

// keepCopy marks id as just used and unloads the copies past SamplerCopies. It runs on the
// worker, so unloading cannot race a sample on this replica.
func (r *Replica) keepCopy(ctx context.Context, id string) {
	c := &r.copies
	c.mu.Lock()
	c.ids = slices.DeleteFunc(c.ids, func(x string) bool { return x == id })
	c.ids = append(c.ids, id)
	var evict []string
	limit := c.limit
	if limit <= 0 {
		limit = SamplerCopies
	}
	if n := len(c.ids) - limit; n > 0 {
		evict = slices.Clone(c.ids[:n])
		c.ids = c.ids[n:]
	}
	c.mu.Unlock()
	for _, x := range evict {
		r.compute.DeleteAdapter(ctx, x)
	}
}

// copyRoom is how many more sampler copies the replica may keep without evicting one.
func (r *Replica) copyRoom() int {
	c := &r.copies
	c.mu.Lock()
	defer c.mu.Unlock()
	limit := c.limit
	if limit <= 0 {
		limit = SamplerCopies
	}
	return max(0, limit-len(c.ids))
}

// HoldsCopy reports whether a sampler copy is in memory here (the router's sampling profile
// prefers such replicas).
func (r *Replica) HoldsCopy(id string) bool {
	c := &r.copies
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Contains(c.ids, id)
}

// SamplerCopyIDs lists the sampler copies in memory here, least recently used first.
func (r *Replica) SamplerCopyIDs() []string {
	c := &r.copies
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.ids)
}

// DropCopies unloads the sampler copies that match (their weights were deleted or overwritten),
// on the worker, after the samples already queued, so no sample of them is cut short. A closed
// replica holds nothing to free.
func (r *Replica) DropCopies(match func(id string) bool) {
	c := &r.copies
	c.mu.Lock()
	var drop []string
	c.ids = slices.DeleteFunc(c.ids, func(id string) bool {
		if match(id) {
			drop = append(drop, id)
			return true
		}
		return false
	})
	c.mu.Unlock()
	if len(drop) == 0 {
		return
	}
	_ = r.Run(func() {
		for _, id := range drop {
			r.compute.DeleteAdapter(context.Background(), id)
		}
	})
}
