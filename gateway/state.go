package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"time"

	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/checkpoint"
	"github.com/skein-ai/skein/engine"
	"github.com/skein-ai/skein/replica"
	"github.com/skein-ai/skein/store"
)

// Write-through persistence: the in-memory maps serve requests; every change is written to the
// store, and New rebuilds the maps from it, so a restart loses nothing a client was told about.

type sessionData struct {
	Tags     []string         `json:"tags"`
	Metadata api.UserMetadata `json:"metadata"`
	Runs     []string         `json:"runs"`
	Samplers []string         `json:"samplers"`
	Project  string           `json:"project,omitempty"`
}

type runData struct {
	Lora            engine.LoraConfig `json:"lora"`
	Step            int               `json:"step"`
	Metadata        map[string]string `json:"metadata"`
	LastCkpt        string            `json:"last_checkpoint"`
	LastSamplerCkpt string            `json:"last_sampler_checkpoint"`
	// PendingForwardBackwards are the forward_backward requests run since the last optim_step
	// (recorded before their results are stored; see gradientLedger).
	PendingForwardBackwards []string `json:"pending_forward_backwards,omitempty"`
	UntrackedGradients      bool     `json:"untracked_gradients,omitempty"`
	Project                 string   `json:"project,omitempty"`
}

type samplerData struct {
	BaseModel string `json:"base_model"`
	ModelPath string `json:"model_path"`
	EngineID  string `json:"engine_id"`
	Dir       string `json:"dir"`
	// Key is Dir relative to the data directory: another gateway, whose data directory is
	// elsewhere, finds the weights by it (object storage keys are these relative paths).
	Key string `json:"key,omitempty"`
}

// samplerFromRow rebuilds a stored sampler on a replica of its base model here.
func (s *Server) samplerFromRow(row store.Sampler) (*sampler, error) {
	var d samplerData
	if err := json.Unmarshal(row.Data, &d); err != nil {
		return nil, fmt.Errorf("sampler %s: %w", row.ID, err)
	}
	dir := d.Dir
	if d.Key != "" && filepath.IsLocal(d.Key) {
		dir = filepath.Join(s.opts.DataDir, d.Key)
	}
	rep, err := s.samplingReplica(d.BaseModel, "", "")
	if err != nil {
		return nil, err
	}
	return &sampler{id: row.ID, tenant: row.Tenant, session: row.SessionID, baseModel: d.BaseModel,
		modelPath: d.ModelPath, engineID: d.EngineID, dir: dir, rep: rep}, nil
}

func (s *Server) logErr(what string, err error) {
	if err != nil {
		s.log.Error("persisting state", "what", what, "err", err)
	}
}

// sessionSnapshot is the session's row as it is now, to store once s.sessions.mu is released;
// call with it held.
//
// Only the slices that change are copied under the lock; the encoding is done when the row is
// stored, after the lock is released, so that no session's row (however big) is encoded while
// every tenant's heartbeat and create_session wait on s.sessions.mu. Tags and metadata never
// change once the session is created, so they are shared, not copied.
func (s *Server) sessionSnapshot(x *session, closed bool) rowWrite {
	d := sessionData{Tags: x.tags, Metadata: x.metadata, Runs: slices.Clone(x.runs), Samplers: slices.Clone(x.samplers), Project: x.project}
	row := store.Session{ID: x.id, Tenant: x.tenant, Created: x.created, Heartbeat: x.heartbeat, Closed: closed}
	return rowWrite{what: "session", ver: &x.ver, n: x.ver.bump(), put: func(ctx context.Context) error {
		row.Data, _ = json.Marshal(d)
		return s.st.PutSession(ctx, row)
	}}
}

// runSnapshot is the training run's row as it is now, to store once s.runs.mu is released; call
// with it held.
func (s *Server) runSnapshot(r *trainingRun) rowWrite {
	b, _ := json.Marshal(runData{Lora: r.lora, Step: r.step, Metadata: r.metadata, LastCkpt: r.lastCkpt, LastSamplerCkpt: r.lastSamplerCkpt,
		PendingForwardBackwards: r.grads.pending, UntrackedGradients: r.grads.untracked, Project: r.project})
	row := store.Run{ID: r.id, Tenant: r.tenant, SessionID: r.session,
		BaseModel: r.baseModel, Created: r.created, LastRequest: r.lastRequest, Live: r.ready, Data: b}
	if s.leases.on {
		// A run this gateway sequenced: its row is written only while the lease is still this
		// gateway's at that epoch (a zombie's stale view never overwrites the new holder's).
		if e, ok := s.leases.lastEpoch(r.id); ok {
			fence := store.Fence{Run: r.id, Holder: s.self(), Epoch: e}
			return rowWrite{what: "run", ver: &r.ver, n: r.ver.bump(), put: func(ctx context.Context) error {
				err := s.st.PutRunFenced(ctx, row, fence)
				if errors.Is(err, store.ErrFenced) {
					s.log.Warn("not writing a run another gateway sequences now", "run", row.ID, "err", err)
					return nil
				}
				return err
			}}
		}
	}
	return rowWrite{what: "run", ver: &r.ver, n: r.ver.bump(), put: func(ctx context.Context) error { return s.st.PutRun(ctx, row) }}
}

// updateRun changes a run under s.runs.mu, then stores it (after the lock is released).
func (s *Server) updateRun(run *trainingRun, change func(*trainingRun)) {
	s.runs.mu.Lock()
	change(run)
	w := s.runSnapshot(run)
	s.runs.mu.Unlock()
	s.persist(w)
}

// saveSampler stores a sampler's row. A sampler does not change once made: this is called once,
// before the sampler is registered (so that the session sweep cannot delete the row before it is
// written).
func (s *Server) saveSampler(x *sampler) {
	d := samplerData{BaseModel: x.baseModel, ModelPath: x.modelPath, EngineID: x.engineID, Dir: x.dir}
	if rel, err := filepath.Rel(s.opts.DataDir, x.dir); x.dir != "" && err == nil && filepath.IsLocal(rel) {
		d.Key = rel
	}
	b, _ := json.Marshal(d)
	s.logErr("sampler", s.st.PutSampler(context.Background(), store.Sampler{ID: x.id, Tenant: x.tenant, SessionID: x.session, Data: b}))
}

// registerSampler records a new sampler and adds it to its session (if that is still open).
func (s *Server) registerSampler(smp *sampler, sessionID string) {
	s.saveSampler(smp)
	s.samplers.add(smp.id, smp)
	s.sessions.mu.Lock()
	sess := s.sessions.m[sessionID]
	var w rowWrite
	if sess != nil {
		sess.samplers = append(sess.samplers, smp.id)
		w = s.sessionSnapshot(sess, false)
	}
	s.sessions.mu.Unlock()
	if sess != nil {
		s.persist(w)
	}
}

// metaSnapshot is the checkpoint's row as it is now, to store once s.ckpts.mu is released; call
// with it held.
func (s *Server) metaSnapshot(m *ckptMeta) rowWrite {
	b, _ := json.Marshal(m)
	row := store.Checkpoint{Path: m.Path, Owner: m.Owner, ModelID: m.parsed.ModelID, Created: m.Created,
		ExpiresAt: m.ExpiresAt, Public: m.Public, Data: b}
	return rowWrite{what: "checkpoint", ver: &m.ver, n: m.ver.bump(), put: func(ctx context.Context) error { return s.st.PutCheckpoint(ctx, row) }}
}

// saveMeta persists a checkpoint's metadata.
func (s *Server) saveMeta(m *ckptMeta) error {
	s.ckpts.mu.Lock()
	w := s.metaSnapshot(m)
	s.ckpts.mu.Unlock()
	return w.store()
}

// recoverCheckpoints repairs what a crash in the middle of a checkpoint overwrite left: an
// acknowledged checkpoint moved aside is put back where its directory is missing, and aside
// copies of present checkpoints are removed. Partial directories (never acknowledged) are left to
// sweepTempDirs, which removes them at start once older than any save: a recent one may be a
// save in progress on another gateway.
func (s *Server) recoverCheckpoints() {
	restored, err := checkpoint.Recover(filepath.Join(s.opts.DataDir, "checkpoints"), false)
	for _, dir := range restored {
		s.log.Warn("recovered a checkpoint left aside by an interrupted overwrite", "dir", dir)
	}
	s.logErr("recovering checkpoints", err)
}

// restore rebuilds the in-memory state from the store after a start. Requests that were running
// when the previous process died end as server errors saying so; live adapters come back from
// their last saved state on their next request (see replica.Replica.ensure).
func (s *Server) restore() error {
	ctx := context.Background()
	if err := s.checkStoreKnowsDisk(ctx); err != nil {
		return err
	}
	if err := s.st.GatewayHeartbeat(ctx, s.futures.prefix); err != nil {
		return err
	}
	if err := s.failOrphans(ctx); err != nil {
		return err
	}
	s.recoverCheckpoints()
	if !s.shared() {
		// This process is the only gateway and its replicas start empty: old placements are void.
		placed, err := s.st.Placements(ctx)
		if err != nil {
			return err
		}
		for a := range placed {
			s.logErr("placement", s.st.DeletePlacement(ctx, a))
		}
		s.tidySavedStates() // no other gateway can be saving now
	}
	sessions, err := s.st.Sessions(ctx)
	if err != nil {
		return err
	}
	now := time.Now()
	for _, row := range sessions {
		if row.Closed {
			continue
		}
		var d sessionData
		_ = json.Unmarshal(row.Data, &d)
		// The heartbeat clock restarts: a client that is still there keeps its session.
		s.sessions.m[row.ID] = &session{id: row.ID, tenant: row.Tenant, created: row.Created, heartbeat: now,
			tags: d.Tags, metadata: d.Metadata, runs: d.Runs, samplers: d.Samplers, project: d.Project}
	}
	runs, err := s.st.Runs(ctx)
	if err != nil {
		return err
	}
	members := map[string][]string{} // session → its runs (then samplers) by their rows
	for _, row := range runs {
		// Runs of base models not served (yet: workers may register later) are restored too.
		s.runs.m[row.ID] = runFromRow(row)
		members[row.SessionID] = append(members[row.SessionID], row.ID)
	}
	// A run's own row names its session: the session row's list may be another gateway's,
	// written without it (several gateways on one store). Samplers likewise, below.
	for id, runs := range members {
		if sess := s.sessions.m[id]; sess != nil {
			sess.runs = union(sess.runs, runs)
		}
	}
	clear(members)
	samplers, err := s.st.Samplers(ctx)
	if err != nil {
		return err
	}
	for _, row := range samplers {
		smp, err := s.samplerFromRow(row)
		if err != nil {
			continue
		}
		s.samplers.m[row.ID] = smp
		members[row.SessionID] = append(members[row.SessionID], row.ID)
	}
	for id, samplers := range members {
		if sess := s.sessions.m[id]; sess != nil {
			sess.samplers = union(sess.samplers, samplers)
		}
	}
	ckpts, err := s.st.Checkpoints(ctx)
	if err != nil {
		return err
	}
	for _, row := range ckpts {
		if m := ckptFromRow(row); m != nil {
			s.ckpts.m[m.Path] = m
		}
	}
	return nil
}

// ckptFromRow is a checkpoint's metadata as its row has it (nil if unreadable).
func ckptFromRow(row store.Checkpoint) *ckptMeta {
	var m ckptMeta
	if json.Unmarshal(row.Data, &m) != nil {
		return nil
	}
	p, err := checkpoint.Parse(m.Path)
	if err != nil {
		return nil
	}
	m.parsed = p
	return &m
}

// otherRuns and otherCheckpoints, with several gateways on one store, are what other gateways
// made since this one started and this one's maps lack, read from the store for a listing: a
// client behind a load balancer otherwise saw a run or a checkpoint in one gateway's listing and
// not in another's. None of it is kept: a run's own requests go to its lease holder, and a delete
// here must not be undone by a listing that read the row just before it went. Only the rows the
// tenant may see are read (its own, and the published ones).
func (s *Server) otherRuns(ctx context.Context, tenant string) ([]*trainingRun, error) {
	if !s.leases.on {
		return nil, nil
	}
	rows, err := s.st.RunsVisibleTo(ctx, tenant)
	if err != nil {
		return nil, errf(http.StatusServiceUnavailable, "reading the runs: %v", err)
	}
	var out []*trainingRun
	s.runs.mu.Lock()
	defer s.runs.mu.Unlock()
	for _, row := range rows {
		if s.runs.m[row.ID] == nil {
			out = append(out, runFromRow(row))
		}
	}
	return out, nil
}

func (s *Server) otherCheckpoints(ctx context.Context, tenant string) ([]*ckptMeta, error) {
	if !s.leases.on {
		return nil, nil
	}
	rows, err := s.st.CheckpointsVisibleTo(ctx, tenant)
	if err != nil {
		return nil, errf(http.StatusServiceUnavailable, "reading the checkpoints: %v", err)
	}
	var out []*ckptMeta
	s.ckpts.mu.Lock()
	defer s.ckpts.mu.Unlock()
	for _, row := range rows {
		if s.ckpts.m[row.Path] == nil {
			if m := ckptFromRow(row); m != nil && m.Path == row.Path {
				out = append(out, m)
			}
		}
	}
	return out, nil
}

// adapterOf is a run as its replica sees it: the adapter, its tenant's lane, and the record of
// its durable state (runState).
func (s *Server) adapterOf(run *trainingRun) replica.Adapter {
	s.runs.mu.Lock()
	lora := run.lora
	s.runs.mu.Unlock()
	return replica.Adapter{ID: run.id, Lane: run.tenant, Lora: lora, State: runState{s, run}}
}

// runState keeps a run's durable state for its replica (replica.StateKeeper): the adapter's
// saved versions under DATA/state (durable.go), and the gradient ledger in the run's row
// (gradients.go). The replica saves the adapter after every optim_step and load, and before it
// leaves memory, so an adapter that leaves memory (restart, eviction) comes back exactly as its
// last acknowledged step left it.
type runState struct {
	s   *Server
	run *trainingRun
}

var _ replica.StateKeeper = runState{}

func (k runState) Saved() (string, error) { return k.s.savedState(k.run.id) }

func (k runState) Restored(dir string) {
	rec := k.s.readGradientsRecord(dir)
	k.s.runs.mu.Lock()
	k.run.grads.held, k.run.grads.stepTo = rec.ForwardBackwards, 0
	// A saved state past the run's recorded step was saved by an optim_step whose gateway was
	// gone before it recorded the step: the forward_backwards in the ledger were consumed by it.
	ahead := rec.Step > k.run.step
	k.s.runs.mu.Unlock()
	if ahead {
		k.s.updateRun(k.run, func(run *trainingRun) {
			run.step = rec.Step
			run.grads = gradientLedger{pending: slices.Clone(rec.ForwardBackwards), held: rec.ForwardBackwards}
		})
	}
}

// Fresh allows re-creating an adapter from its seed (PEFT init is deterministic) only if it never
// stepped: a run that has stepped but whose state is missing never silently starts over.
func (k runState) Fresh() error {
	s, run := k.s, k.run
	s.runs.mu.Lock()
	step := run.step
	run.grads.held, run.grads.stepTo = nil, 0
	s.runs.mu.Unlock()
	if step > 0 {
		return fmt.Errorf("%w: model %s has taken %d steps but %s holds no saved state for it; it is not restarted "+
			"from its seed: create a new model and load_weights from its last checkpoint", errStateLost, run.id, step, s.stateRoot())
	}
	return nil
}

// Save writes the adapter's full state (weights, optimizer, step, pending gradients and which
// forward_backwards they hold) as its new current state, atomically (see durable.go).
func (k runState) Save(ctx context.Context, fence string, fill func(dir string) error) (string, error) {
	start := time.Now()
	defer func() { k.s.metrics.persisted(time.Since(start)) }()
	k.s.runs.mu.Lock()
	rec := gradientsRecord{ForwardBackwards: slices.Clone(k.run.grads.held), Step: k.run.step}
	stepTo := k.run.grads.stepTo
	if stepTo > 0 {
		rec.Step, rec.Applied = stepTo, k.run.grads.stepOp
	}
	k.s.runs.mu.Unlock()
	next, err := k.s.writeSavedState(ctx, k.run.id, fence, rec, fill)
	if stepTo > 0 {
		// The save of an optim_step (see Stepped): the step counts now that it is saved, and
		// only then do the forward_backwards it consumed leave the ledger. A failed save
		// leaves them there, so the next optim_step, on the state saved before, names them.
		k.s.updateRun(k.run, func(run *trainingRun) {
			run.grads.stepTo, run.grads.stepOp = 0, ""
			if err == nil {
				run.grads = gradientLedger{} // consumed
				run.step, run.lastRequest = stepTo, time.Now()
			}
		})
	}
	return next, err
}

// Claim makes the caller's replica the run's one writer (see claimSavedState).
func (k runState) Claim(ctx context.Context) (string, error) {
	return k.s.claimSavedState(ctx, k.run.id)
}

func (k runState) BeforeStep(ctx context.Context) error { return k.s.lostGradients(ctx, k.run) }

// Stepped: the step consumed the gradients in memory. The save that follows holds none, and
// records step; the ledger and the run's step change only once it succeeded (Save).
func (k runState) Stepped(step int) {
	k.s.runs.mu.Lock()
	k.run.grads.held, k.run.grads.stepTo = nil, step
	k.s.runs.mu.Unlock()
}

func (k runState) Replaced(cfg engine.LoraConfig, step int) {
	k.s.updateRun(k.run, func(run *trainingRun) {
		run.lora, run.step = cfg, step
		run.grads = gradientLedger{} // the adapter was replaced
	})
}

// orphanMsg is the error of a request whose gateway died while it ran.
const orphanMsg = "the server restarted while this request was running; submit it again"

// failOrphans ends requests whose gateway is gone. With an embedded store this process is the
// only gateway, so every other owner is dead; with a shared store, owners that stopped
// heartbeating are.
func (s *Server) failOrphans(ctx context.Context) error {
	var within time.Duration
	if s.shared() {
		within = 5 * gatewayHeartbeat
	}
	n, err := s.st.FailOrphaned(ctx, s.futures.prefix, within, orphanMsg)
	if n > 0 {
		s.log.Warn("ended requests interrupted by a restart", "count", n)
	}
	return err
}

// shared reports whether other gateways may use the same store (it notifies across them).
func (s *Server) shared() bool {
	_, ok := s.st.(store.FutureListener)
	return ok
}

const gatewayHeartbeat = 2 * time.Second
