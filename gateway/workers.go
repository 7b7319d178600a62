package gateway

import (
	"crypto/subtle"
	"net/http"
	"time"

	"github.com/skein-ai/skein/replica"
	"github.com/skein-ai/skein/worker"
)

// workerState is a registered `skein worker` process.
type workerState struct {
	rep      *replica.Replica
	lastSeen time.Time
	reported worker.Heartbeat // the worker's own last report, shown by the admin API
}

// workerTimeout: a worker that misses three one-second heartbeats is dead.
const workerTimeout = 3 * time.Second

func (s *Server) checkWorkerToken(r *http.Request) error {
	if s.opts.WorkerToken == "" {
		return nil
	}
	if subtle.ConstantTimeCompare([]byte(r.Header.Get(worker.TokenHeader)), []byte(s.opts.WorkerToken)) != 1 {
		return errf(http.StatusUnauthorized, "bad or missing %s", worker.TokenHeader)
	}
	return nil
}

// registerWorker adds a worker's replica to the router (or replaces one of the same id).
func (s *Server) registerWorker(w http.ResponseWriter, r *http.Request, _ string) (any, error) {
	if err := s.checkWorkerToken(r); err != nil {
		return nil, err
	}
	var reg worker.Registration
	if err := s.decodeJSON(r, &reg); err != nil {
		return nil, err
	}
	if reg.ID == "" || reg.URL == "" || reg.BaseModel == "" || reg.Info.Config == nil {
		return nil, errf(http.StatusBadRequest, "registration needs id, url, base_model and info")
	}
	s.modelsMu.Lock()
	old := s.workers[reg.ID]
	delete(s.workers, reg.ID)
	s.modelsMu.Unlock()
	if old != nil {
		s.removeReplica(reg.ID) // a restarted worker holds nothing: forget its old placements
		old.rep.Close()
	}
	cl := worker.NewClient(reg.URL, s.opts.WorkerToken, reg.Info)
	// A worker that re-registers (this gateway restarted, or declared it dead) may still hold
	// adapters the router no longer counts: drop them, so its slots match the router's view.
	// Their state is on disk as of their last step; they reload on their next request.
	for _, id := range cl.AdapterIDs() {
		cl.DeleteAdapter(id)
	}
	rep := replica.New(reg.ID, reg.BaseModel, cl, reg.MaxLoras)
	s.modelsMu.Lock()
	s.workers[reg.ID] = &workerState{rep: rep, lastSeen: time.Now()}
	s.modelsMu.Unlock()
	s.addReplica(rep)
	s.log.Info("worker registered", "id", reg.ID, "url", reg.URL, "base_model", reg.BaseModel, "max_loras", rep.MaxLoras())
	return map[string]any{"id": reg.ID}, nil
}

// workerHeartbeat records that a worker is alive; an unknown id answers 404 so it re-registers.
func (s *Server) workerHeartbeat(w http.ResponseWriter, r *http.Request, _ string) (any, error) {
	if err := s.checkWorkerToken(r); err != nil {
		return nil, err
	}
	var hb worker.Heartbeat
	if err := s.decodeJSON(r, &hb); err != nil {
		return nil, err
	}
	s.modelsMu.Lock()
	ws := s.workers[hb.ID]
	if ws != nil {
		ws.lastSeen, ws.reported = time.Now(), hb
	}
	s.modelsMu.Unlock()
	if ws == nil {
		return nil, errf(http.StatusNotFound, "worker %q is not registered", hb.ID)
	}
	return map[string]any{"ok": true}, nil
}

// reapWorkers removes workers that stopped heartbeating: nothing more is routed to them, and
// their adapters are placed elsewhere on their next request, from their last saved state.
func (s *Server) reapWorkers(now time.Time) {
	s.modelsMu.Lock()
	var dead []*workerState
	for id, ws := range s.workers {
		if now.Sub(ws.lastSeen) > workerTimeout {
			dead = append(dead, ws)
			delete(s.workers, id)
		}
	}
	s.modelsMu.Unlock()
	for _, ws := range dead {
		s.log.Warn("worker missed its heartbeats: removed", "id", ws.rep.ID())
		s.removeReplica(ws.rep.ID())
		ws.rep.Close()
	}
}

// reported returns a worker's last heartbeat, if the replica is a worker.
func (s *Server) reported(id string) (worker.Heartbeat, bool) {
	s.modelsMu.RLock()
	defer s.modelsMu.RUnlock()
	ws := s.workers[id]
	if ws == nil {
		return worker.Heartbeat{}, false
	}
	return ws.reported, true
}
