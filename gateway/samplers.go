package gateway

// Sampling handlers: sampling sessions and asample (the batching itself is sampling.go).

import (
	"context"
	"errors"
	"net/http"

	"github.com/skein-ai/skein/api"
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
