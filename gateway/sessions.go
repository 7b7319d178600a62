package gateway

// Sessions: create, heartbeat, expiry and listing.

import (
	"context"
	"net/http"
	"sort"
	"time"

	"github.com/skein-ai/skein/api"
)

func (s *Server) createSession(w http.ResponseWriter, r *http.Request, tenant string) (any, error) {
	var req api.CreateSessionRequest
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
	return api.CreateSessionResponse{SessionID: sess.id, Type: "create_session"}, nil
}

func (s *Server) heartbeat(w http.ResponseWriter, r *http.Request, tenant string) (any, error) {
	var req api.SessionHeartbeatRequest
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
	return api.TypeResponse{Type: "session_heartbeat"}, nil
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
	return api.SessionsResponse{Sessions: ids}, nil
}

func (s *Server) getSession(w http.ResponseWriter, r *http.Request, tenant string) (any, error) {
	sess, err := s.sessionOf(tenant, r.PathValue("id"))
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return api.SessionResponse{TrainingRunIDs: append([]string{}, sess.runs...), SamplerIDs: append([]string{}, sess.samplers...)}, nil
}
