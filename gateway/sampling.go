package gateway

import (
	"context"
	"fmt"
	"math"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/engine"
	"github.com/skein-ai/skein/replica"
)

// sampleBatcher: sampling requests for the same weights on the same replica are served together: requests that
// arrive while the replica is busy wait in a queue, and the next job takes them all and decodes
// every sample of every request in shared loops (engine.SampleBatch). An RL step's hundred
// concurrent sample calls become a few batched decodes instead of a hundred batch-of-one ones.

type pendingSample struct {
	req engine.SampleRequest
	f   *future
	ctx context.Context // the asking client's, while it waits on the connection; nil: none (a future outlives its request)
}

type sampleQueue struct {
	pending   []pendingSample
	scheduled bool
}

type sampleBatcher struct {
	mu      sync.Mutex
	queues  map[string]*sampleQueue // replica id + "|" + engine adapter id
	waiting map[string]int          // replica id -> requests queued there
}

// DefaultMaxQueuedSamples is how many sampling requests may wait on one replica; past it asample
// answers 429, the SDK's back-pressure signal (it backs off and sends the request again).
const DefaultMaxQueuedSamples = 4096

// samplingBusy reports whether a replica's sampling queue is full.
func (s *Server) samplingBusy(rep *replica.Replica) bool {
	s.sampling.mu.Lock()
	defer s.sampling.mu.Unlock()
	return s.sampling.waiting[rep.ID()] >= s.opts.MaxQueuedSamples
}

func (s *Server) enqueueSample(rep *replica.Replica, smp *sampler, req engine.SampleRequest, f *future) error {
	return s.enqueueSampleFor(nil, rep, smp, req, f)
}

// enqueueSampleFor is enqueueSample for a client that waits on its connection: once every
// request of a batch has such a client and all of them have gone, the batch's decode stops.
func (s *Server) enqueueSampleFor(ctx context.Context, rep *replica.Replica, smp *sampler, req engine.SampleRequest, f *future) error {
	key := rep.ID() + "|" + smp.engineID
	s.sampling.mu.Lock()
	defer s.sampling.mu.Unlock()
	if s.sampling.queues == nil {
		s.sampling.queues = map[string]*sampleQueue{}
		s.sampling.waiting = map[string]int{}
	}
	q := s.sampling.queues[key]
	if q == nil {
		q = &sampleQueue{}
		s.sampling.queues[key] = q
	}
	q.pending = append(q.pending, pendingSample{req: req, f: f, ctx: ctx})
	s.sampling.waiting[rep.ID()]++
	if q.scheduled {
		return nil // the job already queued on the replica will take this one too
	}
	q.scheduled = true
	err := rep.RunIn(samplingLane(smp), func() { s.runSamples(rep, smp, key) })
	if err != nil {
		q.scheduled = false
		q.pending = q.pending[:len(q.pending)-1]
		s.sampling.waiting[rep.ID()]--
	}
	return err
}

// samplingLane is the replica lane a sampling job waits in: its tenant's, for the tenant's own
// weights; one lane of its own for the base model, whose batches serve every tenant.
func samplingLane(smp *sampler) string {
	if smp.engineID == "" {
		return "sampling:base"
	}
	return smp.tenant
}

// runSamples runs on the replica's worker: it takes every waiting request for these weights.
func (s *Server) runSamples(rep *replica.Replica, smp *sampler, key string) {
	s.sampling.mu.Lock()
	q := s.sampling.queues[key]
	batch := q.pending
	q.pending, q.scheduled = nil, false
	s.sampling.waiting[rep.ID()] -= len(batch)
	s.sampling.mu.Unlock()
	if len(batch) == 0 {
		return
	}
	ctx, stop := batchContext(batch)
	defer stop()
	fail := func(err error) {
		// Sampling only reads weights: on a lost worker the batch goes to another replica.
		if s.transportFailed(rep, err) && s.resample(smp, batch) {
			return
		}
		for _, p := range batch {
			s.finishOn(p.f, rep.ID(), nil, err)
		}
	}
	// A panic here (a compute bug) fails this batch's requests instead of leaving them pending;
	// futures already answered keep their answer.
	defer func() {
		if v := recover(); v != nil {
			s.log.Error("sampling panicked", "replica", rep.ID(), "panic", v, "stack", string(debug.Stack()))
			fail(fmt.Errorf("internal error while sampling: %v", v))
		}
	}()
	e := rep.Engine
	if smp.engineID != "" {
		if !e.HasAdapter(ctx, smp.engineID) {
			// A read-only copy: the replica knows it takes no LoRA slot.
			if err := e.LoadSnapshot(ctx, smp.engineID, smp.dir); err != nil {
				fail(fmt.Errorf("loading sampler weights: %w", err))
				return
			}
		}
		s.keepSamplerCopy(rep, smp.engineID)
	}
	reqs := make([]engine.SampleRequest, len(batch))
	for i, p := range batch {
		reqs[i] = p.req
	}
	start := time.Now()
	results, err := e.SampleBatch(ctx, smp.engineID, reqs)
	if err != nil {
		fail(err)
		return
	}
	share := time.Since(start).Seconds() / float64(len(batch))
	for i, p := range batch {
		if results[i].Err != nil { // this request failed alone; the others of the batch were served
			s.finishOn(p.f, rep.ID(), nil, results[i].Err)
			continue
		}
		s.recordSampling(smp, p.req, results[i], start, share)
		s.finishOn(p.f, rep.ID(), sampleResponse(results[i]), nil)
	}
}

// batchContext is the context a batch samples under: it ends once every request's client has
// gone. A request without a client context (a Tinker future, polled later) keeps it running.
func batchContext(batch []pendingSample) (context.Context, func()) {
	for _, p := range batch {
		if p.ctx == nil {
			return context.Background(), func() {}
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	var left atomic.Int64
	left.Store(int64(len(batch)))
	stops := make([]func() bool, 0, len(batch))
	for _, p := range batch {
		stops = append(stops, context.AfterFunc(p.ctx, func() {
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

// resample queues a batch of a lost worker on another replica of the base model; false if none.
func (s *Server) resample(smp *sampler, batch []pendingSample) bool {
	next, err := s.samplingReplica(smp.baseModel, "", "")
	if err != nil {
		return false
	}
	s.log.Warn("worker lost: sampling again elsewhere", "replica", next.ID(), "requests", len(batch))
	for _, p := range batch {
		if err := s.enqueueSampleFor(p.ctx, next, smp, p.req, p.f); err != nil {
			s.finishOn(p.f, next.ID(), nil, err)
		}
	}
	return true
}

func sampleResponse(res *engine.SampleResult) *api.SampleResponse {
	out := &api.SampleResponse{Type: "sample"}
	for _, q := range res.Sequences {
		out.Sequences = append(out.Sequences, api.SampledSequence{StopReason: q.StopReason, Tokens: q.Tokens, Logprobs: q.Logprobs})
	}
	for _, v := range res.PromptLogprobs {
		if math.IsNaN(v) {
			out.PromptLogprobs = append(out.PromptLogprobs, nil)
		} else {
			v := v
			out.PromptLogprobs = append(out.PromptLogprobs, &v)
		}
	}
	for _, row := range res.TopKPrompt {
		var r [][2]float64
		for _, t := range row {
			r = append(r, [2]float64{float64(t.Token), t.Logprob})
		}
		out.TopKPromptLogprobs = append(out.TopKPromptLogprobs, r)
	}
	return out
}

// SamplerCopiesPerReplica bounds the read-only sampler weights (ephemeral snapshots, checkpoint
// copies) a replica keeps in memory besides its training adapters; the least recently used go,
// and reload from disk if sampled again.
const SamplerCopiesPerReplica = 8

type samplerCopies struct {
	mu  sync.Mutex
	lru map[string][]string // replica id -> engine ids, least recently used first
}

// keepSamplerCopy marks engineID as just used on rep and unloads the copies past the bound.
// It runs on rep's worker, so the unloading cannot race a sample on the same replica.
func (s *Server) keepSamplerCopy(rep *replica.Replica, engineID string) {
	c := &s.copies
	c.mu.Lock()
	if c.lru == nil {
		c.lru = map[string][]string{}
	}
	ids := c.lru[rep.ID()]
	for i, id := range ids {
		if id == engineID {
			ids = append(ids[:i:i], ids[i+1:]...)
			break
		}
	}
	ids = append(ids, engineID)
	var evict []string
	for len(ids) > SamplerCopiesPerReplica {
		evict = append(evict, ids[0])
		ids = ids[1:]
	}
	c.lru[rep.ID()] = ids
	c.mu.Unlock()
	for _, id := range evict {
		rep.Engine.DeleteAdapter(context.Background(), id)
	}
}
