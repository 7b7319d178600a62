package gateway

import (
	"errors"
	"maps"
	"net/http"
	"slices"
	"time"

	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/store"
)

// Projects group a tenant's sessions (and so their training runs and samplers) under a name of
// the tenant's choosing. A project id lives in the tenant's own namespace: two tenants may use
// the same id without seeing each other's runs.

const maxProjectID = 128

func validProjectID(id string) error {
	if id == "" {
		return errf(http.StatusBadRequest, "project_id is required (a session cannot be moved out of a project)")
	}
	if len(id) > maxProjectID {
		return errf(http.StatusBadRequest, "project_id is %d bytes, at most %d", len(id), maxProjectID)
	}
	for _, c := range id {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.' || c == ':') {
			return errf(http.StatusBadRequest, "project_id %q: only letters, digits and - _ . : are allowed", id)
		}
	}
	return nil
}

// assignSessionProject moves a session and all of its training runs into a project
// (PUT /api/v1/sessions/{id}/project).
func (s *Server) assignSessionProject(w http.ResponseWriter, r *http.Request, tenant string) (any, error) {
	var req api.AssignProjectRequest
	if err := s.decodeJSON(r, &req); err != nil {
		return nil, err
	}
	if err := validProjectID(req.ProjectID); err != nil {
		return nil, err
	}
	id := r.PathValue("id")
	s.sessions.mu.Lock()
	sess := s.sessions.m[id]
	if sess == nil || sess.tenant != tenant {
		s.sessions.mu.Unlock()
		return nil, errf(http.StatusNotFound, "session %q not found", id)
	}
	sess.project = req.ProjectID
	writes := []rowWrite{s.sessionSnapshot(sess, false)}
	s.runs.mu.Lock()
	for _, rid := range sess.runs {
		if run := s.runs.m[rid]; run != nil {
			run.project = req.ProjectID
			writes = append(writes, s.runSnapshot(run))
		}
	}
	s.runs.mu.Unlock()
	s.sessions.mu.Unlock()
	s.persist(writes...)
	s.trail.record(tenant, "session.assign_project", "", "", "session "+id+" to project "+req.ProjectID)
	return api.AssignProjectResponse{SessionID: id, ProjectID: req.ProjectID}, nil
}

// runFilter reads list_training_runs' access_scope and project_id: "owned" (the default) lists
// the tenant's runs; "accessible" adds other tenants' runs that have a published checkpoint.
// The returned function is called with s.runs.mu and s.ckpts.mu held.
func runFilter(r *http.Request, tenant string) (func(*trainingRun, ckptIndex) bool, error) {
	q := r.URL.Query()
	accessible, err := accessScope(r)
	if err != nil {
		return nil, err
	}
	project, byProject := q.Get("project_id"), q.Has("project_id")
	if byProject && project != "" {
		if err := validProjectID(project); err != nil {
			return nil, err
		}
	}
	return func(run *trainingRun, idx ckptIndex) bool {
		if byProject && run.project != project {
			return false
		}
		return run.tenant == tenant || accessible && idx.public[run.id]
	}, nil
}

func accessScope(r *http.Request) (accessible bool, err error) {
	switch v := r.URL.Query().Get("access_scope"); v {
	case "", "owned":
		return false, nil
	case "accessible":
		return true, nil
	default:
		return false, errf(http.StatusBadRequest, "access_scope must be \"owned\" or \"accessible\", got %q", v)
	}
}

// ckptIndex is what the run rows need from the checkpoints, found in one pass over them (a
// listing stays linear in runs plus checkpoints): each run's newest existing checkpoint of each
// kind (neither deleted nor expired, so last_checkpoint falls back to an older one when the
// newest goes), and the runs with a published one.
type ckptIndex struct {
	newest map[[2]string]*ckptMeta // {run, kind}
	public map[string]bool
}

// indexCheckpoints builds the index; call with s.ckpts.mu held.
func (s *Server) indexCheckpoints(others ...*ckptMeta) ckptIndex {
	idx := ckptIndex{newest: map[[2]string]*ckptMeta{}, public: map[string]bool{}}
	now := time.Now()
	for _, m := range append(slices.Collect(maps.Values(s.ckpts.m)), others...) {
		if m.expired(now) {
			continue
		}
		if m.Public {
			idx.public[m.parsed.ModelID] = true
		}
		k := [2]string{m.parsed.ModelID, m.parsed.Kind}
		if best := idx.newest[k]; best == nil || m.Created.After(best.Created) || m.Created.Equal(best.Created) && m.Path > best.Path {
			idx.newest[k] = m
		}
	}
	return idx
}

// accessibleRun finds a run for get_training_run: the tenant's own, or with
// access_scope=accessible another tenant's that has a published checkpoint.
func (s *Server) accessibleRun(r *http.Request, tenant, id string) (*trainingRun, error) {
	accessible, err := accessScope(r)
	if err != nil {
		return nil, err
	}
	if s.leases.on && s.runs.get(id) == nil { // made through another gateway: its row, read for this request
		row, err := s.st.GetRun(r.Context(), id)
		if errors.Is(err, store.ErrNotFound) || (err == nil && row.Tenant != tenant) {
			return nil, errf(http.StatusNotFound, "model %q not found", id)
		}
		if err != nil {
			return nil, errf(http.StatusServiceUnavailable, "reading model %s: %v", id, err)
		}
		return runFromRow(row), nil
	}
	if !accessible {
		return s.runOf(tenant, id)
	}
	s.runs.mu.Lock()
	defer s.runs.mu.Unlock()
	s.ckpts.mu.Lock()
	defer s.ckpts.mu.Unlock()
	run := s.runs.m[id]
	if run == nil || (run.tenant != tenant && !s.indexCheckpoints().public[id]) {
		return nil, errf(http.StatusNotFound, "model %q not found", id)
	}
	return run, nil
}

// --- small request rules of the Tinker surface ---

// asBadRequest keeps the status of an error that has one (a missing checkpoint is a 404 on
// every path) and makes any other validation error a 400.
func asBadRequest(err error) error {
	if he, ok := err.(*httpError); ok {
		return he
	}
	return errf(http.StatusBadRequest, "%v", err)
}
