package gateway

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/skein-ai/skein/api"
)

// RequestIDHeader carries the id of one HTTP request: taken from the client when well-formed,
// else made here, and always echoed in the answer. It is not a future's request_id (the id of
// an async op in the Tinker API); log lines carry both where both exist.
const RequestIDHeader = "X-Request-Id"

// maxRequestIDLen bounds a client's request id: it goes into every log line of the request.
const maxRequestIDLen = 64

// requestInfo is what a request's handler learns for its log line (who, which future, what
// went wrong); the middleware owns it, handlers fill it through the note* functions.
type requestInfo struct {
	id, tenant, future string
	err                error
	caller             caller // who is asking, once authenticated (withCaller)
	authenticated      bool
	rec                logRecorder // its response's status; one allocation with the record
}

type requestInfoKey struct{}

func infoOf(r *http.Request) *requestInfo {
	info, _ := r.Context().Value(requestInfoKey{}).(*requestInfo)
	return info
}

// RequestID is the id of the request being served ("" outside the request log).
func RequestID(ctx context.Context) string {
	if info, _ := ctx.Value(requestInfoKey{}).(*requestInfo); info != nil {
		return info.id
	}
	return ""
}

// noteResult records what handle learned: the caller's tenant (a hash, never the key), the
// future a submit created, and the error the client was answered with.
func noteResult(r *http.Request, tenant string, v any, err error) {
	info := infoOf(r)
	if info == nil {
		return
	}
	if tenant != "" {
		info.tenant = tenant
	}
	if f, ok := v.(api.FutureResponse); ok { // a submit: the future it created
		info.future = f.RequestID
	}
	if err != nil {
		info.err = err
	}
}

// noteFuture records the future a request is about (retrieve_future's request_id).
func noteFuture(r *http.Request, id string) {
	if info := infoOf(r); info != nil && len(id) <= maxRequestIDLen {
		info.future = id
	}
}

// wellFormedRequestID accepts a short id of letters, digits and - _ . : only, so a client's id
// cannot forge log lines or bloat them.
func wellFormedRequestID(id string) bool {
	if id == "" || len(id) > maxRequestIDLen {
		return false
	}
	for _, c := range id {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_', c == '.', c == ':':
		default:
			return false
		}
	}
	return true
}

// logRecorder remembers the status of an answer for the request log.
type logRecorder struct {
	http.ResponseWriter
	status int
}

func (w *logRecorder) WriteHeader(status int) {
	if w.status == 0 {
		w.status = status
	}
	w.ResponseWriter.WriteHeader(status)
}

func (w *logRecorder) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection (write deadlines, flushes).
func (w *logRecorder) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// ServeHTTP implements http.Handler: every request gets a request id and one log line (method,
// path, status, duration, tenant hash, ids, error), never its API key or body.
func (s *Server) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	start := time.Now()
	id := r.Header.Get(RequestIDHeader)
	if !wellFormedRequestID(id) {
		id = newRequestID()
	}
	rw.Header()[RequestIDHeader] = []string{id} // canonical already
	info := &requestInfo{id: id}
	r = r.WithContext(context.WithValue(r.Context(), requestInfoKey{}, info))
	w := &info.rec
	w.ResponseWriter = rw
	if s.opts.Auth == AuthOpen && !s.openModeHostOK(r.Host) {
		writeError(w, http.StatusMisdirectedRequest, fmt.Sprintf("Host %q is not served: in open mode (no API keys) this server "+
			"answers only loopback names (localhost, 127.0.0.1, [::1]) and the host of --public-url, so a web page cannot "+
			"reach it through DNS rebinding; use one of those, or run with --auth keys", r.Host))
	} else {
		s.serveRecovered(w, r)
	}
	if w.status == 0 {
		w.status = http.StatusOK // nothing written: net/http answers 200
	}
	level := slog.LevelInfo
	if w.status >= 500 {
		level = slog.LevelError
	}
	if !s.log.Enabled(r.Context(), level) {
		return // nothing to build the line for (a discarding or higher-level logger)
	}
	attrs := make([]slog.Attr, 0, 8)
	attrs = append(attrs, slog.String("method", r.Method), slog.String("path", loggedPath(r)),
		slog.Int("status", w.status), slog.Duration("duration", time.Since(start)), slog.String("request_id", id))
	if info.tenant != "" {
		attrs = append(attrs, slog.String("tenant", info.tenant))
	}
	if info.future != "" {
		attrs = append(attrs, slog.String("future", info.future))
	}
	if info.err != nil {
		attrs = append(attrs, slog.String("err", info.err.Error()))
	}
	s.log.LogAttrs(r.Context(), level, "request", attrs...)
}

// newRequestID is "req-" and 16 random hex digits, in one allocation (it is made per request).
func newRequestID() string {
	var raw [8]byte
	_, _ = rand.Read(raw[:])
	var out [4 + 16]byte
	copy(out[:], "req-")
	hex.Encode(out[4:], raw[:])
	return string(out[:])
}

// maxLoggedPath bounds the path in a log line (a client chooses it).
const maxLoggedPath = 256

// loggedPath is the request's path, but a path that is itself a credential (a signed archive
// link) is logged as its route.
func loggedPath(r *http.Request) string {
	if strings.Contains(r.Pattern, "{token}") {
		return r.Pattern
	}
	if p := r.URL.Path; len(p) > maxLoggedPath {
		return p[:maxLoggedPath] + "…"
	}
	return r.URL.Path
}
