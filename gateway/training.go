package gateway

// Training runs: create_model, get_info, unload_model, forward and forward_backward, optim_step.

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/engine"
	"github.com/skein-ai/skein/replica"
)

// dropAdapter frees an unloaded or expired run's slot and memory. Its full state (including
// gradients accumulated since the last step) is saved first, so it can be loaded again.
func (s *Server) dropAdapter(run *trainingRun) {
	s.queueOf(run).abandon() // its buffered requests can never run now
	if ep, ok := s.router.Where(run.id); ok {
		if rep, err := s.replicaFor(ep); err == nil {
			// In the tenant's lane, so that it runs after the run's ops already queued there.
			_ = rep.Unload(s.adapterOf(run))
		}
	}
	s.router.Forget(run.id)
	s.logErr("placement", s.st.DeletePlacement(context.Background(), run.id))
}

// runOf finds a tenant's training run; another tenant's is a 404.
func (s *Server) runOf(tenant, id string) (*trainingRun, error) {
	s.runs.mu.Lock()
	defer s.runs.mu.Unlock()
	run := s.runs.m[id]
	if run == nil || run.tenant != tenant {
		return nil, errf(http.StatusNotFound, "model %q not found", id)
	}
	return run, nil
}

// usedRun is runOf for a request that acts on the run (trains, saves, loads, unloads): it also
// moves the run's last_request_time. Reads (get_info, get_training_run) leave it, so that a console
// or `tinker run list` looking at runs does not make them all "just now".
func (s *Server) usedRun(tenant, id string) (*trainingRun, error) {
	run, err := s.runOf(tenant, id)
	if err != nil {
		return nil, err
	}
	s.runs.mu.Lock()
	run.lastRequest = time.Now()
	s.runs.mu.Unlock()
	return run, nil
}

func (s *Server) createModel(w http.ResponseWriter, r *http.Request, tenant string) (any, error) {
	var req api.CreateModelRequest
	if err := s.decodeJSON(r, &req); err != nil {
		return nil, err
	}
	if err := checkMetadata(req.UserMetadata); err != nil {
		return nil, err
	}
	sess, err := s.sessionOf(tenant, req.SessionID)
	if err != nil {
		return nil, err
	}
	reps, err := s.replicasOf(req.BaseModel)
	if err != nil {
		return nil, err
	}
	cfg := loraConfigOf(req.LoraConfig)
	if err := reps[0].Info().ValidateLora(cfg); err != nil {
		return nil, errf(http.StatusBadRequest, "%v", err)
	}
	id := fmt.Sprintf("%s:train:%d", sess.id, req.ModelSeqID)
	// The session's lock, then the runs': the run joins its session atomically, so a session
	// that expires meanwhile cannot leave it live.
	s.sessions.mu.Lock()
	if s.sessions.m[sess.id] != sess {
		s.sessions.mu.Unlock()
		return nil, errf(http.StatusNotFound, "session %q not found", req.SessionID)
	}
	s.runs.mu.Lock()
	unlock := func() {
		s.runs.mu.Unlock()
		s.sessions.mu.Unlock()
	}
	if existing := s.runs.m[id]; existing != nil {
		unlock()
		return nil, errf(http.StatusBadRequest, "model %q already exists (model_seq_id %d reused)", id, req.ModelSeqID)
	}
	live := 0
	for _, run := range s.runs.m {
		if run.tenant == tenant && run.ready {
			live++
		}
	}
	if live >= s.opts.MaxAdaptersPerTenant {
		unlock()
		return nil, errf(http.StatusBadRequest, "tenant already has %d live adapters (limit %d): unload one first", live, s.opts.MaxAdaptersPerTenant)
	}
	md := map[string]string{}
	for k, v := range req.UserMetadata {
		md[k] = fmt.Sprint(v)
	}
	now := time.Now()
	run := &trainingRun{id: id, tenant: tenant, session: sess.id, baseModel: req.BaseModel, lora: cfg, created: now,
		lastRequest: now, metadata: md, ready: true, queue: newRunQueue(1), project: sess.project}
	s.runs.m[id] = run
	sess.runs = append(sess.runs, id)
	writes := []rowWrite{s.runSnapshot(run), s.sessionSnapshot(sess, false)}
	unlock()
	s.persist(writes...)
	s.holdNew(id) // several gateways: this one sequences the new run
	s.trail.record(tenant, "training_run.create", id, "", "")
	f, _, err := s.futures.create(tenant, "CreateModel", "")
	if err != nil {
		return nil, err
	}
	// Placing it creates the adapter on the chosen replica (router Load hook); with every slot
	// taken it waits, reporting paused_capacity.
	go func() {
		_, repID, err := s.onReplica(f, run, func(ctx context.Context, rep *replica.Replica, a replica.Adapter) (any, error) {
			return nil, rep.Place(ctx, a)
		})
		s.finishOn(f, repID, api.CreateModelResponse{ModelID: id, Type: "create_model"}, err)
	}()
	return futureResponse(f, id), nil
}

func (s *Server) getInfo(w http.ResponseWriter, r *http.Request, tenant string) (any, error) {
	var req api.ModelIDRequest
	if err := s.decodeJSON(r, &req); err != nil {
		return nil, err
	}
	run, err := s.runOf(tenant, req.ModelID)
	if err != nil {
		return nil, err
	}
	info, err := s.infoOf(run.baseModel)
	if err != nil {
		return nil, err
	}
	return api.GetInfoResponse{ModelID: run.id, Type: "get_info", IsLora: true, LoraRank: run.lora.Rank,
		ModelName: run.baseModel,
		ModelData: api.ModelData{Arch: string(info.Config.Arch), ModelName: run.baseModel, TokenizerID: run.baseModel}}, nil
}

func (s *Server) unloadModel(w http.ResponseWriter, r *http.Request, tenant string) (any, error) {
	var req api.ModelIDRequest
	if err := s.decodeJSON(r, &req); err != nil {
		return nil, err
	}
	run, err := s.usedRun(tenant, req.ModelID)
	if err != nil {
		return nil, err
	}
	s.updateRun(run, func(run *trainingRun) { run.ready = false })
	f, _, err := s.futures.create(tenant, "Unload", "")
	if err != nil {
		return nil, err
	}
	s.dropAdapter(run)
	s.trail.record(tenant, "training_run.unload", run.id, "", "")
	s.futures.complete(f, api.UnloadModelResponse{ModelID: run.id, Type: "unload_model"})
	return futureResponse(f, run.id), nil
}

func (s *Server) forwardBackward(w http.ResponseWriter, r *http.Request, tenant string) (any, error) {
	body, err := s.readBody(r)
	if err != nil {
		return nil, err
	}
	var req *api.ForwardBackwardRequest
	if strings.Contains(r.Header.Get("Content-Type"), "protobuf") {
		if req, err = api.DecodeForwardBackwardRequest(body); err != nil {
			return nil, errf(http.StatusBadRequest, "%v", err)
		}
	} else {
		var j api.ForwardBackwardJSON
		if err := decodeJSONBytes(body, &j); err != nil {
			return nil, err
		}
		req = &api.ForwardBackwardRequest{ModelID: j.ModelID, SeqID: j.SeqID}
		switch {
		case j.ForwardBackwardInput != nil:
			req.Input = *j.ForwardBackwardInput
		case j.ForwardInput != nil:
			req.Input = *j.ForwardInput
		default:
			return nil, errf(http.StatusBadRequest, "body needs forward_backward_input (or forward_input)")
		}
		req.ForwardOnly = strings.HasSuffix(r.URL.Path, "/forward")
	}
	run, err := s.usedRun(tenant, req.ModelID)
	if err != nil {
		return nil, err
	}
	baseOnly, err := takeDisableLora(&req.Input, req.ForwardOnly)
	if err != nil {
		return nil, err
	}
	var batch *engine.Batch
	// Validation depends only on the base model; not finding it fails validation, which consumes
	// the seq_id like any other failure of a sequenced request. It is done once, here: the
	// replica runs the validated batch as it is.
	info, infoErr := s.infoOf(run.baseModel)
	kind := "ForwardBackward"
	if req.ForwardOnly {
		kind = "Forward"
	}
	return s.submitOrderedSized(r, tenant, run, req.SeqID, kind, heldBytes(req.Input.Data, len(body)), func() error {
		if infoErr != nil {
			return infoErr
		}
		if err := s.checkBatchSize(req.Input.Data); err != nil {
			return err
		}
		data, decode, err := s.toEngineDataFor(r.Context(), run.baseModel, info, req.Input.Data)
		if err != nil {
			return err
		}
		// Every check runs before an image is decoded (the pixels are zeros until then), so a
		// refused request costs no decode.
		if batch, err = info.PrepareBatch(data, req.Input.LossFn, req.Input.LossFnConfig); err != nil || decode == nil {
			return err
		}
		return decode(r.Context())
	}, func(ctx context.Context, rep *replica.Replica, a replica.Adapter) (any, error) {
		var res *engine.ForwardResult
		var err error
		start := time.Now()
		f, _ := ctx.Value(futureKey{}).(*future)
		if !req.ForwardOnly && f != nil && f.replayed && s.holdsGradients(run, f.id) {
			// Run again after its gateway died: its gradients are in the saved state already
			// (saved with the adapter before its result was stored), so only its outputs are
			// computed again, on the same weights; it is not accumulated twice.
			res, err = rep.Forward(ctx, a, batch, false)
			if err != nil {
				return nil, err
			}
			return forwardOutput(res), nil
		}
		if req.ForwardOnly {
			res, err = rep.Forward(ctx, a, batch, baseOnly)
		} else {
			res, err = rep.ForwardBackward(ctx, a, batch)
		}
		if err != nil {
			return nil, err
		}
		if !req.ForwardOnly {
			// Before the result is stored (see gradientLedger); the placement is held meanwhile,
			// so the adapter cannot be saved without this request in its ledger.
			if f, _ := ctx.Value(futureKey{}).(*future); f != nil {
				s.noteGradients(run, f.id)
			}
		}
		s.recordTraining(run, kind, batch.Data, start)
		s.noteForwardBackwardMetrics(run, req.ForwardOnly, res.Metrics)
		return forwardOutput(res), nil
	})
}

func (s *Server) optimStep(w http.ResponseWriter, r *http.Request, tenant string) (any, error) {
	var req api.OptimStepRequest
	if err := s.decodeJSON(r, &req); err != nil {
		return nil, err
	}
	run, err := s.usedRun(tenant, req.ModelID)
	if err != nil {
		return nil, err
	}
	p := adamParamsOf(req.AdamParams)
	return s.submitOrdered(r, tenant, run, req.SeqID, "OptimStep", func() error { return engine.ValidateAdam(p) }, func(ctx context.Context, rep *replica.Replica, a replica.Adapter) (any, error) {
		// The replica checks for lost gradients, steps, and saves the adapter: the step is
		// acknowledged only once it is on disk, so no acknowledged step is ever lost.
		if f, _ := ctx.Value(futureKey{}).(*future); f != nil {
			if held, step := s.holdsStep(run, f); held {
				// Its gateway died after saving this step and before storing its result: the
				// step is taken; it is not taken twice. (Its other metrics went with that gateway.)
				s.log.Info("an optim_step run again after its gateway died was already saved: not stepping twice", "run", run.id, "request", f.id)
				return api.OptimStepResponse{Metrics: map[string]float64{"step:max": float64(step)}, Type: "optim_step"}, nil
			}
			s.runs.mu.Lock()
			run.grads.stepOp = f.id
			s.runs.mu.Unlock()
		}
		m, step, err := rep.OptimStep(ctx, a, p)
		if err != nil {
			return nil, err
		}
		s.recordStepMetrics(run, step, m)
		return api.OptimStepResponse{Metrics: m, Type: "optim_step"}, nil
	})
}
