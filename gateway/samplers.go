package gateway

// Sampling: sampling sessions, asample, and how a request becomes a job on a replica's sampler
// (replica/sampling.go batches them per set of weights) and the job's outcome a future's answer.

import (
	"context"
	"errors"
	"net/http"

	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/engine"
	"github.com/skein-ai/skein/replica"
	"github.com/skein-ai/skein/store"
)

// newSampler makes a sampler for a base model or a checkpoint path, on a replica chosen by the
// routing key (if the request has one).
func (s *Server) newSampler(ctx context.Context, tenant, sessionID, base, modelPath, key string) (*sampler, error) {
	smp := &sampler{id: "samp-" + randomHex(8), tenant: tenant, session: sessionID, modelPath: modelPath}
	if modelPath != "" {
		m, err := s.checkpointFor(ctx, tenant, modelPath)
		if err != nil {
			return nil, err
		}
		smp.baseModel = m.BaseModel
		smp.dir = s.ckptDir(m)
		smp.engineID = checkpointEngineID(m)
	} else {
		if base == "" {
			return nil, errf(http.StatusBadRequest, "give base_model or model_path")
		}
		smp.baseModel = base
	}
	rep, err := s.samplingReplica(smp.baseModel, "", key)
	if err != nil {
		return nil, err
	}
	smp.rep = rep
	return smp, nil
}

func (s *Server) createSamplingSession(w http.ResponseWriter, r *http.Request, tenant string) (any, error) {
	var req api.CreateSamplingSessionRequest
	if err := s.decodeJSON(r, &req); err != nil {
		return nil, err
	}
	if _, err := s.sessionOf(tenant, req.SessionID); err != nil {
		return nil, err
	}
	smp, err := s.newSampler(r.Context(), tenant, req.SessionID, req.BaseModel, req.ModelPath, routingKey(r))
	if err != nil {
		return nil, err
	}
	s.registerSampler(smp, req.SessionID)
	return api.CreateSamplingSessionResponse{SamplingSessionID: smp.id, Type: "create_sampling_session"}, nil
}

func (s *Server) getSampler(w http.ResponseWriter, r *http.Request, tenant string) (any, error) {
	id := r.PathValue("id")
	smp, err := s.samplerByID(r.Context(), id)
	if err != nil {
		return nil, err
	}
	if smp == nil || smp.tenant != tenant {
		return nil, errf(http.StatusNotFound, "sampler %q not found", id)
	}
	return api.SamplerInfo{SamplerID: smp.id, BaseModel: smp.baseModel, ModelPath: smp.modelPath}, nil
}

func (s *Server) asample(w http.ResponseWriter, r *http.Request, tenant string) (any, error) {
	var req api.SampleRequest
	if err := s.decodeJSON(r, &req); err != nil {
		return nil, err
	}
	var smp *sampler
	if req.SamplingSessionID != "" {
		var err error
		if smp, err = s.samplerByID(r.Context(), req.SamplingSessionID); err != nil {
			return nil, err
		}
		if smp == nil || smp.tenant != tenant {
			return nil, errf(http.StatusNotFound, "sampling session %q not found", req.SamplingSessionID)
		}
	} else {
		var err error
		if smp, err = s.newSampler(r.Context(), tenant, "", req.BaseModel, req.ModelPath, routingKey(r)); err != nil {
			return nil, err
		}
	}
	// A checkpoint may have been overwritten, unpublished or deleted since the sampler was made.
	smp, err := s.currentWeights(r.Context(), tenant, smp)
	if err != nil {
		return nil, err
	}
	prompt, images, decode, err := s.promptFor(r.Context(), smp.baseModel, req.Prompt)
	if err != nil {
		return nil, err
	}
	sr, err := tinkerSampleRequest(req, prompt, images)
	if err != nil {
		return nil, err
	}
	if decode != nil { // every check first (startSample repeats them, cheaply), then the decode
		info, err := s.infoOf(smp.baseModel)
		if err != nil {
			return nil, err
		}
		check := sr
		if err := info.ValidateSample(&check); err != nil {
			return nil, errf(http.StatusBadRequest, "%v", err)
		}
		if err := s.checkSampleSize(check); err != nil {
			return nil, err
		}
		if err := decode(r.Context()); err != nil {
			return nil, err
		}
	}
	f, err := s.startSample(nil, w, r, tenant, smp, sr)
	if err != nil {
		return nil, err
	}
	return futureResponse(f, ""), nil
}

// samplerByID finds a sampler: in this gateway's registry, else, with several gateways on one
// store, from its row (another gateway made it; nil if there is none). One read from the store
// serves this request and is not kept: the gateway that made it ends it with its session.
func (s *Server) samplerByID(ctx context.Context, id string) (*sampler, error) {
	if smp := s.samplers.get(id); smp != nil || !s.leases.on {
		return smp, nil
	}
	row, err := s.st.GetSampler(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, errf(http.StatusServiceUnavailable, "reading sampler %s: %v", id, err)
	}
	return s.samplerFromRow(row)
}

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
