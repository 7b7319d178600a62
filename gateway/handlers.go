package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"runtime/debug"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/checkpoint"
	"github.com/skein-ai/skein/engine"
	"github.com/skein-ai/skein/replica"
)

const v1 = "/api/v1/"

func (s *Server) routes() {
	s.mux = http.NewServeMux()
	s.mux.HandleFunc("GET /metrics", s.adminHTTP(s.serveMetrics))
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no such endpoint: %s %s", r.Method, r.URL.Path))
	})
	s.handle("POST "+v1+"client/config", false, s.clientConfig)
	s.handle("POST "+v1+"client/dynamic_config", false, func(http.ResponseWriter, *http.Request, string) (any, error) {
		return map[string]any{"refresh_interval_sec": 300}, nil
	})
	s.handle("GET "+v1+"healthz", false, func(http.ResponseWriter, *http.Request, string) (any, error) {
		return map[string]string{"status": "ok"}, nil
	})
	s.handle("GET "+v1+"get_server_capabilities", false, s.capabilities)
	s.handle("GET "+v1+"models/{rest...}", true, s.modelTokenizer) // gateway/tokenizer.go
	s.handle("POST "+v1+"create_session", true, s.createSession)
	s.handle("POST "+v1+"session_heartbeat", true, s.heartbeat)
	s.handle("POST "+v1+"telemetry", true, func(w http.ResponseWriter, r *http.Request, _ string) (any, error) {
		_, err := s.readBody(r)
		return map[string]string{"status": "accepted"}, err
	})
	s.handle("POST "+v1+"create_model", true, s.createModel)
	s.handle("POST "+v1+"get_info", true, s.getInfo)
	s.handle("POST "+v1+"unload_model", true, s.unloadModel)
	s.handle("POST "+v1+"forward_backward", true, s.forwardBackward)
	s.handle("POST "+v1+"forward", true, s.forwardBackward)
	s.handle("POST "+v1+"optim_step", true, s.optimStep)
	s.handle("POST "+v1+"save_weights", true, s.saveWeights)
	s.handle("POST "+v1+"save_weights_for_sampler", true, s.saveWeightsForSampler)
	s.handle("POST "+v1+"load_weights", true, s.loadWeights)
	s.handle("POST "+v1+"weights_info", true, s.weightsInfo)
	s.handle("POST "+v1+"create_sampling_session", true, s.createSamplingSession)
	s.handle("POST "+v1+"asample", true, s.asample)
	s.handle("GET "+v1+"samplers/{id}", true, s.getSampler)
	s.handle("POST "+v1+"retrieve_future", true, s.retrieveFuture)
	s.handle("GET "+v1+"training_runs", true, s.listRuns)
	s.handle("GET "+v1+"training_runs/{id}", true, s.getRun)
	s.handle("GET "+v1+"training_runs/{id}/checkpoints", true, s.listRunCheckpoints)
	s.handle("DELETE "+v1+"training_runs/{id}/checkpoints/{kind}/{name}", true, s.deleteCheckpoint)
	s.handle("GET "+v1+"training_runs/{id}/checkpoints/{kind}/{name}/archive", true, s.archiveCheckpoint)
	s.handle("GET "+v1+"archives/{token}", false, s.downloadArchive)
	s.handle("POST "+v1+"training_runs/{id}/checkpoints/{kind}/{name}/publish", true, s.publish(true))
	s.handle("DELETE "+v1+"training_runs/{id}/checkpoints/{kind}/{name}/publish", true, s.publish(false))
	s.handle("PUT "+v1+"training_runs/{id}/checkpoints/{kind}/{name}/ttl", true, s.setTTL)
	s.handle("GET "+v1+"checkpoints", true, s.listAllCheckpoints)
	s.handle("GET "+v1+"sessions", true, s.listSessions)
	s.handle("GET "+v1+"sessions/{id}", true, s.getSession)
	s.handle("PUT "+v1+"sessions/{id}/project", true, s.assignSessionProject)
	s.handle("GET "+v1+"sessions/{id}/trace_export", true, s.exportSessionTrace)
	s.handle("GET "+v1+"traces/{token}", false, s.downloadTrace)
	s.handle("GET "+v1+"audit", true, s.getAuditLog)
	s.handle("GET "+v1+"billing/usage/events", true, s.getBillingUsage)
	s.handle("GET "+v1+"skein/replicas", true, s.adminOnly(s.listReplicas))
	s.handle("GET "+v1+"skein/capacity", true, s.capacityFor)
	s.handle("POST "+v1+"skein/workers/register", false, s.registerWorker)
	s.handle("POST "+v1+"skein/workers/heartbeat", false, s.workerHeartbeat)
	s.keyRoutes()
	s.openAIRoutes() // gateway/openai.go
}

func (s *Server) clientConfig(w http.ResponseWriter, r *http.Request, _ string) (any, error) {
	_, _ = s.readBody(r)
	return map[string]any{
		"use_pyqwest_transport": false, "pjwt_auth_enabled": false, "credential_default_source": "api_key",
		"proto_compress_fwdbwd": false, "parallel_fwdbwd_chunks": true,
		// SDK 0.22.3–0.24: send forward_backward (and forward) as protobuf.
		"proto_write_fwdbwd": true, "fwd_via_fwdbwd": true,
		"sample_enable_stuck_detection": true,
	}, nil
}

func (s *Server) capabilities(http.ResponseWriter, *http.Request, string) (any, error) {
	var models []map[string]any
	for _, name := range s.baseModels() {
		info, err := s.infoOf(name)
		if err != nil {
			continue
		}
		models = append(models, map[string]any{"model_name": name, "max_context_length": info.Config.MaxPositionEmbeddings})
	}
	return map[string]any{"supported_models": models}, nil
}

func (s *Server) createSession(w http.ResponseWriter, r *http.Request, tenant string) (any, error) {
	var req struct {
		Tags         []string       `json:"tags"`
		UserMetadata map[string]any `json:"user_metadata"`
		ProjectID    *string        `json:"project_id"`
	}
	if err := s.decodeJSON(r, &req); err != nil {
		return nil, err
	}
	project := ""
	if req.ProjectID != nil {
		if err := validProjectID(*req.ProjectID); err != nil {
			return nil, err
		}
		project = *req.ProjectID
	}
	now := time.Now()
	s.logErr("tenant", s.st.TouchTenant(r.Context(), tenant))
	sess := &session{id: "sess-" + randomHex(8), tenant: tenant, created: now, heartbeat: now, tags: req.Tags, metadata: req.UserMetadata, project: project}
	s.mu.Lock()
	s.sessions[sess.id] = sess
	s.saveSession(sess, false)
	s.mu.Unlock()
	return map[string]any{"session_id": sess.id, "type": "create_session"}, nil
}

func (s *Server) heartbeat(w http.ResponseWriter, r *http.Request, tenant string) (any, error) {
	var req struct {
		SessionID string `json:"session_id"`
	}
	if err := s.decodeJSON(r, &req); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	sess := s.sessions[req.SessionID]
	if sess == nil || sess.tenant != tenant {
		return nil, errf(http.StatusNotFound, "session %q not found", req.SessionID)
	}
	sess.heartbeat = time.Now()
	s.saveSession(sess, false)
	return map[string]any{"type": "session_heartbeat"}, nil
}

// sweepSessions closes sessions that stopped heartbeating: their samplers go, their runs' adapters
// are unloaded (their checkpoints stay).
func (s *Server) sweepSessions(now time.Time) {
	s.mu.Lock()
	var expired []*session
	for id, sess := range s.sessions {
		if now.Sub(sess.heartbeat) > s.opts.SessionTimeout {
			expired = append(expired, sess)
			delete(s.sessions, id)
		}
	}
	var drop []*trainingRun
	for _, sess := range expired {
		s.log.Info("session expired", "session", sess.id, "tenant", sess.tenant, "runs", len(sess.runs), "samplers", len(sess.samplers), "idle", now.Sub(sess.heartbeat).Round(time.Millisecond))
		s.saveSession(sess, true)
		for _, id := range sess.samplers {
			delete(s.samplers, id)
			s.logErr("sampler", s.st.DeleteSampler(context.Background(), id))
		}
		for _, id := range sess.runs {
			if run := s.runs[id]; run != nil && run.ready {
				drop = append(drop, run)
				run.ready = false
				s.saveRun(run)
			}
		}
	}
	s.mu.Unlock()
	for _, run := range drop {
		s.dropAdapter(run)
	}
}

// dropAdapter frees an unloaded or expired run's slot and memory. Its full state (including
// gradients accumulated since the last step) is saved first, so it can be loaded again.
func (s *Server) dropAdapter(run *trainingRun) {
	if ep, ok := s.router.Where(run.id); ok {
		rep := ep.(*replica.Replica)
		// In the tenant's lane, so that it runs after the run's ops already queued there.
		_ = rep.RunIn(run.tenant, func() {
			if rep.Engine.HasAdapter(run.id) {
				s.logErr("saving adapter before release", s.persistAdapter(run, rep))
			}
			rep.Engine.DeleteAdapter(run.id)
		})
	}
	s.router.Forget(run.id)
	s.logErr("placement", s.st.DeletePlacement(context.Background(), run.id))
}

func (s *Server) isLive(run *trainingRun) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return run.ready
}

func (s *Server) sessionOf(tenant, id string) (*session, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sess := s.sessions[id]
	if sess == nil || sess.tenant != tenant {
		return nil, errf(http.StatusNotFound, "session %q not found", id)
	}
	return sess, nil
}

// runOf finds a tenant's training run; another tenant's is a 404.
func (s *Server) runOf(tenant, id string) (*trainingRun, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	run := s.runs[id]
	if run == nil || run.tenant != tenant {
		return nil, errf(http.StatusNotFound, "model %q not found", id)
	}
	run.lastRequest = time.Now()
	return run, nil
}

// futureResponse is what every async submit returns.
func futureResponse(f *future, modelID string) map[string]any {
	out := map[string]any{"request_id": f.id}
	if modelID != "" {
		out["model_id"] = modelID
	}
	return out
}

// userFault maps engine errors to the future's category.
func categorize(err error) string {
	var ue userError
	if errors.As(err, &ue) {
		return "user"
	}
	if errors.Is(err, engine.ErrInvalidInput) || errors.Is(err, engine.ErrUnknownAdapter) || errors.Is(err, engine.ErrNoOptimizerState) {
		return "user"
	}
	// Non-finite logits come from the tenant's own adapter weights (their training choices).
	if errors.Is(err, engine.ErrNonFinite) {
		return "user"
	}
	return "server"
}

// finishOn ends a future with the replica that ran it (reported as X-Skein-Replica).
func (s *Server) finishOn(f *future, replicaID string, result any, err error) {
	s.futures.setReplica(f, replicaID)
	s.finish(f, result, err)
}

func (s *Server) finish(f *future, result any, err error) {
	if err != nil {
		cat := categorize(err)
		s.metrics.future(f.kind, cat+"_error")
		s.futures.fail(f, cat, err.Error())
		return
	}
	s.metrics.future(f.kind, "ok")
	s.futures.complete(f, result)
}

func boolOr(p *bool, d bool) bool {
	if p == nil {
		return d
	}
	return *p
}

func (s *Server) createModel(w http.ResponseWriter, r *http.Request, tenant string) (any, error) {
	var req api.CreateModelRequest
	if err := s.decodeJSON(r, &req); err != nil {
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
	lc := api.LoraConfig{Rank: 32}
	if req.LoraConfig != nil {
		lc = *req.LoraConfig
	}
	cfg := engine.LoraConfig{Rank: lc.Rank, TrainAttn: boolOr(lc.TrainAttn, true), TrainMLP: boolOr(lc.TrainMLP, true),
		TrainUnembed: boolOr(lc.TrainUnembed, true)}
	if lc.Seed != nil {
		cfg.Seed = *lc.Seed
	}
	if err := reps[0].Engine.Info().ValidateLora(cfg); err != nil {
		return nil, errf(http.StatusBadRequest, "%v", err)
	}
	id := fmt.Sprintf("%s:train:%d", sess.id, req.ModelSeqID)
	s.mu.Lock()
	if existing := s.runs[id]; existing != nil {
		s.mu.Unlock()
		return nil, errf(http.StatusBadRequest, "model %q already exists (model_seq_id %d reused)", id, req.ModelSeqID)
	}
	live := 0
	for _, run := range s.runs {
		if run.tenant == tenant && run.ready {
			live++
		}
	}
	if live >= s.opts.MaxAdaptersPerTenant {
		s.mu.Unlock()
		return nil, errf(http.StatusBadRequest, "tenant already has %d live adapters (limit %d): unload one first", live, s.opts.MaxAdaptersPerTenant)
	}
	md := map[string]string{}
	for k, v := range req.UserMetadata {
		md[k] = fmt.Sprint(v)
	}
	now := time.Now()
	run := &trainingRun{id: id, tenant: tenant, session: sess.id, baseModel: req.BaseModel, lora: cfg, created: now,
		lastRequest: now, metadata: md, ready: true, queue: newRunQueue(1), project: sess.project}
	s.runs[id] = run
	sess.runs = append(sess.runs, id)
	s.saveRun(run)
	s.saveSession(sess, false)
	s.mu.Unlock()
	s.audit(tenant, "training_run.create", id, "", "")
	f, _, err := s.futures.create(tenant, "CreateModel", "")
	if err != nil {
		return nil, err
	}
	// Placing it creates the adapter on the chosen replica (router Load hook); with every slot
	// taken it waits, reporting paused_capacity.
	go func() {
		_, repID, err := s.onReplica(f, run, func(*replica.Replica) (any, error) { return nil, nil })
		s.finishOn(f, repID, map[string]any{"model_id": id, "type": "create_model"}, err)
	}()
	return futureResponse(f, id), nil
}

func (s *Server) getInfo(w http.ResponseWriter, r *http.Request, tenant string) (any, error) {
	var req struct {
		ModelID string `json:"model_id"`
	}
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
	return map[string]any{"model_id": run.id, "type": "get_info", "is_lora": true, "lora_rank": run.lora.Rank,
		"model_name": run.baseModel,
		"model_data": map[string]any{"arch": string(info.Config.Arch), "model_name": run.baseModel, "tokenizer_id": run.baseModel}}, nil
}

func (s *Server) unloadModel(w http.ResponseWriter, r *http.Request, tenant string) (any, error) {
	var req struct {
		ModelID string `json:"model_id"`
	}
	if err := s.decodeJSON(r, &req); err != nil {
		return nil, err
	}
	run, err := s.runOf(tenant, req.ModelID)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	run.ready = false
	s.saveRun(run)
	s.mu.Unlock()
	f, _, err := s.futures.create(tenant, "Unload", "")
	if err != nil {
		return nil, err
	}
	s.dropAdapter(run)
	s.audit(tenant, "training_run.unload", run.id, "", "")
	s.futures.complete(f, map[string]any{"model_id": run.id, "type": "unload_model"})
	return futureResponse(f, run.id), nil
}

// submitOrdered creates (or finds, on retry) the future of a model op and queues it in seq order.
// A request rejected as bad input still consumes its seq_id, so the model's later ops run.
func (s *Server) submitOrdered(tenant string, run *trainingRun, seq *int, kind string, validate func() error, op func(rep *replica.Replica) (any, error)) (any, error) {
	return s.submitOrderedSized(tenant, run, seq, kind, 0, validate, op)
}

// submitOrderedSized is submitOrdered for a request that holds about cost bytes while queued.
// Every way a sequenced request can fail once its seq_id is known (invalid, a panic in validation,
// the future not created, a panic while it runs) consumes its seq_id or ends its future, so the
// run never stalls behind it. Only a full queue refuses it without consuming it: the client retries.
func (s *Server) submitOrderedSized(tenant string, run *trainingRun, seq *int, kind string, cost int64, validate func() error, op func(rep *replica.Replica) (any, error)) (any, error) {
	n := 0
	if seq != nil {
		n = *seq
	}
	opKey := ""
	if n > 0 {
		opKey = run.id + "#" + strconv.Itoa(n)
	}
	q := s.queueOf(run)
	if err := q.reserve(n, cost); err != nil {
		return nil, errf(http.StatusTooManyRequests, "%v", err)
	}
	if err := validateRecovered(validate); err != nil {
		q.skip(n, cost)
		var bug panicError
		if errors.As(err, &bug) {
			return nil, errf(http.StatusInternalServerError, "internal error validating the request: %v", err)
		}
		return nil, asBadRequest(err)
	}
	f, fresh, err := s.futures.create(tenant, kind, opKey)
	if err != nil {
		q.skip(n, cost)
		return nil, err
	}
	if !fresh {
		q.release(cost)
		return futureResponse(f, run.id), nil // a retry: answer with the original request
	}
	err = q.submit(n, cost, func() {
		defer func() {
			if v := recover(); v != nil {
				s.log.Error("op panicked", "kind", kind, "run", run.id, "panic", v, "stack", string(debug.Stack()))
				s.finish(f, nil, fmt.Errorf("internal error running %s: %v", kind, v))
			}
		}()
		if !s.isLive(run) {
			s.futures.fail(f, "user", fmt.Sprintf("model %s was unloaded (or its session expired)", run.id))
			return
		}
		res, repID, err := s.onReplica(f, run, op)
		s.finishOn(f, repID, res, err)
	})
	if err != nil {
		s.futures.fail(f, "user", err.Error())
	}
	return futureResponse(f, run.id), nil
}

// validateRecovered runs a request's validation, turning a panic (a bug, e.g. in decoding) into
// an error so that the caller still consumes the request's seq_id.
func validateRecovered(validate func() error) (err error) {
	defer func() {
		if v := recover(); v != nil {
			slog.Error("request validation panicked", "panic", v, "stack", string(debug.Stack()))
			err = panicError{v}
		}
	}()
	return validate()
}

// panicError is a recovered panic: a bug of ours, not the caller's fault.
type panicError struct{ v any }

func (e panicError) Error() string { return fmt.Sprint(e.v) }

func toEngineData(data []api.Datum) ([]engine.Datum, error) {
	if err := api.DensifyAll(data); err != nil { // sparse inputs, within the request's budget
		return nil, err
	}
	out := make([]engine.Datum, len(data))
	for i, d := range data {
		toks, err := d.ModelInput.Tokens()
		if err != nil {
			return nil, fmt.Errorf("datum %d: model_input: %v", i, err)
		}
		in := map[string]engine.TensorInput{}
		for k, t := range d.LossFnInputs {
			dt, err := t.Dense()
			if err != nil {
				return nil, fmt.Errorf("datum %d: loss_fn_inputs.%s: %v", i, k, err)
			}
			dtype := dt.DType
			if dtype == "" { // plain lists: the SDK coerces by key
				dtype = "float32"
				if k == "target_tokens" {
					dtype = "int64"
				}
			}
			var shape []int
			if len(dt.Shape) > 0 {
				shape = dt.Shape
			}
			in[k] = engine.TensorInput{DType: dtype, Shape: shape, Data: dt.Data}
		}
		out[i] = engine.Datum{Tokens: toks, Inputs: in}
	}
	return out, nil
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
	run, err := s.runOf(tenant, req.ModelID)
	if err != nil {
		return nil, err
	}
	baseOnly, err := takeDisableLora(&req.Input, req.ForwardOnly)
	if err != nil {
		return nil, err
	}
	var data []engine.Datum
	// Validation depends only on the base model; not finding it fails validation, which consumes
	// the seq_id like any other failure of a sequenced request.
	info, infoErr := s.infoOf(run.baseModel)
	kind := "ForwardBackward"
	if req.ForwardOnly {
		kind = "Forward"
	}
	return s.submitOrderedSized(tenant, run, req.SeqID, kind, int64(len(body)), func() error {
		if infoErr != nil {
			return infoErr
		}
		if err := s.checkBatchSize(req.Input.Data); err != nil {
			return err
		}
		var err error
		if data, err = toEngineData(req.Input.Data); err != nil {
			return err
		}
		return info.ValidateBatch(data, req.Input.LossFn, req.Input.LossFnConfig)
	}, func(rep *replica.Replica) (any, error) {
		var res *engine.ForwardResult
		var err error
		start := time.Now()
		if req.ForwardOnly {
			res, err = rep.Engine.Forward(adapterOrBase(run.id, baseOnly), data, req.Input.LossFn, req.Input.LossFnConfig)
		} else {
			res, err = rep.Engine.ForwardBackward(run.id, data, req.Input.LossFn, req.Input.LossFnConfig)
		}
		if err != nil {
			return nil, err
		}
		s.recordTraining(run, kind, data, start)
		out := &api.ForwardBackwardOutput{LossFnOutputType: "ArrayRecord", Metrics: res.Metrics}
		for i := range res.Logprobs {
			out.LossFnOutputs = append(out.LossFnOutputs, api.LossOutput{
				"logprobs":         {Data: res.Logprobs[i], DType: "float32", Shape: []int{len(res.Logprobs[i])}},
				"elementwise_loss": {Data: res.Losses[i], DType: "float32", Shape: []int{len(res.Losses[i])}},
			})
		}
		return out, nil
	})
}

func (s *Server) optimStep(w http.ResponseWriter, r *http.Request, tenant string) (any, error) {
	var req api.OptimStepRequest
	if err := s.decodeJSON(r, &req); err != nil {
		return nil, err
	}
	run, err := s.runOf(tenant, req.ModelID)
	if err != nil {
		return nil, err
	}
	p := engine.DefaultAdamParams()
	for dst, src := range map[*float64]*float64{&p.LearningRate: req.AdamParams.LearningRate, &p.Beta1: req.AdamParams.Beta1,
		&p.Beta2: req.AdamParams.Beta2, &p.Eps: req.AdamParams.Eps, &p.WeightDecay: req.AdamParams.WeightDecay,
		&p.GradClipNorm: req.AdamParams.GradClipNorm} {
		if src != nil {
			*dst = *src
		}
	}
	return s.submitOrdered(tenant, run, req.SeqID, "OptimStep", func() error { return engine.ValidateAdam(p) }, func(rep *replica.Replica) (any, error) {
		if err := s.lostGradients(context.Background(), run); err != nil {
			return nil, err
		}
		m, err := rep.Engine.OptimStep(run.id, p)
		if err != nil {
			return nil, err
		}
		s.resetGradients(run)
		// The step is acknowledged only once it is on disk: no acknowledged step is ever lost.
		if err := s.persistAdapter(run, rep); err != nil {
			return nil, fmt.Errorf("saving the adapter state: %w", err)
		}
		_, step, _ := rep.Engine.AdapterInfo(run.id)
		s.mu.Lock()
		run.step, run.lastRequest = step, time.Now()
		s.saveRun(run)
		s.mu.Unlock()
		return map[string]any{"metrics": m, "type": "optim_step"}, nil
	})
}

func (s *Server) saveWeights(w http.ResponseWriter, r *http.Request, tenant string) (any, error) {
	var req api.SaveWeightsRequest
	if err := s.decodeJSON(r, &req); err != nil {
		return nil, err
	}
	run, err := s.runOf(tenant, req.ModelID)
	if err != nil {
		return nil, err
	}
	name := req.Path
	if name == "" {
		name = fmt.Sprintf("ckpt-%s", time.Now().UTC().Format("20060102T150405.000"))
		name = strings.ReplaceAll(name, ".", "-")
	}
	p := checkpoint.Path{ModelID: run.id, Kind: checkpoint.KindWeights, Name: name}
	return s.submitOrdered(tenant, run, req.SeqID, "SaveWeights", func() error {
		return s.checkNewCheckpoint(p, req.Overwrite, req.TTLSeconds)
	}, func(rep *replica.Replica) (any, error) {
		if err := s.writeCheckpoint(run, rep, p, true, req.TTLSeconds); err != nil {
			return nil, err
		}
		return map[string]any{"path": p.String(), "type": "save_weights"}, nil
	})
}

func (s *Server) checkNewCheckpoint(p checkpoint.Path, overwrite bool, ttl *int64) error {
	if err := checkpoint.ValidName(p.Name); err != nil {
		return err
	}
	if err := checkTTL(ttl); err != nil {
		return err
	}
	s.mu.Lock()
	_, exists := s.ckpts[p.String()]
	run := s.runs[p.ModelID]
	s.mu.Unlock()
	if exists && !overwrite {
		return fmt.Errorf("checkpoint %s already exists (set overwrite to replace it)", p)
	}
	if run != nil {
		return s.checkQuota(run.tenant, p, 0)
	}
	return nil
}

// writeCheckpoint saves an adapter's state under the data directory and records it.
func (s *Server) writeCheckpoint(run *trainingRun, rep *replica.Replica, p checkpoint.Path, withOptimizer bool, ttl *int64) error {
	start := time.Now()
	dir := p.Dir(s.opts.DataDir)
	tmp := dir + ".partial-" + randomHex(4)
	if err := rep.Engine.SaveAdapter(run.id, tmp, withOptimizer); err != nil {
		os.RemoveAll(tmp)
		return err
	}
	if err := s.checkQuota(run.tenant, p, fileSize(tmp)); err != nil {
		os.RemoveAll(tmp)
		return err
	}
	os.RemoveAll(dir)
	if err := os.Rename(tmp, dir); err != nil {
		return err
	}
	meta := &ckptMeta{Path: p.String(), Owner: run.tenant, BaseModel: run.baseModel, Created: time.Now().UTC(),
		Size: fileSize(dir), Lora: run.lora, Generation: randomHex(8), parsed: p}
	if ttl != nil {
		t := meta.Created.Add(time.Duration(*ttl) * time.Second)
		meta.ExpiresAt = &t
	}
	if err := s.saveMeta(meta); err != nil {
		return err
	}
	s.mu.Lock()
	s.ckpts[meta.Path] = meta
	if p.Kind == checkpoint.KindWeights {
		run.lastCkpt = meta.Path
	} else {
		run.lastSamplerCkpt = meta.Path
	}
	s.saveRun(run)
	s.mu.Unlock()
	s.dropSamplerCopies(meta.Path) // an overwrite: copies of the old weights are stale
	s.audit(run.tenant, "checkpoint.save", run.id, meta.Path, p.Kind)
	s.recordCheckpoint(run, meta.Path, start)
	return nil
}

func (s *Server) saveWeightsForSampler(w http.ResponseWriter, r *http.Request, tenant string) (any, error) {
	var req api.SaveWeightsRequest
	if err := s.decodeJSON(r, &req); err != nil {
		return nil, err
	}
	run, err := s.runOf(tenant, req.ModelID)
	if err != nil {
		return nil, err
	}
	if req.Path != "" {
		p := checkpoint.Path{ModelID: run.id, Kind: checkpoint.KindSamplerWeights, Name: req.Path}
		return s.submitOrdered(tenant, run, req.SeqID, "SaveWeightsForSampler", func() error {
			return s.checkNewCheckpoint(p, true, req.TTLSeconds)
		}, func(rep *replica.Replica) (any, error) {
			if err := s.writeCheckpoint(run, rep, p, false, req.TTLSeconds); err != nil {
				return nil, err
			}
			return map[string]any{"path": p.String(), "type": "save_weights_for_sampler"}, nil
		})
	}
	// Ephemeral: a sampler over a snapshot of the adapter as it is at this seq_id.
	smp := &sampler{id: "samp-" + randomHex(8), tenant: tenant, session: run.session, baseModel: run.baseModel}
	smp.engineID = "sampler:" + smp.id
	smp.dir = filepath.Join(s.opts.DataDir, "ephemeral", smp.id)
	return s.submitOrdered(tenant, run, req.SeqID, "SaveWeightsForSampler", func() error { return nil }, func(rep *replica.Replica) (any, error) {
		e := rep.Engine
		smp.rep = rep // the snapshot lives where the adapter is
		if err := e.SaveAdapter(run.id, smp.dir, false); err != nil {
			return nil, err
		}
		if err := e.LoadAdapter(smp.engineID, smp.dir, false); err != nil {
			return nil, err
		}
		s.mu.Lock()
		s.samplers[smp.id] = smp
		s.saveSampler(smp)
		if sess := s.sessions[run.session]; sess != nil {
			sess.samplers = append(sess.samplers, smp.id)
			s.saveSession(sess, false)
		}
		s.mu.Unlock()
		s.keepSamplerCopy(rep, smp.engineID)
		return map[string]any{"sampling_session_id": smp.id, "type": "save_weights_for_sampler"}, nil
	})
}

// checkpointFor resolves a tinker path the tenant may read: its own, or a published one.
func (s *Server) checkpointFor(tenant, path string) (*ckptMeta, error) {
	p, err := checkpoint.Parse(path)
	if err != nil {
		return nil, errf(http.StatusBadRequest, "%v", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.ckpts[p.String()]
	if m == nil || (m.Owner != tenant && !m.Public) || m.expired(time.Now()) {
		return nil, errf(http.StatusNotFound, "checkpoint %s not found", p)
	}
	return m, nil
}

func (m *ckptMeta) expired(now time.Time) bool { return m.ExpiresAt != nil && now.After(*m.ExpiresAt) }

func (s *Server) loadWeights(w http.ResponseWriter, r *http.Request, tenant string) (any, error) {
	var req api.LoadWeightsRequest
	if err := s.decodeJSON(r, &req); err != nil {
		return nil, err
	}
	run, err := s.runOf(tenant, req.ModelID)
	if err != nil {
		return nil, err
	}
	var meta *ckptMeta
	return s.submitOrdered(tenant, run, req.SeqID, "LoadWeights", func() error {
		var err error
		if meta, err = s.checkpointFor(tenant, req.Path); err != nil {
			return err
		}
		if meta.BaseModel != run.baseModel {
			return fmt.Errorf("checkpoint was trained on %s, this model is %s", meta.BaseModel, run.baseModel)
		}
		if req.Optimizer && meta.parsed.Kind != checkpoint.KindWeights {
			return fmt.Errorf("%s is a sampler checkpoint: it has no optimizer state", req.Path)
		}
		return nil
	}, func(rep *replica.Replica) (any, error) {
		if err := rep.Engine.LoadAdapter(run.id, meta.parsed.Dir(s.opts.DataDir), req.Optimizer); err != nil {
			return nil, err
		}
		cfg, step, err := rep.Engine.AdapterInfo(run.id)
		if err != nil { // a worker's unusable answer: keep the run as it was
			return nil, fmt.Errorf("reading the loaded adapter: %w", err)
		}
		s.mu.Lock()
		run.lora, run.step = cfg, step
		run.grads = gradientLedger{} // the adapter was replaced
		s.saveRun(run)
		s.mu.Unlock()
		s.audit(tenant, "checkpoint.load", run.id, meta.Path, "")
		if err := s.persistAdapter(run, rep); err != nil {
			return nil, fmt.Errorf("saving the adapter state: %w", err)
		}
		return map[string]any{"path": req.Path, "type": "load_weights"}, nil
	})
}

func (s *Server) weightsInfo(w http.ResponseWriter, r *http.Request, tenant string) (any, error) {
	var req struct {
		TinkerPath string `json:"tinker_path"`
	}
	if err := s.decodeJSON(r, &req); err != nil {
		return nil, err
	}
	m, err := s.checkpointFor(tenant, req.TinkerPath)
	if err != nil {
		return nil, err
	}
	return map[string]any{"base_model": m.BaseModel, "is_lora": true, "lora_rank": m.Lora.Rank,
		"train_unembed": m.Lora.TrainUnembed, "train_mlp": m.Lora.TrainMLP, "train_attn": m.Lora.TrainAttn}, nil
}

// newSampler makes a sampler for a base model or a checkpoint path, on a replica chosen by the
// routing key (if the request has one).
func (s *Server) newSampler(tenant, sessionID, base, modelPath, key string) (*sampler, error) {
	smp := &sampler{id: "samp-" + randomHex(8), tenant: tenant, session: sessionID, modelPath: modelPath}
	if modelPath != "" {
		m, err := s.checkpointFor(tenant, modelPath)
		if err != nil {
			return nil, err
		}
		smp.baseModel = m.BaseModel
		smp.dir = m.parsed.Dir(s.opts.DataDir)
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
	smp, err := s.newSampler(tenant, req.SessionID, req.BaseModel, req.ModelPath, routingKey(r))
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.samplers[smp.id] = smp
	s.saveSampler(smp)
	if sess := s.sessions[req.SessionID]; sess != nil {
		sess.samplers = append(sess.samplers, smp.id)
		s.saveSession(sess, false)
	}
	s.mu.Unlock()
	return map[string]any{"sampling_session_id": smp.id, "type": "create_sampling_session"}, nil
}

func (s *Server) getSampler(w http.ResponseWriter, r *http.Request, tenant string) (any, error) {
	id := r.PathValue("id")
	s.mu.Lock()
	smp := s.samplers[id]
	s.mu.Unlock()
	if smp == nil || smp.tenant != tenant {
		return nil, errf(http.StatusNotFound, "sampler %q not found", id)
	}
	out := map[string]any{"sampler_id": smp.id, "base_model": smp.baseModel}
	if smp.modelPath != "" {
		out["model_path"] = smp.modelPath
	}
	return out, nil
}

func (s *Server) asample(w http.ResponseWriter, r *http.Request, tenant string) (any, error) {
	var req api.SampleRequest
	if err := s.decodeJSON(r, &req); err != nil {
		return nil, err
	}
	var smp *sampler
	if req.SamplingSessionID != "" {
		s.mu.Lock()
		smp = s.samplers[req.SamplingSessionID]
		s.mu.Unlock()
		if smp == nil || smp.tenant != tenant {
			return nil, errf(http.StatusNotFound, "sampling session %q not found", req.SamplingSessionID)
		}
	} else {
		var err error
		if smp, err = s.newSampler(tenant, "", req.BaseModel, req.ModelPath, routingKey(r)); err != nil {
			return nil, err
		}
	}
	// A checkpoint may have been overwritten, unpublished or deleted since the sampler was made.
	smp, err := s.currentWeights(tenant, smp)
	if err != nil {
		return nil, err
	}
	prompt, err := req.Prompt.Tokens()
	if err != nil {
		return nil, errf(http.StatusBadRequest, "prompt: %v", err)
	}
	sr := engine.SampleRequest{Prompt: prompt, NumSamples: 1, PromptLogprobs: req.PromptLogprobs, TopKPromptLogprobs: req.TopKPromptLogprobs}
	if req.NumSamples != nil {
		sr.NumSamples = *req.NumSamples
		if sr.NumSamples < 1 {
			return nil, errf(http.StatusBadRequest, "num_samples must be at least 1, got %d", sr.NumSamples)
		}
	}
	sp := req.SamplingParams
	sr.Params = engine.SampleParams{Temperature: 1, TopK: -1, TopP: 1, Seed: sp.Seed}
	if sp.MaxTokens != nil {
		if *sp.MaxTokens < 1 {
			return nil, errf(http.StatusBadRequest, "sampling_params.max_tokens must be at least 1, got %d", *sp.MaxTokens)
		}
		sr.Params.MaxTokens = *sp.MaxTokens
	}
	if sp.Temperature != nil {
		sr.Params.Temperature = *sp.Temperature
	}
	if sp.TopK != nil {
		sr.Params.TopK = *sp.TopK
	}
	if sp.TopP != nil {
		sr.Params.TopP = *sp.TopP
		greedyTopP(&sr.Params)
	}
	if sr.Params.StopStrings, sr.Params.StopTokens, err = sp.StopSpec(); err != nil {
		return nil, errf(http.StatusBadRequest, "sampling_params.stop: %v", err)
	}
	// Sampling reads the weights only: it may run on any healthy replica of the base model,
	// preferring the one that already holds them (a read-only copy loads from disk elsewhere).
	prefer := ""
	if smp.rep != nil {
		prefer = smp.rep.ID()
	}
	rep, err := s.samplingReplica(smp.baseModel, prefer, routingKey(r), s.copyHolders(smp)...)
	if err != nil {
		return nil, err
	}
	e := rep.Engine
	if err := e.Info().ValidateSample(&sr); err != nil {
		return nil, errf(http.StatusBadRequest, "%v", err)
	}
	if err := s.checkSampleSize(sr); err != nil {
		return nil, err
	}
	if s.samplingBusy(rep) {
		w.Header().Set("Retry-After", "1")
		return nil, errf(http.StatusTooManyRequests, "replica %s has %d sampling requests waiting; retry shortly", rep.ID(), s.opts.MaxQueuedSamples)
	}
	f, _, err := s.futures.create(tenant, "Sample", "")
	if err != nil {
		return nil, err
	}
	if err := s.enqueueSample(rep, smp, sr, f); err != nil {
		s.finishOn(f, rep.ID(), nil, err)
	}
	return futureResponse(f, ""), nil
}

func (s *Server) retrieveFuture(w http.ResponseWriter, r *http.Request, tenant string) (any, error) {
	var req api.RetrieveFutureRequest
	if err := s.decodeJSON(r, &req); err != nil {
		return nil, err
	}
	noteFuture(r, req.RequestID)
	f := s.futures.get(tenant, req.RequestID)
	if f == nil {
		return nil, errf(http.StatusNotFound, "request %q not found", req.RequestID)
	}
	if !s.futures.wait(f, s.opts.LongPoll, r.Context().Done()) {
		if r.Context().Err() != nil {
			return nil, nil // the client went away
		}
		state, reason := s.futures.queueState(f)
		writeJSON(w, http.StatusRequestTimeout, api.TryAgain{Type: "try_again", RequestID: f.id, QueueState: state, QueueStateReason: reason})
		return nil, nil
	}
	if rep := s.futures.replicaOf(f); rep != "" {
		w.Header().Set("X-Skein-Replica", rep)
	}
	if f.errMsg != "" {
		return api.ErrorResult{Error: f.errMsg, Category: f.category}, nil
	}
	wantsProto := strings.Contains(r.Header.Get("Accept"), "application/x-protobuf")
	switch v := f.result.(type) {
	case *api.ForwardBackwardOutput:
		if wantsProto {
			writeProto(w, api.EncodeForwardBackwardOutput(v))
			return nil, nil
		}
	case *api.SampleResponse:
		if wantsProto {
			writeProto(w, api.EncodeSampleResponse(v))
			return nil, nil
		}
	}
	return f.result, nil
}

func writeProto(w http.ResponseWriter, b []byte) {
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(b)
}

// --- REST listings ---

func paging(r *http.Request) (offset, limit int, err error) {
	limit = 20
	if v := r.URL.Query().Get("limit"); v != "" {
		if limit, err = strconv.Atoi(v); err != nil || limit < 1 || limit > 1000 {
			return 0, 0, errf(http.StatusBadRequest, "limit must be an integer in [1, 1000]")
		}
	}
	if v := r.URL.Query().Get("offset"); v != "" {
		if offset, err = strconv.Atoi(v); err != nil || offset < 0 {
			return 0, 0, errf(http.StatusBadRequest, "offset must be a non-negative integer")
		}
	}
	return offset, limit, nil
}

func page[T any](items []T, offset, limit int) []T {
	if offset >= len(items) {
		return []T{}
	}
	return items[offset:min(len(items), offset+limit)]
}

func (s *Server) ckptRow(m *ckptMeta) api.Checkpoint {
	kind := "training"
	if m.parsed.Kind == checkpoint.KindSamplerWeights {
		kind = "sampler"
	}
	c := api.Checkpoint{CheckpointID: m.parsed.ID(), CheckpointType: kind, Time: m.Created.Format(time.RFC3339Nano),
		TinkerPath: m.Path, SizeBytes: m.Size, Public: m.Public}
	if m.ExpiresAt != nil {
		e := m.ExpiresAt.Format(time.RFC3339Nano)
		c.ExpiresAt = &e
	}
	return c
}

func (s *Server) runRow(run *trainingRun) api.TrainingRun {
	return s.runRowFrom(run, s.indexCheckpoints())
}

func (s *Server) runRowFrom(run *trainingRun, idx ckptIndex) api.TrainingRun {
	tr := api.TrainingRun{TrainingRunID: run.id, BaseModel: run.baseModel, ModelOwner: run.tenant, IsLora: true,
		LoraRank: run.lora.Rank, LastRequestTime: run.lastRequest.UTC().Format(time.RFC3339Nano), UserMetadata: run.metadata}
	tr.ProjectID = run.project
	if m := idx.newest[[2]string{run.id, checkpoint.KindWeights}]; m != nil {
		c := s.ckptRow(m)
		tr.LastCheckpoint = &c
	}
	if m := idx.newest[[2]string{run.id, checkpoint.KindSamplerWeights}]; m != nil {
		c := s.ckptRow(m)
		tr.LastSamplerCheckpoint = &c
	}
	return tr
}

func (s *Server) listRuns(w http.ResponseWriter, r *http.Request, tenant string) (any, error) {
	offset, limit, err := paging(r)
	if err != nil {
		return nil, err
	}
	listed, err := runFilter(r, tenant)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var runs []*trainingRun
	idx := s.indexCheckpoints()
	for _, run := range s.runs {
		if listed(run, idx) {
			runs = append(runs, run)
		}
	}
	sort.Slice(runs, func(i, j int) bool { return runs[i].created.Before(runs[j].created) })
	rows := []api.TrainingRun{}
	for _, run := range page(runs, offset, limit) {
		rows = append(rows, s.runRowFrom(run, idx))
	}
	return map[string]any{"training_runs": rows, "cursor": api.Cursor{Offset: offset, Limit: limit, TotalCount: len(runs)}}, nil
}

func (s *Server) getRun(w http.ResponseWriter, r *http.Request, tenant string) (any, error) {
	run, err := s.accessibleRun(r, tenant, r.PathValue("id"))
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.runRow(run), nil
}

func (s *Server) checkpointsWhere(keep func(*ckptMeta) bool) []*ckptMeta {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	var out []*ckptMeta
	for _, m := range s.ckpts {
		if !m.expired(now) && keep(m) {
			out = append(out, m)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Created.Before(out[j].Created) })
	return out
}

func (s *Server) listRunCheckpoints(w http.ResponseWriter, r *http.Request, tenant string) (any, error) {
	id := r.PathValue("id")
	s.mu.Lock()
	run := s.runs[id]
	s.mu.Unlock()
	if run == nil || run.tenant != tenant {
		return nil, errf(http.StatusNotFound, "training run %q not found", id)
	}
	rows := []api.Checkpoint{}
	for _, m := range s.checkpointsWhere(func(m *ckptMeta) bool { return m.parsed.ModelID == id }) {
		rows = append(rows, s.ckptRow(m))
	}
	return map[string]any{"checkpoints": rows}, nil
}

func (s *Server) listAllCheckpoints(w http.ResponseWriter, r *http.Request, tenant string) (any, error) {
	offset, limit, err := paging(r)
	if err != nil {
		return nil, err
	}
	all := s.checkpointsWhere(func(m *ckptMeta) bool { return m.Owner == tenant })
	rows := []api.Checkpoint{}
	for _, m := range page(all, offset, limit) {
		rows = append(rows, s.ckptRow(m))
	}
	return map[string]any{"checkpoints": rows, "cursor": api.Cursor{Offset: offset, Limit: limit, TotalCount: len(all)}}, nil
}

// ownedCheckpoint resolves {id}/{kind}/{name} to a checkpoint the tenant owns.
func (s *Server) ownedCheckpoint(r *http.Request, tenant string) (*ckptMeta, error) {
	p := checkpoint.Path{ModelID: r.PathValue("id"), Kind: r.PathValue("kind"), Name: r.PathValue("name")}
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.ckpts[p.String()]
	if m == nil || m.Owner != tenant || m.expired(time.Now()) {
		return nil, errf(http.StatusNotFound, "checkpoint %s not found", p)
	}
	return m, nil
}

func (s *Server) deleteCheckpoint(w http.ResponseWriter, r *http.Request, tenant string) (any, error) {
	m, err := s.ownedCheckpoint(r, tenant)
	if err != nil {
		return nil, err
	}
	s.removeCheckpoint(m)
	s.audit(tenant, "checkpoint.delete", m.parsed.ModelID, m.Path, "")
	return map[string]any{"deleted": m.Path}, nil
}

func (s *Server) removeCheckpoint(m *ckptMeta) {
	s.mu.Lock()
	delete(s.ckpts, m.Path)
	s.mu.Unlock()
	s.logErr("checkpoint", s.st.DeleteCheckpoint(context.Background(), m.Path))
	os.RemoveAll(m.parsed.Dir(s.opts.DataDir))
	s.dropSamplerCopies(m.Path)
}

func (s *Server) publish(public bool) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request, tenant string) (any, error) {
		m, err := s.ownedCheckpoint(r, tenant)
		if err != nil {
			return nil, err
		}
		s.mu.Lock()
		m.Public = public
		s.mu.Unlock()
		if err := s.saveMeta(m); err != nil {
			return nil, err
		}
		s.audit(tenant, map[bool]string{true: "checkpoint.publish", false: "checkpoint.unpublish"}[public], m.parsed.ModelID, m.Path, "")
		return map[string]any{"tinker_path": m.Path, "public": public}, nil
	}
}

func (s *Server) setTTL(w http.ResponseWriter, r *http.Request, tenant string) (any, error) {
	m, err := s.ownedCheckpoint(r, tenant)
	if err != nil {
		return nil, err
	}
	var req struct {
		TTLSeconds *int64 `json:"ttl_seconds"`
	}
	if err := s.decodeJSON(r, &req); err != nil {
		return nil, err
	}
	if err := checkTTL(req.TTLSeconds); err != nil {
		return nil, errf(http.StatusBadRequest, "%v", err)
	}
	s.mu.Lock()
	if req.TTLSeconds == nil {
		m.ExpiresAt = nil
	} else {
		t := time.Now().UTC().Add(time.Duration(*req.TTLSeconds) * time.Second)
		m.ExpiresAt = &t
	}
	s.mu.Unlock()
	if err := s.saveMeta(m); err != nil {
		return nil, err
	}
	s.audit(tenant, "checkpoint.set_ttl", m.parsed.ModelID, m.Path, "")
	return map[string]any{"tinker_path": m.Path}, nil
}

// archiveCheckpoint answers with a signed download URL, valid for 15 minutes and usable without
// the API key (as the SDK's get_checkpoint_archive_url expects): JSON {url, expires} when the client
// accepts JSON, a 302 to the URL otherwise (so `curl -L` downloads the tar.gz).
func (s *Server) archiveCheckpoint(w http.ResponseWriter, r *http.Request, tenant string) (any, error) {
	m, err := s.ownedCheckpoint(r, tenant)
	if err != nil {
		return nil, err
	}
	expires := time.Now().Add(15 * time.Minute).UTC()
	public, err := s.publicBase(r)
	if err != nil {
		return nil, err
	}
	url := fmt.Sprintf("%s%sarchives/%s", public, v1, s.signArchive(m.Path, m.Generation, expires))
	if strings.Contains(r.Header.Get("Accept"), "application/json") {
		return map[string]any{"url": url, "expires": expires.Format(time.RFC3339)}, nil
	}
	w.Header().Set("Location", url)
	w.Header().Set("Expires", expires.Format(http.TimeFormat))
	writeJSON(w, http.StatusFound, map[string]any{"url": url, "expires": expires.Format(time.RFC3339)})
	return nil, nil
}

// downloadArchive streams a checkpoint as .tar.gz for a valid signed token.
func (s *Server) downloadArchive(w http.ResponseWriter, r *http.Request, _ string) (any, error) {
	path, generation, err := s.verifyArchive(r.PathValue("token"), time.Now())
	if err != nil {
		return nil, errf(http.StatusForbidden, "%v", err)
	}
	s.mu.Lock()
	m := s.ckpts[path]
	if m != nil && m.Generation != generation {
		m = nil // deleted or overwritten since the link was made: the link was for the old one
	}
	s.mu.Unlock()
	if m == nil {
		return nil, errf(http.StatusNotFound, "checkpoint %s no longer exists", path)
	}
	s.writeWithin(w, ArchiveWriteTimeout) // a big checkpoint takes longer than an answer
	w.Header().Set("Content-Type", "application/gzip")
	w.Header().Set("Content-Disposition", fmt.Sprintf("attachment; filename=%q", strings.ReplaceAll(m.parsed.ModelID+"-"+m.parsed.Name, ":", "_")+".tar.gz"))
	w.WriteHeader(http.StatusOK)
	if err := writeTarGz(w, m.parsed.Dir(s.opts.DataDir)); err != nil {
		s.log.Error("archive", "path", m.Path, "err", err)
	}
	return nil, nil
}

func (s *Server) listSessions(w http.ResponseWriter, r *http.Request, tenant string) (any, error) {
	offset, limit, err := paging(r)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	var all []*session
	for _, sess := range s.sessions {
		if sess.tenant == tenant {
			all = append(all, sess)
		}
	}
	s.mu.Unlock()
	sort.Slice(all, func(i, j int) bool { return all[i].created.Before(all[j].created) })
	ids := []string{}
	for _, sess := range page(all, offset, limit) {
		ids = append(ids, sess.id)
	}
	return map[string]any{"sessions": ids}, nil
}

func (s *Server) getSession(w http.ResponseWriter, r *http.Request, tenant string) (any, error) {
	sess, err := s.sessionOf(tenant, r.PathValue("id"))
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return map[string]any{"training_run_ids": append([]string{}, sess.runs...), "sampler_ids": append([]string{}, sess.samplers...)}, nil
}
