package gateway

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/store"
)

// Session trace export: a session's training and sampling requests as a timeline in the Trace
// Event format (JSON), which ui.perfetto.dev and chrome://tracing open. The trace is built from
// the usage ledger when downloaded, so it is always up to date and costs nothing to "export".

const (
	tracePrefix    = "trace/"
	traceLinkTTL   = time.Hour // as the SDK documents
	maxTraceEvents = 100000
)

// exportSessionTrace answers GET /api/v1/sessions/{id}/trace_export with a signed download URL
// (status "ready" at once: there is no job to wait for).
func (s *Server) exportSessionTrace(w http.ResponseWriter, r *http.Request, tenant string) (any, error) {
	sess, err := s.sessionOf(tenant, r.PathValue("id"))
	if err != nil {
		return nil, err
	}
	claim := tracePrefix + tenant + "/" + sess.id + "/" + strconv.FormatInt(sess.created.UnixMilli(), 10)
	expires := time.Now().Add(traceLinkTTL).UTC()
	public, err := s.publicBase(r) // never the Host header: see publicBase
	if err != nil {
		return nil, err
	}
	url := fmt.Sprintf("%s%straces/%s", public, v1, s.signArchive(archiveClaim{Path: claim, KeyID: callerOf(r).keyID}, expires))
	return api.TraceExportResponse{Status: "ready", URL: url}, nil
}

// traceEvent is one complete event ("ph":"X") of the Trace Event format; times in microseconds.
type traceEvent struct {
	Name string         `json:"name"`
	Cat  string         `json:"cat"`
	Ph   string         `json:"ph"`
	Ts   int64          `json:"ts"`
	Dur  int64          `json:"dur"`
	Pid  int            `json:"pid"`
	Tid  string         `json:"tid"`
	Args traceEventArgs `json:"args"`
}

// traceEventArgs are the details a trace viewer shows for one event.
type traceEventArgs struct {
	BaseModel  string `json:"base_model"`
	TinkerPath string `json:"tinker_path"`
	Tokens     int64  `json:"tokens"`
}

type traceFile struct {
	TraceEvents     []traceEvent `json:"traceEvents"`
	DisplayTimeUnit string       `json:"displayTimeUnit"`
}

// downloadTrace serves a session's trace for a valid signed token (no API key, as the SDK's CLI
// downloads it with a plain GET).
func (s *Server) downloadTrace(w http.ResponseWriter, r *http.Request, _ string) (any, error) {
	c, err := s.verifyArchive(r, r.PathValue("token"), time.Now())
	if err != nil {
		return nil, err
	}
	claim := c.Path
	parts := strings.Split(strings.TrimPrefix(claim, tracePrefix), "/")
	if !strings.HasPrefix(claim, tracePrefix) || len(parts) != 3 {
		return nil, errf(http.StatusForbidden, "not a trace download token")
	}
	tenant, sessionID := parts[0], parts[1]
	createdMS, err := strconv.ParseInt(parts[2], 10, 64)
	if err != nil {
		return nil, errf(http.StatusForbidden, "not a trace download token")
	}
	events, err := s.st.Events(r.Context(), store.EventUsage, tenant, time.UnixMilli(createdMS).Add(-time.Second), time.Now().Add(time.Minute), maxTraceEvents)
	if err != nil {
		return nil, err
	}
	out := traceFile{TraceEvents: []traceEvent{}, DisplayTimeUnit: "ms"}
	for _, e := range events {
		if e.SessionID != sessionID || e.Name == usagePrefill {
			continue // a sample's prefill and generation are one request: shown once
		}
		name, cat := e.Detail, "training"
		if e.Name == usageSample {
			name, cat = "Sample", "sampling"
		}
		out.TraceEvents = append(out.TraceEvents, traceEvent{Name: name, Cat: cat, Ph: "X", Ts: e.At.UnixMicro(),
			Dur: max(1, int64(e.Seconds*1e6)), Pid: 1, Tid: e.ModelID,
			Args: traceEventArgs{Tokens: int64(e.Amount), BaseModel: e.BaseModel, TinkerPath: e.TinkerPath}})
	}
	sort.SliceStable(out.TraceEvents, func(i, j int) bool { return out.TraceEvents[i].Ts < out.TraceEvents[j].Ts })
	b, err := json.Marshal(out)
	if err != nil {
		return nil, err
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Disposition", fmt.Sprintf("attachment; filename=%q", sessionID+".pftrace.json"))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(b)
	return nil, nil
}
