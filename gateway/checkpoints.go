package gateway

// Checkpoints: lookup, listings, delete, publish, TTL and expiry.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"time"

	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/checkpoint"
	"github.com/skein-ai/skein/store"
)

// checkpointFor resolves a tinker path the tenant may read: its own, or a published one.
func (s *Server) checkpointFor(ctx context.Context, tenant, path string) (*ckptMeta, error) {
	p, err := checkpoint.Parse(path)
	if err != nil {
		return nil, errf(http.StatusBadRequest, "%v", err)
	}
	m, err := s.lookupCheckpoint(ctx, p.String())
	if err != nil {
		return nil, err
	}
	s.ckpts.mu.Lock()
	defer s.ckpts.mu.Unlock()
	if m == nil || (m.Owner != tenant && !m.Public) || m.expired(time.Now()) {
		return nil, errf(http.StatusNotFound, "checkpoint %s not found", p)
	}
	return m, nil
}

// lookupCheckpoint finds a checkpoint by its path: in this gateway's map, else, with several
// gateways on one store, in its row (another gateway saved it; nil if there is none). Such a
// meta serves this request and is not kept: the gateway that holds the checkpoint's run keeps
// it (changes to it are sent there, see checkpointScoped), and a delete there is seen at the
// next read.
func (s *Server) lookupCheckpoint(ctx context.Context, path string) (*ckptMeta, error) {
	s.ckpts.mu.Lock()
	m := s.ckpts.m[path]
	s.ckpts.mu.Unlock()
	if m != nil || !s.leases.on {
		return m, nil
	}
	row, err := s.st.GetCheckpoint(ctx, path)
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, errf(http.StatusServiceUnavailable, "reading checkpoint %s: %v", path, err)
	}
	if m = ckptFromRow(row); m == nil || m.Path != path {
		return nil, nil
	}
	m.elsewhere = true
	return m, nil
}

func (m *ckptMeta) expired(now time.Time) bool { return m.ExpiresAt != nil && now.After(*m.ExpiresAt) }

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

func (s *Server) checkpointsWhere(keep func(*ckptMeta) bool, others ...*ckptMeta) []*ckptMeta {
	s.ckpts.mu.Lock()
	defer s.ckpts.mu.Unlock()
	now := time.Now()
	var out []*ckptMeta
	for _, m := range s.ckpts.m {
		if !m.expired(now) && keep(m) {
			out = append(out, m)
		}
	}
	for _, m := range others { // other gateways' (otherCheckpoints)
		if !m.expired(now) && keep(m) {
			out = append(out, m)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Created.Before(out[j].Created) })
	return out
}

func (s *Server) listRunCheckpoints(w http.ResponseWriter, r *http.Request, tenant string) (any, error) {
	id := r.PathValue("id")
	if err := s.knowRun(r.Context(), tenant, id); err != nil {
		if e := (*httpError)(nil); errors.As(err, &e) && e.status == http.StatusNotFound {
			return nil, errf(http.StatusNotFound, "training run %q not found", id)
		}
		return nil, err
	}
	others, err := s.otherCheckpoints(r.Context(), tenant)
	if err != nil {
		return nil, err
	}
	rows := s.ckptRows(s.checkpointsWhere(func(m *ckptMeta) bool { return m.parsed.ModelID == id }, others...))
	return api.CheckpointsResponse{Checkpoints: rows}, nil
}

func (s *Server) listAllCheckpoints(w http.ResponseWriter, r *http.Request, tenant string) (any, error) {
	offset, limit, err := paging(r)
	if err != nil {
		return nil, err
	}
	others, err := s.otherCheckpoints(r.Context(), tenant)
	if err != nil {
		return nil, err
	}
	all := s.checkpointsWhere(func(m *ckptMeta) bool { return m.Owner == tenant }, others...)
	rows := s.ckptRows(page(all, offset, limit))
	return api.CheckpointsResponse{Checkpoints: rows, Cursor: &api.Cursor{Offset: offset, Limit: limit, TotalCount: len(all)}}, nil
}

// ownedCheckpoint resolves {id}/{kind}/{name} to a checkpoint the tenant owns.
func (s *Server) ownedCheckpoint(r *http.Request, tenant string) (*ckptMeta, error) {
	p := checkpoint.Path{ModelID: r.PathValue("id"), Kind: r.PathValue("kind"), Name: r.PathValue("name")}
	m, err := s.lookupCheckpoint(r.Context(), p.String())
	if err != nil {
		return nil, err
	}
	s.ckpts.mu.Lock()
	defer s.ckpts.mu.Unlock()
	if m == nil || m.Owner != tenant || m.expired(time.Now()) {
		return nil, errf(http.StatusNotFound, "checkpoint %s not found", p)
	}
	return m, nil
}

// ckptRows are the listing rows of checkpoints (read under s.ckpts.mu: publish and TTL change them).
func (s *Server) ckptRows(ms []*ckptMeta) []api.Checkpoint {
	s.ckpts.mu.Lock()
	defer s.ckpts.mu.Unlock()
	rows := []api.Checkpoint{}
	for _, m := range ms {
		rows = append(rows, s.ckptRow(m))
	}
	return rows
}

// updateMeta changes a registered checkpoint's metadata under s.ckpts.mu and stores it after;
// one deleted (or replaced by an overwrite) meanwhile is not found. One read from the store
// (lookupCheckpoint) has its row written.
func (s *Server) updateMeta(m *ckptMeta, change func(*ckptMeta)) error {
	s.ckpts.mu.Lock()
	if s.ckpts.m[m.Path] != m && !m.elsewhere {
		s.ckpts.mu.Unlock()
		return errf(http.StatusNotFound, "checkpoint %s not found", m.Path)
	}
	change(m)
	w := s.metaSnapshot(m)
	s.ckpts.mu.Unlock()
	return w.store()
}

func (s *Server) deleteCheckpoint(w http.ResponseWriter, r *http.Request, tenant string) (any, error) {
	m, err := s.ownedCheckpoint(r, tenant)
	if err != nil {
		return nil, err
	}
	s.removeCheckpoint(m)
	s.trail.record(tenant, "checkpoint.delete", m.parsed.ModelID, m.Path, "")
	return api.DeleteCheckpointResponse{Deleted: m.Path}, nil
}

func (s *Server) removeCheckpoint(m *ckptMeta) {
	s.ckpts.mu.Lock()
	if s.ckpts.m[m.Path] == m {
		delete(s.ckpts.m, m.Path)
	}
	// The delete is the row's newest write: a publish or TTL change that raced it is not stored after it.
	del := rowWrite{what: "checkpoint", ver: &m.ver, n: m.ver.bump(), put: func(ctx context.Context) error { return s.st.DeleteCheckpoint(ctx, m.Path) }}
	s.ckpts.mu.Unlock()
	s.persist(del)
	s.logErr("removing a deleted checkpoint's files", s.removeTree(s.ckptDir(m)))
	s.dropSamplerCopies(m.Path)
}

func (s *Server) publish(public bool) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request, tenant string) (any, error) {
		m, err := s.ownedCheckpoint(r, tenant)
		if err != nil {
			return nil, err
		}
		if err := s.updateMeta(m, func(m *ckptMeta) { m.Public = public }); err != nil {
			return nil, err
		}
		s.trail.record(tenant, map[bool]string{true: "checkpoint.publish", false: "checkpoint.unpublish"}[public], m.parsed.ModelID, m.Path, "")
		return api.PublishResponse{TinkerPath: m.Path, Public: public}, nil
	}
}

func (s *Server) setTTL(w http.ResponseWriter, r *http.Request, tenant string) (any, error) {
	m, err := s.ownedCheckpoint(r, tenant)
	if err != nil {
		return nil, err
	}
	var req api.SetTTLRequest
	if err := s.decodeJSON(r, &req); err != nil {
		return nil, err
	}
	if err := checkTTL(req.TTLSeconds); err != nil {
		return nil, errf(http.StatusBadRequest, "%v", err)
	}
	if err := s.updateMeta(m, func(m *ckptMeta) {
		if req.TTLSeconds == nil {
			m.ExpiresAt = nil
		} else {
			t := time.Now().UTC().Add(time.Duration(*req.TTLSeconds) * time.Second)
			m.ExpiresAt = &t
		}
	}); err != nil {
		return nil, err
	}
	s.trail.record(tenant, "checkpoint.set_ttl", m.parsed.ModelID, m.Path, "")
	return api.SetTTLResponse{TinkerPath: m.Path}, nil
}

func (s *Server) sweepCheckpoints(now time.Time) {
	var gone []*ckptMeta
	s.ckpts.mu.Lock()
	for _, m := range s.ckpts.m {
		if m.expired(now) {
			gone = append(gone, m)
		}
	}
	s.ckpts.mu.Unlock()
	for _, m := range gone {
		s.removeCheckpoint(m)
		s.trail.record(m.Owner, "checkpoint.expire", m.parsed.ModelID, m.Path, "")
	}
}

// MaxTTLSeconds bounds a checkpoint's ttl_seconds (100 years: as good as forever). Seconds past
// time.Duration's range (about 292 years) would wrap negative and expire a checkpoint the
// moment it was acknowledged.
const MaxTTLSeconds = 100 * 365 * 24 * 3600

// checkTTL validates an optional ttl_seconds (nil: the checkpoint never expires).
func checkTTL(ttl *int64) error {
	if ttl != nil && (*ttl <= 0 || *ttl > MaxTTLSeconds) {
		return fmt.Errorf("ttl_seconds must be in [1, %d] (or null), got %d", MaxTTLSeconds, *ttl)
	}
	return nil
}
