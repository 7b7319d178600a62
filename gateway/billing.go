package gateway

import (
	"context"
	"net/http"
	"sort"
	"time"

	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/engine"
	"github.com/skein-ai/skein/store"
)

// Usage accounting for a self-hosted service: every training pass, sample and checkpoint is
// recorded in the state store with its tenant, session, base model, token count and engine
// time; GET /api/v1/billing/usage/events sums them into hourly buckets in the SDK's shape.

// Usage record names, as the SDK's billing event types.
const (
	usageTraining = "training"
	usagePrefill  = "sampling_prefill"
	// usagePrefillCached is a prompt's positions served from the prefix cache: answered as
	// sampling_prefill with cached true (the SDK's one type for both).
	usagePrefillCached = "sampling_prefill_cached"
	usageSample        = "sampling_sample"
	usageCkpt          = "checkpoint"
	usageStorage       = "storage"
)

const (
	maxBillingWindow = 14 * 24 * time.Hour // as the SDK documents
	maxBillingRows   = 50000
)

func (s *Server) recordUsage(e store.Event) {
	e.Kind = store.EventUsage
	s.logErr("usage", s.st.AddEvent(context.Background(), e))
}

// recordTraining records a forward or forward_backward pass: its tokens and engine time.
func (s *Server) recordTraining(run *trainingRun, kind string, data []engine.Datum, start time.Time) {
	n := 0
	for _, d := range data {
		n += len(d.Tokens)
	}
	s.recordUsage(store.Event{Tenant: run.tenant, At: start.UTC(), Name: usageTraining, ModelID: run.id, SessionID: run.session,
		BaseModel: run.baseModel, Detail: kind, Amount: float64(n), Seconds: time.Since(start).Seconds()})
}

// recordSampling records one sample request of a batch: its prompt (the positions computed, and
// apart those served from the prefix cache), its generated tokens, and its share of the batch's
// engine time.
func (s *Server) recordSampling(smp *sampler, req engine.SampleRequest, res *engine.SampleResult, start time.Time, seconds float64) {
	generated := 0
	for _, q := range res.Sequences {
		generated += len(q.Tokens)
	}
	base := store.Event{Tenant: smp.tenant, At: start.UTC(), SessionID: smp.session, BaseModel: smp.baseModel, ModelID: smp.id, Detail: "Sample"}
	cached := min(max(res.CachedTokens, 0), len(req.Prompt))
	pre := base
	pre.Name, pre.Amount = usagePrefill, float64(len(req.Prompt)-cached)
	s.recordUsage(pre)
	if cached > 0 {
		hit := base
		hit.Name, hit.Amount = usagePrefillCached, float64(cached)
		s.recordUsage(hit)
	}
	gen := base
	gen.Name, gen.Amount, gen.Seconds = usageSample, float64(generated), seconds
	s.recordUsage(gen)
}

// recordCheckpoint records a saved checkpoint (its size is in the storage buckets).
func (s *Server) recordCheckpoint(run *trainingRun, path string, start time.Time) {
	s.recordUsage(store.Event{Tenant: run.tenant, At: start.UTC(), Name: usageCkpt, ModelID: run.id, TinkerPath: path,
		SessionID: run.session, BaseModel: run.baseModel, Detail: "SaveWeights", Amount: 1, Seconds: time.Since(start).Seconds()})
}

// getBillingUsage answers GET /api/v1/billing/usage/events?starting_on=…&ending_before=…: the
// caller's usage (every tenant's for an admin key in keys mode) in hourly buckets.
func (s *Server) getBillingUsage(w http.ResponseWriter, r *http.Request, tenant string) (any, error) {
	from, to, err := billingWindow(r, time.Now())
	if err != nil {
		return nil, err
	}
	who := s.auth.scope(r, tenant)
	buckets, err := s.st.UsageBuckets(r.Context(), who, from, to, maxBillingRows)
	if err != nil {
		return nil, err
	}
	out := api.BillingUsageResponse{Data: []api.BillingUsageEvent{}, Sessions: map[string]api.BillingUsageSession{}}
	projects := map[string]string{}
	s.sessions.mu.Lock()
	defer s.sessions.mu.Unlock()
	s.runs.mu.Lock()
	defer s.runs.mu.Unlock()
	s.ckpts.mu.Lock()
	defer s.ckpts.mu.Unlock()
	for _, b := range buckets {
		ev := api.BillingUsageEvent{BucketStart: b.Hour.Format(time.RFC3339), BucketEnd: b.Hour.Add(time.Hour).Format(time.RFC3339),
			UserID: strPtr(b.Tenant), BaseModel: strPtr(b.BaseModel), SessionID: strPtr(b.SessionID)}
		n := int64(b.Amount)
		switch b.Name {
		case usageTraining, usageSample:
			ev.EventInfo = api.BillingEventInfo{Type: b.Name, TokenCount: &n}
		case usagePrefill, usagePrefillCached:
			cached := b.Name == usagePrefillCached // served from the prefix cache, not computed
			ev.EventInfo = api.BillingEventInfo{Type: usagePrefill, TokenCount: &n, Cached: &cached}
		case usageCkpt:
			ev.EventInfo = api.BillingEventInfo{Type: b.Name, Count: &n}
		default:
			continue
		}
		if b.Seconds > 0 {
			sec := b.Seconds
			ev.ComputeSeconds = &sec
		}
		if b.SessionID != "" {
			project, seen := projects[b.SessionID]
			if !seen { // once per session: finding a closed session's project scans the runs
				project = s.projectOfSession(b.SessionID)
				projects[b.SessionID] = project
				out.Sessions[b.SessionID] = s.billingSession(b.SessionID)
			}
			ev.ProjectID = strPtr(project)
		}
		out.Data = append(out.Data, ev)
	}
	out.Data = append(out.Data, s.storageBuckets(who, from, to)...)
	// Ordered by bucket (RFC 3339 UTC sorts as text), then as the store ordered them.
	sort.SliceStable(out.Data, func(i, j int) bool { return out.Data[i].BucketStart < out.Data[j].BucketStart })
	return out, nil
}

// billingWindow reads and checks the window: whole UTC hours, start before end, at most 14
// days, not starting in the future.
func billingWindow(r *http.Request, now time.Time) (from, to time.Time, err error) {
	parse := func(name string) (time.Time, error) {
		v := r.URL.Query().Get(name)
		if v == "" {
			return time.Time{}, errf(http.StatusBadRequest, "%s is required (an RFC 3339 time on a UTC hour)", name)
		}
		t, err := time.Parse(time.RFC3339, v)
		if err != nil {
			return time.Time{}, errf(http.StatusBadRequest, "%s: %q is not an RFC 3339 time", name, v)
		}
		t = t.UTC()
		if !t.Equal(t.Truncate(time.Hour)) {
			return time.Time{}, errf(http.StatusBadRequest, "%s must be on a UTC hour boundary, got %s", name, v)
		}
		return t, nil
	}
	if from, err = parse("starting_on"); err != nil {
		return
	}
	if to, err = parse("ending_before"); err != nil {
		return
	}
	switch {
	case !to.After(from):
		err = errf(http.StatusBadRequest, "ending_before must be after starting_on")
	case to.Sub(from) > maxBillingWindow:
		err = errf(http.StatusBadRequest, "the window is %s, at most 14 days", to.Sub(from))
	case from.After(now):
		err = errf(http.StatusBadRequest, "the window starts in the future")
	}
	return
}

// storageBuckets are the gigabyte-hours of the checkpoints that exist now, over the hours of the
// window they existed in (deleted checkpoints' storage is not kept). Call with s.ckpts.mu held.
func (s *Server) storageBuckets(who string, from, to time.Time) []api.BillingUsageEvent {
	type key struct {
		hour      time.Time
		tenant    string
		baseModel string
	}
	sums := map[key]float64{}
	var keys []key
	now := time.Now()
	for _, m := range s.ckpts.m {
		if who != "" && m.Owner != who {
			continue
		}
		end := now
		if m.ExpiresAt != nil && m.ExpiresAt.Before(end) {
			end = *m.ExpiresAt
		}
		lo, hi := maxTime(m.Created, from), minTime(end, to)
		for h := lo.Truncate(time.Hour); h.Before(hi); h = h.Add(time.Hour) {
			overlap := minTime(hi, h.Add(time.Hour)).Sub(maxTime(lo, h)).Hours()
			if overlap <= 0 {
				continue
			}
			k := key{h, m.Owner, m.BaseModel}
			if _, ok := sums[k]; !ok {
				keys = append(keys, k)
			}
			sums[k] += float64(m.Size) / 1e9 * overlap
		}
	}
	var out []api.BillingUsageEvent
	for _, k := range keys {
		gbh := sums[k]
		out = append(out, api.BillingUsageEvent{BucketStart: k.hour.Format(time.RFC3339), BucketEnd: k.hour.Add(time.Hour).Format(time.RFC3339),
			UserID: strPtr(k.tenant), BaseModel: strPtr(k.baseModel), EventInfo: api.BillingEventInfo{Type: usageStorage, GigabyteHours: &gbh}})
	}
	return out
}

// projectOfSession is the project a session is in now (its runs keep it once it closes).
// Call with s.sessions.mu and s.runs.mu held.
func (s *Server) projectOfSession(id string) string {
	if sess := s.sessions.m[id]; sess != nil {
		return sess.project
	}
	for _, run := range s.runs.m {
		if run.session == id {
			return run.project
		}
	}
	return ""
}

// billingSession is a session's user metadata as strings. Call with s.sessions.mu held.
func (s *Server) billingSession(id string) api.BillingUsageSession {
	sess := s.sessions.m[id]
	if sess == nil || len(sess.metadata) == 0 {
		return api.BillingUsageSession{}
	}
	md := map[string]string{}
	for k, v := range sess.metadata {
		if str, ok := v.(string); ok {
			md[k] = str
		}
	}
	return api.BillingUsageSession{UserMetadata: md}
}

func strPtr(v string) *string {
	if v == "" {
		return nil
	}
	return &v
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
