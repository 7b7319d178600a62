package gateway

// The replicas: each base model's replicas as the gateway knows them (added, removed, looked up
// behind a router endpoint), routing onto them (the router's load and evict hooks, onReplica for
// a run's op, samplingReplica for a sample), and the fleet's status (skein/replicas, and
// skein/capacity as an admin sees it).
// Not to be confused with registry.go, the in-memory registries of sessions, runs, samplers and
// checkpoints; the run queue that feeds onReplica is runqueue.go.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"

	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/engine"
	"github.com/skein-ai/skein/replica"
	"github.com/skein-ai/skein/router"
	"github.com/skein-ai/skein/worker"
)

type futureKey struct{}

// routerHooks are the router's side effects on replicas: placing an adapter makes it resident,
// evicting one saves it and frees its slot.
func (s *Server) routerHooks() router.Hooks {
	return router.Hooks{
		Load: func(ctx context.Context, adapter string, ep router.Endpoint) error {
			rep, err := s.replicaFor(ep)
			if err != nil {
				return err
			}
			run := s.runs.get(adapter)
			if run == nil {
				return fmt.Errorf("unknown training run %s", adapter)
			}
			err = rep.Place(ctx, s.adapterOf(run))
			s.transportFailed(rep, err)
			if err == nil {
				s.logErr("placement", s.st.PutPlacement(context.Background(), adapter, rep.ID()))
			}
			return err
		},
		Evict: func(ctx context.Context, adapter string, ep router.Endpoint) error {
			rep, err := s.replicaFor(ep)
			if err != nil {
				return err
			}
			a := replica.Adapter{ID: adapter} // a run that is gone is only deleted
			if run := s.runs.get(adapter); run != nil {
				// Saved in full before it leaves memory: its next request reloads it, possibly elsewhere.
				a = s.adapterOf(run)
			}
			err = rep.Evict(ctx, a)
			s.transportFailed(rep, err)
			if err == nil {
				s.log.Info("evicted adapter", "run", adapter, "replica", rep.ID())
				s.metrics.eviction()
				s.logErr("placement", s.st.DeletePlacement(context.Background(), adapter))
			}
			return err
		},
		Waiting: func(ctx context.Context, adapter string, waiting bool, reason string) {
			f, _ := ctx.Value(futureKey{}).(*future)
			if f == nil {
				return
			}
			if waiting {
				s.futures.setQueueState(f, "paused_capacity", reason)
			} else {
				s.futures.setQueueState(f, "active", "")
			}
		},
	}
}

// replicaOp is one op of a run on the replica the router chose: it calls the replica's typed
// operations for the run's adapter (which the replica makes resident first).
type replicaOp func(ctx context.Context, rep *replica.Replica, a replica.Adapter) (any, error)

// onReplica routes one op of a run (placing and loading the adapter if needed, waiting for a slot
// if every replica is full and busy) and runs it there, holding the placement until it returns,
// so the adapter is not evicted under it. When a worker is lost (unreachable, or gone mid-call)
// it is dropped at once and the op goes to the adapter's new replica, which reloads it from its
// last saved state, unless the op may already have run on the lost worker: then it fails,
// saying so, and is never run twice.
func (s *Server) onReplica(f *future, run *trainingRun, op replicaOp) (any, string, error) {
	ctx, cancel := context.WithTimeout(context.WithValue(context.Background(), futureKey{}, f), s.opts.QueueTimeout)
	defer cancel()
	// Under a run lease the op's worker calls carry its epoch: a worker refuses the calls of a
	// gateway that lost the run once the new one has called (worker.Server.fence).
	if f != nil && f.fence != nil {
		ctx = worker.WithEpoch(ctx, run.id, f.fence.Epoch)
	} else if e, ok := s.leases.valid(run.id); ok {
		ctx = worker.WithEpoch(ctx, run.id, e)
	}
	for attempt := 1; ; attempt++ {
		res, repID, retry, err := s.onReplicaOnce(ctx, run, op)
		if !retry || attempt == maxReroutes {
			return res, repID, err
		}
		s.log.Warn("worker lost: routing the op again", "run", run.id, "replica", repID, "err", err)
	}
}

// onReplicaOnce is one try of onReplica; retry reports that its replica was lost before the op
// could have run there.
func (s *Server) onReplicaOnce(ctx context.Context, run *trainingRun, op replicaOp) (res any, repID string, retry bool, err error) {
	lease, err := s.router.Acquire(ctx, router.Request{Adapter: run.id, BaseModel: run.baseModel})
	if err != nil {
		if errors.Is(err, router.ErrCapacity) {
			return nil, "", false, userError{fmt.Errorf("no LoRA slot of %s became free within %s: every slot holds an adapter with work queued; try again later or unload an adapter", run.baseModel, s.opts.QueueTimeout)}
		}
		// The Load and Evict hooks dropped a lost worker already; placing has no effect to repeat.
		return nil, "", lost(err) && ctx.Err() == nil, err
	}
	defer lease.Release()
	rep, err := s.replicaFor(lease.Endpoint)
	if err != nil {
		return nil, lease.Endpoint.ID(), ctx.Err() == nil, err
	}
	// The op's deadline was for getting a slot; once placed, the op runs to its end.
	res, err = op(context.WithoutCancel(ctx), rep, s.adapterOf(run))
	// A panic in compute comes back as a *replica.PanicError: this op fails, the replica goes on.
	if pe := (*replica.PanicError)(nil); errors.As(err, &pe) {
		s.log.Error("op panicked on the replica", "run", run.id, "replica", rep.ID(), "panic", pe.Value, "stack", pe.Stack)
	}
	if err != nil && s.transportFailed(rep, err) {
		if replica.MayHaveRun(err) {
			return nil, rep.ID(), false, rerouteErr(err)
		}
		return nil, rep.ID(), ctx.Err() == nil, err
	}
	return res, rep.ID(), false, err
}

// userError marks a failure as the user's (category "user").
type userError struct{ error }

func (e userError) Unwrap() error { return e.error }

// replicasOf lists a base model's replicas (validated name).
func (s *Server) replicasOf(base string) ([]*replica.Replica, error) {
	s.modelsMu.RLock()
	defer s.modelsMu.RUnlock()
	reps := s.models[base]
	if len(reps) == 0 {
		return nil, errf(http.StatusBadRequest, "unknown base model %q (this server has: %s)", base, strings.Join(s.baseModelsLocked(), ", "))
	}
	return append([]*replica.Replica(nil), reps...), nil
}

// infoOf describes a base model (from any of its replicas: they hold the same model).
func (s *Server) infoOf(base string) (engine.ModelInfo, error) {
	reps, err := s.replicasOf(base)
	if err != nil {
		return engine.ModelInfo{}, err
	}
	return reps[0].Info(), nil
}

// replicaFor is the replica behind a router endpoint: every endpoint the router has was added by
// addReplica; one removed meanwhile (a dead worker) is ErrClosed, which reroutes.
func (s *Server) replicaFor(ep router.Endpoint) (*replica.Replica, error) {
	s.modelsMu.RLock()
	defer s.modelsMu.RUnlock()
	for _, r := range s.models[ep.BaseModel()] {
		if r.ID() == ep.ID() {
			return r, nil
		}
	}
	return nil, fmt.Errorf("replica %s: %w", ep.ID(), replica.ErrClosed)
}

// allReplicas lists every replica, all base models together.
func (s *Server) allReplicas() []*replica.Replica {
	s.modelsMu.RLock()
	defer s.modelsMu.RUnlock()
	var out []*replica.Replica
	for _, rs := range s.models {
		out = append(out, rs...)
	}
	return out
}

// baseModels lists the served base models, sorted.
func (s *Server) baseModels() []string {
	s.modelsMu.RLock()
	defer s.modelsMu.RUnlock()
	return s.baseModelsLocked()
}

func (s *Server) baseModelsLocked() []string {
	var names []string
	for name, reps := range s.models {
		if len(reps) > 0 {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	return names
}

// A replica is what the router routes to.
var _ router.Endpoint = (*replica.Replica)(nil)

// addReplica starts routing to a replica (in process, or a worker that registered).
func (s *Server) addReplica(r *replica.Replica) {
	r.SetSamplingLimit(s.opts.MaxQueuedSamples)
	r.SetSamplerCopies(s.opts.SamplerCopies)
	s.modelsMu.Lock()
	s.models[r.BaseModel()] = append(s.models[r.BaseModel()], r)
	s.modelsMu.Unlock()
	s.router.AddEndpoint(r)
}

// removeReplica stops routing to a replica (a dead worker); its adapters are re-placed on their
// next request, from their last saved state.
func (s *Server) removeReplica(id string) {
	s.modelsMu.Lock()
	for base, reps := range s.models {
		for i, r := range reps {
			if r.ID() == id {
				r.SetHealthy(false)
				s.models[base] = append(reps[:i:i], reps[i+1:]...)
				break
			}
		}
	}
	s.modelsMu.Unlock()
	s.router.RemoveEndpoint(id)
}

// samplingReplica asks the router's sampling profile where a sampler runs: a replica holding
// the weights if any (where, and the holders given), else the request's routing key's replica
// (rendezvous, so one key sticks to one replica), else the shortest queue, counting the sampling
// requests batched here.
func (s *Server) samplingReplica(base, where, key string, holders ...string) (*replica.Replica, error) {
	if _, err := s.replicasOf(base); err != nil { // an unknown base model is the client's error
		return nil, err
	}
	req := router.Request{BaseModel: base, Key: key, Backlog: s.samplingBacklog(), Holders: holders}
	if where != "" {
		req.Holders = append(req.Holders, where)
	}
	ep, err := s.router.Pick(req)
	if err != nil {
		if errors.Is(err, router.ErrNoEndpoint) {
			return nil, errf(http.StatusServiceUnavailable, "no healthy replica of %s", base)
		}
		return nil, fmt.Errorf("choosing a replica to sample on: %w", err)
	}
	return s.replicaFor(ep)
}

// copyHolders lists the replicas keeping a copy of a sampler's weights in memory; none for the
// base model, which every replica holds.
func (s *Server) copyHolders(smp *sampler) []string {
	if smp.engineID == "" {
		return nil
	}
	var out []string
	for _, r := range s.allReplicas() {
		if r.HoldsCopy(smp.engineID) {
			out = append(out, r.ID())
		}
	}
	return out
}

// samplingBacklog snapshots the sampling requests waiting on each replica (taken before the
// router's lock, so the two locks never nest).
func (s *Server) samplingBacklog() func(replicaID string) int {
	snap := map[string]int{}
	for _, r := range s.allReplicas() {
		snap[r.ID()] = r.SamplingWaiting()
	}
	return func(id string) int { return snap[id] }
}

// runQueueBacklog counts, per replica, the ops waiting in the run queues of the adapters placed
// there: ordered behind the op running, they wait here for that replica.
func (s *Server) runQueueBacklog(placed map[string][]string) map[string]int {
	out := map[string]int{}
	s.runs.mu.Lock()
	defer s.runs.mu.Unlock()
	for repID, adapters := range placed {
		for _, a := range adapters {
			if run := s.runs.m[a]; run != nil && run.queue != nil {
				run.queue.mu.Lock()
				out[repID] += max(run.queue.ops, 0)
				run.queue.mu.Unlock()
			}
		}
	}
	return out
}

// routingKey reads the sticky routing header, accepting every spelling of Ray Serve's multiplexed
// model id and X-Session-Id, in any case, with '-' and '_' equivalent.
func routingKey(r *http.Request) string {
	for name, vals := range r.Header {
		n := strings.ToLower(strings.ReplaceAll(name, "_", "-"))
		if (n == "serve-multiplexed-model-id" || n == "x-session-id") && len(vals) > 0 && vals[0] != "" {
			return vals[0]
		}
	}
	return ""
}

// listReplicas reports each replica, the adapters placed on it, and its queue depth: everything
// waiting for it, on the replica or here (the replica alone sees only what has reached it).
func (s *Server) listReplicas(w http.ResponseWriter, r *http.Request, _ string) (any, error) {
	placed := s.router.Adapters()
	backlog := s.runQueueBacklog(placed)
	batched := s.samplingBacklog()
	rows := []api.ReplicaStatus{}
	for _, u := range s.router.Usage() {
		ep := u.Endpoint
		adapters := placed[ep.ID()]
		if adapters == nil {
			adapters = []string{}
		}
		onReplica, sampling := ep.QueueDepth(), batched(ep.ID())
		// A routed op that reached the replica is in both counts: the larger counts, not the sum.
		depth := max(onReplica, u.Ops, 0) + backlog[ep.ID()] + sampling
		row := api.ReplicaStatus{ID: ep.ID(), BaseModel: ep.BaseModel(), Healthy: ep.Healthy(), MaxLoras: ep.MaxLoras(),
			AdaptersHeld: u.Held, IdleAdapters: u.Idle, Adapters: adapters, QueueDepth: depth,
			Queue: api.ReplicaQueue{OnReplica: onReplica, Routed: u.Ops, RunQueues: backlog[ep.ID()], SamplingBatched: sampling}}
		if hb, ok := s.reported(ep.ID()); ok {
			row.WorkerReported = &api.WorkerReported{Adapters: len(hb.Adapters), FreeSlots: hb.FreeSlots, QueueDepth: hb.QueueDepth, Draining: hb.Draining}
		}
		rows = append(rows, row)
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].ID < rows[j].ID })
	return api.ReplicasResponse{Replicas: rows}, nil
}

func (s *Server) capacity(w http.ResponseWriter, r *http.Request, _ string) (any, error) {
	out := map[string]api.FleetCapacity{}
	for _, u := range s.router.Usage() {
		ep := u.Endpoint
		c := out[ep.BaseModel()]
		if ep.Healthy() {
			c.MaxLoras += ep.MaxLoras()
			c.UsedLoras += u.Held
			c.FreeLoras += ep.MaxLoras() - u.Held
		}
		out[ep.BaseModel()] = c
	}
	return out, nil
}
