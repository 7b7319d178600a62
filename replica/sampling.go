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
// saved adapter weights (ID names the copy, Dir holds the saved weights); Lane is where its
// batches wait their turn.
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
	Seconds float64   // its share of the batch's decode time
}

type samplingState struct {
	mu      sync.Mutex
	limit   int
	waiting int                     // requests queued, all weights together
	queues  map[string]*sampleQueue // weights id -> its requests
}

type sampleQueue struct {
	pending   []SampleJob
	scheduled bool // a job on the worker will take everything pending
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
	return r.sampling.waiting
}

// SamplingFull reports whether Sample would answer ErrSamplingFull now.
func (r *Replica) SamplingFull() bool {
	r.sampling.mu.Lock()
	defer r.sampling.mu.Unlock()
	return r.sampling.waiting >= r.sampling.limit
}

// Sample queues a request for w; job.Done gets its answer. A request that arrives while a batch
// for the same weights waits to run joins that batch.
func (r *Replica) Sample(w Weights, job SampleJob) error {
	st := &r.sampling
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.waiting >= st.limit {
		return ErrSamplingFull
	}
	if st.queues == nil {
		st.queues = map[string]*sampleQueue{}
	}
	q := st.queues[w.ID]
	if q == nil {
		q = &sampleQueue{}
		st.queues[w.ID] = q
	}
	q.pending = append(q.pending, job)
	st.waiting++
	if q.scheduled {
		return nil // the job already queued on the worker will take this one too
	}
	q.scheduled = true
	if err := r.RunIn(w.Lane, func() { r.runSamples(w) }); err != nil {
		q.scheduled = false
		q.pending = q.pending[:len(q.pending)-1]
		st.waiting--
		return err
	}
	return nil
}

// runSamples runs on the worker: it takes every request waiting for w and decodes them together.
func (r *Replica) runSamples(w Weights) {
	st := &r.sampling
	st.mu.Lock()
	q := st.queues[w.ID]
	batch := q.pending
	q.pending, q.scheduled = nil, false
	st.waiting -= len(batch)
	delete(st.queues, w.ID) // a request from now on queues a new job
	st.mu.Unlock()
	if len(batch) == 0 {
		return
	}
	fail := func(err error) {
		for _, j := range batch {
			j.Done(SampleOutcome{Err: err})
		}
	}
	// A panic here (a compute bug) fails this batch's requests instead of leaving them pending.
	answered := 0
	defer func() {
		if v := recover(); v != nil {
			slog.Error("sampling panicked", "replica", r.id, "panic", v, "stack", string(debug.Stack()))
			err := &PanicError{Replica: r.id, Value: v, Stack: string(debug.Stack())}
			for _, j := range batch[answered:] {
				j.Done(SampleOutcome{Err: err})
			}
		}
	}()
	ctx, stop := batchContext(batch)
	defer stop()
	if w.ID != "" {
		if !r.compute.HasAdapter(ctx, w.ID) {
			// A read-only copy: the compute knows it takes no LoRA slot.
			if err := r.compute.LoadSnapshot(ctx, w.ID, w.Dir); err != nil {
				answered = len(batch)
				fail(fmt.Errorf("loading sampler weights: %w", err))
				return
			}
		}
		r.keepCopy(ctx, w.ID)
	}
	reqs := make([]engine.SampleRequest, len(batch))
	for i, j := range batch {
		reqs[i] = j.Req
	}
	start := time.Now()
	results, err := r.compute.SampleBatch(ctx, w.ID, reqs)
	if err == nil && len(results) != len(reqs) {
		err = fmt.Errorf("sampling answered %d results for %d requests", len(results), len(reqs))
	}
	if err != nil {
		answered = len(batch)
		fail(err)
		return
	}
	share := time.Since(start).Seconds() / float64(len(batch))
	for i, j := range batch {
		out := SampleOutcome{Result: results[i], Start: start, Seconds: share}
		if results[i] == nil {
			out.Result, out.Err = nil, errors.New("sampling answered no result for this request")
		} else if results[i].Err != nil { // this request failed alone; the others were served
			out.Result, out.Err = nil, results[i].Err
		}
		answered = i + 1
		j.Done(out)
	}
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
	mu  sync.Mutex
	ids []string
}

// keepCopy marks id as just used and unloads the copies past SamplerCopies. It runs on the
// worker, so unloading cannot race a sample on this replica.
func (r *Replica) keepCopy(ctx context.Context, id string) {
	c := &r.copies
	c.mu.Lock()
	c.ids = slices.DeleteFunc(c.ids, func(x string) bool { return x == id })
	c.ids = append(c.ids, id)
	var evict []string
	if n := len(c.ids) - SamplerCopies; n > 0 {
		evict = slices.Clone(c.ids[:n])
		c.ids = c.ids[n:]
	}
	c.mu.Unlock()
	for _, x := range evict {
		r.compute.DeleteAdapter(ctx, x)
	}
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
