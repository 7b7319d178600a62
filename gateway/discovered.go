package gateway

// Discovered workers: a discovery source (Options.Discovery) says which workers are members;
// the gateway follows each one. Following means: describe it (its base model, slots and model
// info, over the authenticated worker API), join it as a replica (adopting the adapters it can
// keep, as a re-registration does), then fetch its status every second. The status check is the
// liveness check a registered worker's heartbeat is: a worker silent for WorkerTimeout is
// dropped by the same reaper, and joins again when it answers. A member the source reports not
// ready (failing its readiness probe, terminating), or whose status says it is draining, is
// unhealthy to the router: nothing new is placed there, its idle adapters are saved in full and
// moved at once (router.Drain), and busy ones move on their next request. A member the source deletes is removed.

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/skein-ai/skein/discovery"
	"github.com/skein-ai/skein/engine"
	"github.com/skein-ai/skein/worker"
)

// discoveryPoll is how often a followed worker's status is fetched (the heartbeat's period).
const discoveryPoll = time.Second

type follower struct {
	cancel context.CancelFunc
	ready  atomic.Bool
	url    string
	done   chan struct{}
}

// followers is the Notifier the discovery source calls.
type followers struct {
	s  *Server
	mu sync.Mutex
	m  map[string]*follower // by discovery endpoint id
}

func (s *Server) startDiscovery(d discovery.Discovery) {
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-s.handedOver; cancel() }() // its last ops still need the workers
	f := &followers{s: s, m: map[string]*follower{}}
	go func() {
		if err := d.Start(ctx, f); err != nil && ctx.Err() == nil {
			s.log.Error("worker discovery stopped", "err", err)
		}
	}()
}

func (f *followers) Upsert(ep discovery.Endpoint) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if old := f.m[ep.ID]; old != nil {
		if old.url == ep.URL {
			old.ready.Store(ep.Ready)
			return
		}
		old.cancel() // a new address: a new worker behind the same name
		delete(f.m, ep.ID)
	}
	ctx, cancel := context.WithCancel(context.Background())
	fl := &follower{cancel: cancel, url: ep.URL, done: make(chan struct{})}
	fl.ready.Store(ep.Ready)
	f.m[ep.ID] = fl
	go func() { <-f.s.handedOver; cancel() }() // a stopping gateway's last ops still need it
	go func() {
		defer close(fl.done)
		f.s.follow(ctx, ep, fl)
	}()
}

func (f *followers) Delete(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if fl := f.m[id]; fl != nil {
		fl.cancel()
		delete(f.m, id)
	}
}

// follow joins one discovered worker and checks it every second until ctx ends (the source
// deleted it, or the gateway closes); then it removes the worker.
func (s *Server) follow(ctx context.Context, ep discovery.Endpoint, fl *follower) {
	var mine *workerState
	var cl *worker.Client
	defer func() {
		if mine != nil {
			s.forgetWorker(mine, "worker left discovery: removed")
		}
	}()
	t := time.NewTicker(discoveryPoll)
	defer t.Stop()
	for {
		if mine != nil && !s.stillMine(mine) {
			mine = nil // reaped or dropped: join again once it answers
		}
		if mine == nil {
			mine, cl = s.joinDiscovered(ctx, ep)
		}
		if mine != nil {
			s.checkDiscovered(ctx, cl, mine, fl.ready.Load())
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// joinDiscovered describes the worker and joins it; nil when it cannot be (yet).
func (s *Server) joinDiscovered(ctx context.Context, ep discovery.Endpoint) (*workerState, *worker.Client) {
	cl := s.newWorkerClient(ep.URL, engine.ModelInfo{})
	dctx, cancel := context.WithTimeout(ctx, s.opts.WorkerTimeout)
	defer cancel()
	reg, err := cl.Describe(dctx, ep.ID) // the id is made below, from the base model it serves
	if err != nil {
		s.log.Debug("discovered worker not answering yet", "endpoint", ep.ID, "url", ep.URL, "err", err)
		return nil, nil
	}
	reg.ID = worker.ID(reg.BaseModel, ep.ID)
	mine := &workerState{secret: randomHex(16), lastSeen: time.Now(), addr: workerAddr(ep.URL), discovered: true, instance: reg.Instance}
	s.workersMu.Lock()
	s.modelsMu.Lock()
	old := s.workers[reg.ID]
	taken := (old != nil && s.workerLive(old)) || (old == nil && s.hasReplicaLocked(reg.ID))
	for id, ws := range s.workers {
		if id != reg.ID && ws.addr == mine.addr && s.workerLive(ws) {
			taken = true // registered by itself under another id: that registration stands
		}
		if id != reg.ID && ws.instance == mine.instance && s.workerLive(ws) {
			taken = true // the same worker at another address (dual stack): one worker, one replica
		}
	}
	if !taken {
		s.workers[reg.ID] = mine
	}
	s.modelsMu.Unlock()
	if old != nil && !taken {
		s.removeReplica(reg.ID)
		old.dropClient()
		go old.rep.Close()
	}
	s.workersMu.Unlock()
	if taken {
		return nil, nil
	}
	s.joinWorker(cl, reg, mine)
	return mine, cl
}

// checkDiscovered is the liveness check of a discovered worker: its status refreshes its
// last-seen time (the reaper drops it after WorkerTimeout without one) and its health follows
// the source's readiness and its own draining flag.
func (s *Server) checkDiscovered(ctx context.Context, cl *worker.Client, mine *workerState, ready bool) {
	sctx, cancel := context.WithTimeout(ctx, s.opts.WorkerTimeout)
	defer cancel()
	hb, err := cl.Status(sctx)
	if err != nil {
		return
	}
	s.modelsMu.Lock()
	leaving := false
	if mine.rep != nil {
		hb.ID = mine.rep.ID()
		mine.lastSeen, mine.reported = time.Now(), hb
		healthy := ready && !hb.Draining
		leaving = !healthy && mine.rep.Healthy()
		mine.rep.SetHealthy(healthy)
	}
	s.modelsMu.Unlock()
	if leaving {
		go s.drainReplica(mine.rep.ID())
	}
}

// drainReplica moves a leaving worker's idle adapters away now, each saved in full (its
// unstepped gradients too) while the worker still answers; busy ones move after their op.
func (s *Server) drainReplica(id string) {
	if n := s.router.Drain(context.Background(), id); n > 0 {
		s.log.Info("drained a leaving worker's adapters", "id", id, "adapters", n)
	}
}

// stillMine reports whether a joined worker's registration is still the one in s.workers.
func (s *Server) stillMine(mine *workerState) bool {
	s.modelsMu.RLock()
	defer s.modelsMu.RUnlock()
	return mine.rep != nil && s.workers[mine.rep.ID()] == mine
}

// forgetWorker removes a worker's registration if it is still mine.
func (s *Server) forgetWorker(mine *workerState, why string) {
	if mine.rep == nil {
		return
	}
	id := mine.rep.ID()
	s.workersMu.Lock()
	s.modelsMu.Lock()
	ok := s.workers[id] == mine
	if ok {
		delete(s.workers, id)
	}
	s.modelsMu.Unlock()
	if ok {
		s.log.Info(why, "id", id)
		s.removeReplica(id)
	}
	s.workersMu.Unlock()
	if ok {
		go mine.rep.Close()
	}
}
