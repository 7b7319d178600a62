package gateway

// Sampling requests go to a replica's sampler (replica/sampling.go batches them per set of
// weights); this file turns a request into a replica job and the job's outcome into a future's
// answer.

import (
	"context"
	"errors"
	"net/http"

	"github.com/skein-ai/skein/engine"
	"github.com/skein-ai/skein/replica"
)

// DefaultMaxQueuedSamples is how many sampling requests may wait on one replica; past it asample
// answers 429, the SDK's back-pressure signal (it backs off and sends the request again).
const DefaultMaxQueuedSamples = replica.DefaultMaxQueuedSamples

// SamplerCopiesPerReplica bounds the read-only sampler weights a replica keeps in memory.
const SamplerCopiesPerReplica = replica.SamplerCopies

// weightsOf names what a sampler reads, for its replica: its lane is its tenant's for the
// tenant's own weights, and one lane of its own for the base model, whose batches serve every
// tenant.
func weightsOf(smp *sampler) replica.Weights {
	if smp.engineID == "" {
		return replica.Weights{Lane: "sampling:base"}
	}
	return replica.Weights{ID: smp.engineID, Dir: smp.dir, Lane: smp.tenant}
}

// startSample is the one path from a sampling request to a replica's queue, for asample and the
// OpenAI endpoints alike, so both batch together: it picks a replica of the base model (sampling
// reads the weights only, so any healthy one, preferring the one that already holds them; a
// read-only copy loads from disk elsewhere), validates the request against it, checks its size,
// answers 429 when that replica's queue is full, and queues the request on a new future. Each
// caller keeps its own wire shape: asample answers with the future, the OpenAI endpoints wait on
// it (a 400 here reads the same in OpenAI's error shape as their badParam("", msg)). ctx is the
// asking client's while it waits on its connection (OpenAI), nil for a Tinker future.
func (s *Server) startSample(ctx context.Context, w http.ResponseWriter, r *http.Request, tenant string, smp *sampler, sr engine.SampleRequest) (*future, error) {
	prefer := ""
	if smp.rep != nil {
		prefer = smp.rep.ID()
	}
	rep, err := s.samplingReplica(smp.baseModel, prefer, routingKey(r), s.copyHolders(smp)...)
	if err != nil {
		return nil, err
	}
	if err := rep.Info().ValidateSample(&sr); err != nil {
		return nil, errf(http.StatusBadRequest, "%v", err)
	}
	if err := s.checkSampleSize(sr); err != nil {
		return nil, err
	}
	if rep.SamplingFull() {
		w.Header().Set("Retry-After", "1")
		return nil, errf(http.StatusTooManyRequests, "replica %s has %d sampling requests waiting; retry shortly", rep.ID(), rep.SamplingLimit())
	}
	f, _, err := s.futures.create(tenant, "Sample", "")
	if err != nil {
		return nil, err
	}
	if err := s.enqueueSample(ctx, rep, smp, sr, f); err != nil {
		s.finishOn(f, rep.ID(), nil, err)
	}
	return f, nil
}

// enqueueSample queues a validated request on rep; f gets its answer. ctx is the asking
// client's while it waits on its connection (OpenAI), nil for a Tinker future.
func (s *Server) enqueueSample(ctx context.Context, rep *replica.Replica, smp *sampler, req engine.SampleRequest, f *future) error {
	err := rep.Sample(weightsOf(smp), replica.SampleJob{Req: req, Ctx: ctx, Done: func(o replica.SampleOutcome) {
		if o.Err != nil {
			// Sampling only reads weights: on a lost worker the request goes to another replica.
			if s.transportFailed(rep, o.Err) && s.resample(ctx, smp, req, f) {
				return
			}
			s.finishOn(f, rep.ID(), nil, o.Err)
			return
		}
		s.recordSampling(smp, req, o.Result, o.Start, o.Seconds)
		s.finishOn(f, rep.ID(), sampleResponse(o.Result), nil)
	}})
	if errors.Is(err, replica.ErrSamplingFull) {
		return errf(http.StatusTooManyRequests, "replica %s has %d sampling requests waiting; retry shortly", rep.ID(), rep.SamplingLimit())
	}
	return err
}

// resample queues a request of a lost worker on another replica of the base model; false if none.
func (s *Server) resample(ctx context.Context, smp *sampler, req engine.SampleRequest, f *future) bool {
	next, err := s.samplingReplica(smp.baseModel, "", "")
	if err != nil {
		return false
	}
	s.log.Warn("worker lost: sampling again elsewhere", "replica", next.ID(), "request", f.id)
	if err := s.enqueueSample(ctx, next, smp, req, f); err != nil {
		s.finishOn(f, next.ID(), nil, err)
	}
	return true
}
