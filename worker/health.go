package worker

// Probes and draining. /healthz and /readyz answer without the cluster token (the kubelet has
// none) and say nothing about tenants: "ok", or why not ready. /healthz is the liveness probe
// (the process serves HTTP); /readyz is the readiness probe: ready once the model is loaded (the
// server exists only then) and until Drain, which a worker calls on SIGTERM so that discovery
// (a not-ready endpoint) and the gateway's status check stop sending it new adapters while the
// calls it has run to their end.

import (
	"context"
	"net/http"
	"time"
)

const (
	healthPath = "/healthz"
	readyPath  = "/readyz"
)

// serveProbe answers the probe paths; it reports whether path was one.
func (s *Server) serveProbe(w http.ResponseWriter, r *http.Request) bool {
	if r.URL.Path != healthPath && r.URL.Path != readyPath {
		return false
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.WriteHeader(http.StatusMethodNotAllowed)
		return true
	}
	if r.URL.Path == readyPath && s.draining.Load() {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte("draining\n"))
		return true
	}
	_, _ = w.Write([]byte("ok\n"))
	return true
}

// Drain marks the worker as leaving: /readyz fails and its status says draining, so the gateway
// places nothing new on it. Calls keep being served (the gateway saves and moves adapters
// through them).
func (s *Server) Drain() { s.draining.Store(true) }

// Draining reports whether Drain was called.
func (s *Server) Draining() bool { return s.draining.Load() }

// Idle waits until no call is in flight or ctx ends; it reports whether the worker went idle.
func (s *Server) Idle(ctx context.Context) bool {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for s.inflight.Load() > 0 {
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
	}
	return true
}
