package gateway

import (
	"context"
	"net/http"
	"strings"
	"time"

	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/store"
)

// The audit log: who (the tenant) did what to which run, checkpoint, session or key, kept in the
// state store (so every gateway on a shared store sees one log) for AuditRetention.

// AuditRetention is how long audit entries and usage records are kept.
const AuditRetention = 90 * 24 * time.Hour

// maxAuditEntries bounds one day's answer.
const maxAuditEntries = 10000

// audit records an event; a failure to record is logged, never the caller's error.
func (s *Server) audit(tenant, event, modelID, tinkerPath, purpose string) {
	s.logErr("audit", s.st.AddEvent(context.Background(), store.Event{Tenant: tenant, At: time.Now().UTC(), Kind: store.EventAudit,
		Name: event, ModelID: modelID, TinkerPath: tinkerPath, Detail: purpose}))
}

// getAuditLog answers GET /api/v1/audit?event_type=all|checkpoints&day=YYYY-MM-DD: one UTC day
// (today by default) of the caller's events, oldest first; an admin key sees every tenant's.
func (s *Server) getAuditLog(w http.ResponseWriter, r *http.Request, tenant string) (any, error) {
	q := r.URL.Query()
	prefix := ""
	switch v := q.Get("event_type"); v {
	case "", "all":
	case "checkpoints":
		prefix = "checkpoint."
	default:
		return nil, errf(http.StatusBadRequest, "event_type must be \"all\" or \"checkpoints\", got %q", v)
	}
	day := time.Now().UTC().Truncate(24 * time.Hour)
	if v := q.Get("day"); v != "" {
		d, err := time.Parse(time.DateOnly, v)
		if err != nil {
			return nil, errf(http.StatusBadRequest, "day must be a date as YYYY-MM-DD, got %q", v)
		}
		day = d
	}
	who := s.tenantScope(r, tenant)
	events, err := s.st.Events(r.Context(), store.EventAudit, who, day, day.Add(24*time.Hour), maxAuditEntries)
	if err != nil {
		return nil, err
	}
	out := api.AuditLogResponse{Entries: []api.AuditLogEntry{}}
	for _, e := range events {
		if !strings.HasPrefix(e.Name, prefix) {
			continue
		}
		out.Entries = append(out.Entries, api.AuditLogEntry{Timestamp: e.At.Format(time.RFC3339Nano), Event: e.Name,
			ModelID: e.ModelID, TinkerPath: e.TinkerPath, Purpose: e.Detail, Actor: e.Tenant})
	}
	return out, nil
}

// tenantScope is whose events a caller reads: its own, or everyone's ("") for an admin key in
// keys mode (in open mode every caller counts as admin for the fleet endpoints, but tenants
// still never read each other's logs).
func (s *Server) tenantScope(r *http.Request, tenant string) string {
	if s.opts.Auth == AuthKeys && callerOf(r).admin {
		return ""
	}
	return tenant
}

// sweepEvents drops audit entries and usage records past their retention.
func (s *Server) sweepEvents(now time.Time) {
	_, err := s.st.SweepEvents(context.Background(), now.Add(-AuditRetention))
	s.logErr("events sweep", err)
}
