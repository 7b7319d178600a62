package gateway

// Sessions: create, heartbeat, expiry and listing.

import (
	"context"
	"encoding/json"
	"net/http"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/store"
)

func (s *Server) createSession(w http.ResponseWriter, r *http.Request, tenant string) (any, error) {
	var req api.CreateSessionRequest
	if err := s.decodeJSON(r, &req); err != nil {
		return nil, err
	}
	if err := checkTags(req.Tags); err != nil {
		return nil, err
	}
	if err := checkMetadata(req.UserMetadata); err != nil {
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
	s.sessions.mu.Lock()
	// Counted and added under one lock, so concurrent create_sessions cannot pass the bound
	// together. Only live sessions are in s.sessions.m: expired ones do not count.
	live := 0
	for _, x := range s.sessions.m {
		if x.tenant == tenant {
			live++
		}
	}
	if live >= s.opts.MaxSessionsPerTenant {
		s.sessions.mu.Unlock()
		return nil, errf(http.StatusTooManyRequests, "tenant already has %d live sessions (limit %d, max_sessions_per_tenant): let unused ones expire (stop their heartbeats) and retry", live, s.opts.MaxSessionsPerTenant)
	}
	s.sessions.m[sess.id] = sess
	write := s.sessionSnapshot(sess, false)
	s.sessions.mu.Unlock()
	s.persist(write)
	return api.CreateSessionResponse{SessionID: sess.id, Type: "create_session"}, nil
}

func (s *Server) heartbeat(w http.ResponseWriter, r *http.Request, tenant string) (any, error) {
	var req api.SessionHeartbeatRequest
	if err := s.decodeJSON(r, &req); err != nil {
		return nil, err
	}
	s.knowSession(req.SessionID)
	s.sessions.mu.Lock()
	sess := s.sessions.m[req.SessionID]
	if sess == nil || sess.tenant != tenant {
		s.sessions.mu.Unlock()
		return nil, errf(http.StatusNotFound, "session %q not found", req.SessionID)
	}
	sess.heartbeat = time.Now()
	id, at := sess.id, sess.heartbeat
	s.sessions.mu.Unlock()
	// Only the time is stored (after the lock): the row's tags, metadata and ids did not change,
	// and re-encoding them on every heartbeat is what let one tenant's big row stall others.
	s.logErr("session heartbeat", s.st.TouchSession(context.Background(), id, at))
	return api.TypeResponse{Type: "session_heartbeat"}, nil
}

// sweepSessions closes sessions that stopped heartbeating: their samplers go, their runs' adapters
// are unloaded (their checkpoints stay).
func (s *Server) sweepSessions(now time.Time) {
	s.refreshHeartbeats(now)
	var writes []rowWrite
	var samplerIDs, runIDs []string
	s.sessions.mu.Lock()
	for id, sess := range s.sessions.m {
		if now.Sub(sess.heartbeat) > s.opts.SessionTimeout {
			s.log.Info("session expired", "session", sess.id, "tenant", sess.tenant, "runs", len(sess.runs), "samplers", len(sess.samplers), "idle", now.Sub(sess.heartbeat).Round(time.Millisecond))
			delete(s.sessions.m, id)
			writes = append(writes, s.sessionSnapshot(sess, true))
			samplerIDs = append(samplerIDs, sess.samplers...)
			runIDs = append(runIDs, sess.runs...)
		}
	}
	s.sessions.mu.Unlock()
	// Gone from the registry, the sessions get no new runs or samplers (createModel and
	// registerSampler look their session up under its lock).
	var gone []*sampler
	s.samplers.mu.Lock()
	for _, id := range samplerIDs {
		if smp := s.samplers.m[id]; smp != nil {
			gone = append(gone, smp)
		}
		delete(s.samplers.m, id)
	}
	s.samplers.mu.Unlock()
	s.removeEphemeral(gone)
	var drop []*trainingRun
	s.runs.mu.Lock()
	for _, id := range runIDs {
		if run := s.runs.m[id]; run != nil && run.ready {
			drop = append(drop, run)
			run.ready = false
			writes = append(writes, s.runSnapshot(run))
		}
	}
	s.runs.mu.Unlock()
	s.persist(writes...)
	for _, id := range samplerIDs {
		s.logErr("sampler", s.st.DeleteSampler(context.Background(), id))
	}
	for _, run := range drop {
		s.dropAdapter(run)
	}
}

// removeEphemeral frees the weights of an expired session's ephemeral samplers: nothing can name
// them again (they have no path), so they would otherwise wait for the age-based sweep. A
// sampler over a checkpoint keeps its weights: they are the checkpoint's.
func (s *Server) removeEphemeral(gone []*sampler) {
	root := filepath.Join(s.opts.DataDir, "ephemeral") + string(filepath.Separator)
	for _, smp := range gone {
		if smp.modelPath != "" || !strings.HasPrefix(smp.dir, root) {
			continue
		}
		if smp.rep != nil {
			smp.rep.DropCopies(func(id string) bool { return id == smp.engineID })
		}
		s.logErr("removing an expired session's ephemeral weights", s.removeTree(smp.dir))
	}
}

func (s *Server) isLive(run *trainingRun) bool {
	s.runs.mu.Lock()
	defer s.runs.mu.Unlock()
	return run.ready
}

func (s *Server) sessionOf(tenant, id string) (*session, error) {
	s.knowSession(id)
	sess := s.sessions.get(id)
	if sess == nil || sess.tenant != tenant {
		return nil, errf(http.StatusNotFound, "session %q not found", id)
	}
	return sess, nil
}

func (s *Server) listSessions(w http.ResponseWriter, r *http.Request, tenant string) (any, error) {
	offset, limit, err := paging(r)
	if err != nil {
		return nil, err
	}
	var rows []store.Session
	if s.leases.on { // several gateways: the sessions the others made too (read, not kept)
		if rows, err = s.st.SessionsOf(r.Context(), tenant); err != nil {
			return nil, errf(http.StatusServiceUnavailable, "reading the sessions: %v", err)
		}
	}
	s.sessions.mu.Lock()
	var all []*session
	for _, sess := range s.sessions.m {
		if sess.tenant == tenant {
			all = append(all, sess)
		}
	}
	for _, row := range rows {
		if row.Tenant == tenant && !row.Closed && s.sessions.m[row.ID] == nil {
			all = append(all, &session{id: row.ID, tenant: row.Tenant, created: row.Created})
		}
	}
	s.sessions.mu.Unlock()
	sort.Slice(all, func(i, j int) bool { return all[i].created.Before(all[j].created) })
	ids := []string{}
	for _, sess := range page(all, offset, limit) {
		ids = append(ids, sess.id)
	}
	return api.SessionsResponse{Sessions: ids}, nil
}

func (s *Server) getSession(w http.ResponseWriter, r *http.Request, tenant string) (any, error) {
	sess, err := s.sessionOf(tenant, r.PathValue("id"))
	if err != nil {
		return nil, err
	}
	s.sessions.mu.Lock()
	runs, samplers := append([]string{}, sess.runs...), append([]string{}, sess.samplers...)
	s.sessions.mu.Unlock()
	if s.leases.on {
		// Several gateways: the others' runs and samplers of this session are in their own rows
		// (the session's row holds only its last writer's list).
		stRuns, stSamplers, err := s.st.SessionMembers(r.Context(), sess.id)
		if err != nil {
			return nil, errf(http.StatusServiceUnavailable, "reading the session's runs: %v", err)
		}
		runs, samplers = union(runs, stRuns), union(samplers, stSamplers)
	}
	return api.SessionResponse{TrainingRunIDs: runs, SamplerIDs: samplers}, nil
}

// union is a followed by the ids of b it lacks, in their order (a set: a session may hold many).
func union(a, b []string) []string {
	seen := make(map[string]bool, len(a))
	for _, id := range a {
		seen[id] = true
	}
	for _, id := range b {
		if !seen[id] {
			seen[id] = true
			a = append(a, id)
		}
	}
	return a
}

// knowSession loads a session another gateway created after this one started (several
// gateways on one store, issue 38): without it, a client whose requests a load balancer sends to
// both would find its session missing on one of them.
func (s *Server) knowSession(id string) {
	if !s.leases.on || s.sessions.get(id) != nil {
		return
	}
	row, err := s.st.GetSession(context.Background(), id)
	if err != nil || row.Closed {
		return
	}
	var d sessionData
	_ = json.Unmarshal(row.Data, &d)
	s.sessions.mu.Lock()
	if s.sessions.m[id] == nil {
		s.sessions.m[id] = &session{id: row.ID, tenant: row.Tenant, created: row.Created, heartbeat: row.Heartbeat,
			tags: d.Tags, metadata: d.Metadata, runs: d.Runs, samplers: d.Samplers, project: d.Project}
	}
	s.sessions.mu.Unlock()
}

// refreshHeartbeats, with several gateways, moves the heartbeat of each session about to expire
// here to the one in the store: its client may heartbeat through another gateway, and this one
// must not expire (and unload the runs of) a session that is alive there.
func (s *Server) refreshHeartbeats(now time.Time) {
	if !s.leases.on {
		return
	}
	s.sessions.mu.Lock()
	var ids []string
	for id, sess := range s.sessions.m {
		if now.Sub(sess.heartbeat) > s.opts.SessionTimeout {
			ids = append(ids, id)
		}
	}
	s.sessions.mu.Unlock()
	for _, id := range ids {
		row, err := s.st.GetSession(context.Background(), id)
		if err != nil || row.Closed {
			continue
		}
		s.sessions.mu.Lock()
		if sess := s.sessions.m[id]; sess != nil && row.Heartbeat.After(sess.heartbeat) {
			sess.heartbeat = row.Heartbeat
		}
		s.sessions.mu.Unlock()
	}
}
