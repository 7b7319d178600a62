package gateway

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/store"
)

// The audit log: who (the tenant) did what to which run, checkpoint, session or key, kept in the
// state store (so every gateway on a shared store sees one log) for AuditRetention.

// AuditRetention is how long audit entries and usage records are kept.
const AuditRetention = 90 * 24 * time.Hour

// maxAuditEntries bounds one page of the answer (and is the page of a request naming none).
const maxAuditEntries = 10000

// Each tenant may write AuditBurst routine audit entries at once, then one every AuditRefill;
// past that its entries are counted, not written, and the count becomes one "audit.suppressed"
// row (before the tenant's next recorded entry, when the log is read, or at the next sweep).
// Without it ten thousand cheap calls (a checkpoint's ttl set over and over) filled a day of
// the log. Security-relevant events are never counted away (auditAlways).
const (
	AuditBurst  = 100
	AuditRefill = 10 * time.Second
)

// auditAlways are the events always written, whatever the tenant's rate: who made and revoked
// keys, and what became of checkpoints (saved, deleted, made visible to others or not, expired).
var auditAlways = map[string]bool{"api_key.create": true, "api_key.revoke": true, "checkpoint.save": true,
	"checkpoint.delete": true, "checkpoint.publish": true, "checkpoint.unpublish": true, "checkpoint.expire": true}

// auditLimiter is a token bucket per tenant, with what it held back. Per gateway: with several
// gateways a tenant gets a bucket on each, which still bounds it.
type auditLimiter struct {
	mu      sync.Mutex
	tenants map[string]*auditBucket
	last    time.Time // the newest entry's time (stamp)
}

// stamp is the time of a new entry: now, or a millisecond (the store's resolution) after the
// previous one, so that one gateway's entries never tie and read back in the order they
// happened (ties from different gateways are ordered by their columns).
func (l *auditLimiter) stamp(now time.Time) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	now = now.UTC().Truncate(time.Millisecond)
	if !now.After(l.last) {
		now = l.last.Add(time.Millisecond)
	}
	l.last = now
	return now
}

type auditBucket struct {
	tokens     float64
	last       time.Time
	suppressed map[string]int // event name -> entries not written since the last flush
}

// allow takes a token for one of tenant's routine entries, or counts the entry as suppressed.
func (l *auditLimiter) allow(tenant, event string, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.tenants == nil {
		l.tenants = map[string]*auditBucket{}
	}
	b := l.tenants[tenant]
	if b == nil {
		b = &auditBucket{tokens: AuditBurst, last: now}
		l.tenants[tenant] = b
	}
	b.refill(now)
	if b.tokens >= 1 {
		b.tokens--
		return true
	}
	if b.suppressed == nil {
		b.suppressed = map[string]int{}
	}
	b.suppressed[event]++
	return false
}

func (b *auditBucket) refill(now time.Time) {
	if d := now.Sub(b.last); d > 0 {
		b.tokens = min(AuditBurst, b.tokens+float64(d)/float64(AuditRefill))
		b.last = now
	}
}

// take returns and clears what was held back, of one tenant or of all (""), and forgets the
// buckets that are full again, so the map holds only tenants active lately.
func (l *auditLimiter) take(tenant string, now time.Time) map[string]map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string]map[string]int{}
	for t, b := range l.tenants {
		if tenant != "" && t != tenant {
			continue
		}
		if len(b.suppressed) > 0 {
			out[t], b.suppressed = b.suppressed, nil
		}
		if b.refill(now); b.tokens >= AuditBurst {
			delete(l.tenants, t)
		}
	}
	return out
}

// eventRows is what the audit trail reads and writes of the store.
type eventRows interface {
	AddEvent(ctx context.Context, e store.Event) error
	EventPage(ctx context.Context, q store.EventQuery) ([]store.Event, error)
	SweepEvents(ctx context.Context, before time.Time) (int, error)
}

// auditTrail is the audit log, a resource of its own (issue 38 item 6): it records events under
// each tenant's rate, answers GET audit and sweeps old entries. It needs the event rows, a log,
// and whose entries a caller may read (the keyring's scope), nothing else of the server.
type auditTrail struct {
	events eventRows
	rate   auditLimiter
	log    *slog.Logger
	scope  func(r *http.Request, tenant string) string
}

func (t *auditTrail) logErr(what string, err error) {
	if err != nil {
		t.log.Error("persisting state", "what", what, "err", err)
	}
}

// flushSuppressed writes one "audit.suppressed" row per tenant that had entries held back; the
// store writes happen outside the limiter's lock.
func (t *auditTrail) flushSuppressed(tenant string, now time.Time) {
	for who, byName := range t.rate.take(tenant, now) {
		names := make([]string, 0, len(byName))
		total := 0
		for name, n := range byName {
			names = append(names, fmt.Sprintf("%s ×%d", name, n))
			total += n
		}
		sort.Strings(names)
		t.logErr("audit", t.events.AddEvent(context.Background(), store.Event{Tenant: who, At: t.rate.stamp(now), Kind: store.EventAudit,
			Name: "audit.suppressed", Detail: fmt.Sprintf("%d entries not written, over the audit rate of %d at once and one per %s: %s",
				total, AuditBurst, AuditRefill, strings.Join(names, ", "))}))
	}
}

// record records an event; a failure to record is logged, never the caller's error.
func (t *auditTrail) record(tenant, event, modelID, tinkerPath, purpose string) {
	now := time.Now()
	if !auditAlways[event] && !t.rate.allow(tenant, event, now) {
		return
	}
	t.flushSuppressed(tenant, now) // the count of what was held back comes before this entry
	t.logErr("audit", t.events.AddEvent(context.Background(), store.Event{Tenant: tenant, At: t.rate.stamp(now), Kind: store.EventAudit,
		Name: event, ModelID: modelID, TinkerPath: tinkerPath, Detail: purpose}))
}

// getAuditLog answers GET /api/v1/audit?event_type=all|checkpoints&day=YYYY-MM-DD: one UTC day
// (today by default) of the caller's events, oldest first; an admin key sees every tenant's.
// skein pages it: limit= (1 to 10,000, the default) entries a page, and next_cursor, when the
// answer has one, is the cursor= of the next page; event= (a name or its prefix) and, for an
// admin, tenant= filter it.
func (t *auditTrail) getAuditLog(w http.ResponseWriter, r *http.Request, tenant string) (any, error) {
	q := r.URL.Query()
	prefix := ""
	switch v := q.Get("event_type"); v {
	case "", "all":
	case "checkpoints":
		prefix = "checkpoint."
	default:
		return nil, errf(http.StatusBadRequest, "event_type must be \"all\" or \"checkpoints\", got %q", v)
	}
	if v := q.Get("event"); v != "" {
		if prefix != "" || len(v) > 64 || strings.Trim(v, "abcdefghijklmnopqrstuvwxyz._") != "" {
			return nil, errf(http.StatusBadRequest, "event must be an event name or its prefix (a-z, '.', '_', at most 64), without event_type, got %q", v)
		}
		prefix = v
	}
	day := time.Now().UTC().Truncate(24 * time.Hour)
	if v := q.Get("day"); v != "" {
		d, err := time.Parse(time.DateOnly, v)
		if err != nil {
			return nil, errf(http.StatusBadRequest, "day must be a date as YYYY-MM-DD, got %q", v)
		}
		day = d
	}
	limit := maxAuditEntries
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxAuditEntries {
			return nil, errf(http.StatusBadRequest, "limit must be 1 to %d, got %q", maxAuditEntries, v)
		}
		limit = n
	}
	who := t.scope(r, tenant)
	if v := q.Get("tenant"); v != "" {
		if who != "" && v != who {
			return nil, errf(http.StatusForbidden, "only an admin key reads another tenant's audit log")
		}
		who = v
	}
	eq := store.EventQuery{Kind: store.EventAudit, Tenant: who, NamePrefix: prefix, From: day, To: day.Add(24 * time.Hour), Limit: limit + 1}
	if v := q.Get("cursor"); v != "" {
		at, skip, err := parseAuditCursor(v)
		if err != nil {
			return nil, err
		}
		if at.After(eq.From) {
			eq.From = at
		}
		if at.Equal(eq.From) {
			eq.Skip = skip
		}
	}
	t.flushSuppressed(who, time.Now()) // what was held back is counted in what is read
	events, err := t.events.EventPage(r.Context(), eq)
	if err != nil {
		return nil, err
	}
	out := api.AuditLogResponse{Entries: []api.AuditLogEntry{}}
	if len(events) > limit {
		events = events[:limit]
		last, skip := events[limit-1].At, 0
		for _, e := range events {
			if e.At.Equal(last) {
				skip++
			}
		}
		if last.Equal(eq.From) { // the whole page at the cursor's millisecond
			skip += eq.Skip
		}
		out.NextCursor = fmt.Sprintf("%d.%d", last.UnixMilli(), skip)
	}
	for _, e := range events {
		out.Entries = append(out.Entries, api.AuditLogEntry{Timestamp: e.At.Format(time.RFC3339Nano), Event: e.Name,
			ModelID: e.ModelID, TinkerPath: e.TinkerPath, Purpose: e.Detail, Actor: e.Tenant})
	}
	return out, nil
}

// parseAuditCursor reads a next_cursor: the millisecond of a page's last entry and how many
// entries of that millisecond it held.
func parseAuditCursor(v string) (time.Time, int, error) {
	a, b, ok := strings.Cut(v, ".")
	at, err1 := strconv.ParseInt(a, 10, 64)
	skip, err2 := strconv.Atoi(b)
	if !ok || err1 != nil || err2 != nil || at < 0 || skip < 0 || at > 1<<53 {
		return time.Time{}, 0, errf(http.StatusBadRequest, "cursor must be a next_cursor of an earlier answer, got %q", v)
	}
	return time.UnixMilli(at).UTC(), skip, nil
}

// sweepEvents drops audit entries and usage records past their retention.
func (t *auditTrail) sweepEvents(now time.Time) {
	_, err := t.events.SweepEvents(context.Background(), now.Add(-AuditRetention))
	t.logErr("events sweep", err)
}
