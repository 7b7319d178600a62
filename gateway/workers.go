package gateway

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/engine"
	"github.com/skein-ai/skein/replica"
	"github.com/skein-ai/skein/store"
	"github.com/skein-ai/skein/worker"
)

// workerState is a registered `skein worker` process.
type workerState struct {
	rep      *replica.Replica // nil while its registration is being set up
	secret   string           // from the registration; every heartbeat must carry it
	addr     string           // the worker's URL, as workerAddr normalises it
	lastSeen time.Time
	reported worker.Heartbeat // the worker's own last report, shown by the admin API
	// discovered: found by Options.Discovery and checked by the gateway; it sends no heartbeats.
	discovered bool
	// instance is the worker process's id, from the gateway's handshake with it: one instance
	// is one replica, whatever the addresses it is found at.
	instance string
	// cl is the worker's client (set with rep): dropping the worker drops it, ending its calls.
	cl *worker.Client
}

// maxWorkerSessions bounds the proven sessions of registering workers the gateway keeps (one
// per worker, more while they shake hands again); past it the least recently used is forgotten.
const maxWorkerSessions = 8192

// workerHandshakeTimeout bounds the gateway's handshake with a registering worker.
const workerHandshakeTimeout = 10 * time.Second

// newWorkerClient is a client of the worker at url, shaking hands as this gateway.
func (s *Server) newWorkerClient(url string, info engine.ModelInfo) *worker.Client {
	cl := worker.NewClient(url, s.opts.WorkerToken, info)
	cl.GatewayID = s.gatewayID
	return cl
}

// dropClient ends a dead worker's calls in flight (a frozen worker must not hold its ops).
func (ws *workerState) dropClient() {
	if ws.cl != nil {
		ws.cl.Drop()
	}
}

// workerTimeout: a worker that misses three one-second heartbeats is dead.
const workerTimeout = 3 * time.Second

// checkWorkerOptions: a server that accepts workers always has a cluster token.
func checkWorkerOptions(opts *Options) error {
	if opts.AcceptWorkers && opts.WorkerToken == "" {
		return errors.New("gateway: accepting workers needs a worker token")
	}
	if opts.Discovery != nil && opts.WorkerToken == "" {
		return errors.New("gateway: discovering workers needs a worker token (discovered workers are called with it)")
	}
	if opts.WorkerTimeout == 0 {
		opts.WorkerTimeout = workerTimeout
	}
	return nil
}

// workerHello answers a registering worker's handshake: a nonce and this gateway's proof that it
// holds the token, so the worker signs its registration and heartbeats without sending the token.
func (s *Server) workerHello(w http.ResponseWriter, r *http.Request, _ string) (any, error) {
	if !s.opts.AcceptWorkers || s.opts.WorkerToken == "" {
		return nil, errf(http.StatusForbidden, "this server accepts no workers (start it with --accept-workers, or run skein gateway)")
	}
	var h worker.Hello
	if err := s.decodeJSON(r, &h); err != nil {
		return nil, err
	}
	ans, err := worker.AnswerGatewayHello(s.workerSessions, s.opts.WorkerToken, s.gatewayID, h)
	if err != nil {
		return nil, errf(http.StatusBadRequest, "%v", err)
	}
	return ans, nil
}

// workerRequest authenticates a worker's registration or heartbeat and decodes its body into v:
// signed under a session of a worker's handshake (what skein's workers send; the instance is
// the session's), or, from a caller that holds it, with the token itself in TokenHeader
// (instance empty).
func (s *Server) workerRequest(r *http.Request, v any) (instance string, err error) {
	if r.Header.Get(worker.SessionHeader) == "" {
		if err := s.checkWorkerToken(r); err != nil {
			return "", err
		}
		return "", s.decodeJSON(r, v)
	}
	if !s.opts.AcceptWorkers || s.opts.WorkerToken == "" {
		return "", s.checkWorkerToken(r)
	}
	instance, bodyHash, err := s.workerSessions.Check(r)
	if err != nil {
		return "", errf(http.StatusUnauthorized, "%v", err)
	}
	b, err := s.readBody(r)
	if err != nil {
		return "", err
	}
	if sum := sha256.Sum256(b); hex.EncodeToString(sum[:]) != bodyHash {
		return "", errf(http.StatusUnauthorized, "%v: the body is not the one signed", worker.ErrBadSession)
	}
	return instance, decodeJSONBytes(b, v)
}

func (s *Server) checkWorkerToken(r *http.Request) error {
	if !s.opts.AcceptWorkers || s.opts.WorkerToken == "" {
		return errf(http.StatusForbidden, "this server accepts no workers (start it with --accept-workers, or run skein gateway)")
	}
	if subtle.ConstantTimeCompare([]byte(r.Header.Get(worker.TokenHeader)), []byte(s.opts.WorkerToken)) != 1 {
		return errf(http.StatusUnauthorized, "bad or missing %s", worker.TokenHeader)
	}
	return nil
}

// registerWorker adds a worker's replica to the router. A registration never displaces a live
// worker of the same id (it answers 409 until that one misses its heartbeats); the answer holds
// the secret that the worker's heartbeats must carry.
func (s *Server) registerWorker(w http.ResponseWriter, r *http.Request, _ string) (any, error) {
	var reg worker.Registration
	instance, err := s.workerRequest(r, &reg)
	if err != nil {
		return nil, err
	}
	if err := reg.Validate(); err != nil {
		return nil, errf(http.StatusBadRequest, "%v", err)
	}
	if instance != "" && reg.Instance != instance {
		return nil, errf(http.StatusBadRequest, "the registration's instance %q is not the one of its handshake", reg.Instance)
	}
	// Reserve the id first, so that concurrent registrations of one id cannot both succeed.
	mine := &workerState{secret: randomHex(16), lastSeen: time.Now(), addr: workerAddr(reg.URL)}
	s.workersMu.Lock()
	s.modelsMu.Lock()
	old := s.workers[reg.ID]
	live := old != nil && s.workerLive(old)
	if old == nil && s.hasReplicaLocked(reg.ID) {
		live = true // an in-process replica of this server
	}
	// Registering drops whatever adapters the worker at that address holds (below): a second
	// registration at a live worker's address, under another id, would take that worker's
	// adapters from under it. Its own re-registration after a restart waits, like one of its
	// id, until the old registration has missed its heartbeats.
	taken := ""
	for id, ws := range s.workers {
		if id != reg.ID && ws.addr == mine.addr && s.workerLive(ws) {
			taken = id
		}
	}
	if !live && taken == "" {
		s.workers[reg.ID] = mine
	}
	s.modelsMu.Unlock()
	if taken != "" {
		s.workersMu.Unlock()
		return nil, errf(http.StatusConflict, "the address %s is registered to worker %q, which is alive; a worker may register there once that one has missed its heartbeats", reg.URL, taken)
	}
	if old != nil && !live {
		s.removeReplica(reg.ID) // stopped heartbeating: forget it and its placements
		old.dropClient()
		go old.rep.Close()
	}
	s.workersMu.Unlock()
	if live {
		return nil, errf(http.StatusConflict, "worker %q is registered and alive; a worker of that id may register once it has missed its heartbeats", reg.ID)
	}
	// The worker at reg.URL proves it holds the token (and, for a signed registration, that it
	// is the instance that registered) before anything is sent there.
	cl := s.newWorkerClient(reg.URL, reg.Info)
	if reg.Instance != "" {
		cl.ExpectInstance(reg.Instance)
	}
	hctx, cancel := context.WithTimeout(context.Background(), workerHandshakeTimeout)
	err = cl.Hello(hctx)
	cancel()
	if err != nil {
		s.unreserve(reg.ID, mine)
		return nil, errf(http.StatusBadRequest, "the worker at %s did not complete the handshake (it must prove it holds the cluster token): %v", reg.URL, err)
	}
	reg.Instance = cl.Instance()
	// One worker process is one replica: the same instance registered under another id (another
	// address of it) and alive keeps that registration.
	s.workersMu.Lock()
	s.modelsMu.Lock()
	dup := ""
	for id, ws := range s.workers {
		if id != reg.ID && ws.instance == reg.Instance && s.workerLive(ws) {
			dup = id
		}
	}
	if dup == "" {
		mine.instance = reg.Instance
	} else if s.workers[reg.ID] == mine {
		delete(s.workers, reg.ID)
	}
	s.modelsMu.Unlock()
	s.workersMu.Unlock()
	if dup != "" {
		return nil, errf(http.StatusConflict, "this worker (instance %s) is registered as %q, which is alive; one worker is one replica", reg.Instance, dup)
	}
	s.joinWorker(cl, reg, mine)
	return worker.RegisterReply{ID: reg.ID, Secret: mine.secret}, nil
}

// unreserve forgets a registration that did not join, if it is still mine.
func (s *Server) unreserve(id string, mine *workerState) {
	s.workersMu.Lock()
	s.modelsMu.Lock()
	if s.workers[id] == mine {
		delete(s.workers, id)
	}
	s.modelsMu.Unlock()
	s.workersMu.Unlock()
}

// joinWorker makes a reserved worker (mine, in s.workers) a replica the router routes to. A
// worker that joins again (this gateway restarted, or declared it dead) may hold adapters: the
// ones it can keep (adoptable) are placed there as they are, without a reload; the rest are
// dropped, so its slots match the router's view (their state is on disk as of their last step;
// they reload on their next request).
func (s *Server) joinWorker(cl *worker.Client, reg worker.Registration, mine *workerState) {
	cl.Root = s.opts.DataDir // directories go to the worker as storage keys
	ctx := context.Background()
	keep := s.adoptable(ctx, cl, reg)
	for _, id := range cl.AdapterIDs(ctx) {
		if !keep[id] && !s.heldElsewhere(ctx, id) {
			cl.DeleteAdapter(ctx, id)
		}
	}
	rep := replica.New(reg.ID, reg.BaseModel, cl, reg.MaxLoras)
	s.workersMu.Lock()
	s.modelsMu.Lock()
	mine.rep, mine.cl, mine.lastSeen = rep, cl, time.Now()
	s.modelsMu.Unlock()
	s.addReplica(rep)
	s.workersMu.Unlock()
	adopted := 0
	for id := range keep {
		if err := s.router.Adopt(id, rep.ID()); err != nil {
			// Placed elsewhere meanwhile (a request came first): this copy is stale now.
			s.log.Warn("not adopting an adapter", "run", id, "replica", rep.ID(), "err", err)
			cl.DeleteAdapter(ctx, id)
			continue
		}
		rep.Vouch(id) // clean at the run's step: used as it is, without a reload
		adopted++
		s.logErr("placement", s.st.PutPlacement(ctx, id, rep.ID()))
	}
	s.log.Info("worker joined", "id", reg.ID, "url", reg.URL, "base_model", reg.BaseModel, "max_loras", rep.MaxLoras(), "adopted_adapters", adopted)
}

// heldElsewhere reports whether another live gateway sequences the run (several gateways on
// one store): its adapter on a worker this gateway joins is that gateway's to keep or drop, not
// a leftover (deleting it lost the gradients it held and failed the holder's next op). Not
// adopted here, it never serves a request of this gateway, which would load the run's state
// over it. A lease that cannot be read counts as held: keeping a copy is the safe mistake.
func (s *Server) heldElsewhere(ctx context.Context, run string) bool {
	if !s.leases.on {
		return false
	}
	l, err := s.st.RunLeaseOf(ctx, run)
	if errors.Is(err, store.ErrNotFound) {
		return false
	}
	return err != nil || (l.Holder != s.self() && l.Live(time.Now()))
}

// adoptable lists the training adapters a joining worker holds that can stay there as they
// are: the run is live here, of that base model, not placed elsewhere (by this router, or by
// another gateway's record in a shared store), at the step the run's state records, with no
// gradients the worker accumulated since that step (clean) and none the run's ledger expects.
// Anything else is dropped and reloads from its saved state: a stale copy must never serve.
func (s *Server) adoptable(ctx context.Context, cl *worker.Client, reg worker.Registration) map[string]bool {
	keep := map[string]bool{}
	states, err := cl.AdapterStates(ctx)
	if err != nil {
		// A worker of an older version, or a failure: adopt nothing (the old behaviour).
		s.log.Info("worker's adapter states unavailable: adopting none", "id", reg.ID, "err", err)
		return keep
	}
	var placed map[string]string
	if s.shared() {
		if placed, err = s.st.Placements(ctx); err != nil {
			s.logErr("placements", err)
			return keep
		}
	}
	for _, st := range states {
		run := s.runs.get(st.ID)
		if run == nil || len(keep) >= reg.MaxLoras {
			continue
		}
		if _, elsewhere := s.router.Where(st.ID); elsewhere {
			continue
		}
		if p, ok := placed[st.ID]; ok && p != reg.ID {
			continue
		}
		s.runs.mu.Lock()
		ok := run.ready && run.baseModel == reg.BaseModel && run.step == st.Step && st.Clean &&
			len(run.grads.pending) == 0 && !run.grads.untracked
		s.runs.mu.Unlock()
		if ok {
			keep[st.ID] = true
		}
	}
	return keep
}

// workerLive reports whether a registration is being set up or heartbeating; modelsMu held.
func (s *Server) workerLive(ws *workerState) bool {
	return ws.rep == nil || time.Since(ws.lastSeen) <= s.opts.WorkerTimeout
}

// workerAddr is a worker URL in a form that compares equal for one address: scheme and host in
// lower case, no trailing slash. (Two names of one host, e.g. localhost and 127.0.0.1, still
// differ: the token holder is trusted not to alias on purpose beyond what this catches.)
func workerAddr(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return raw
	}
	return strings.ToLower(u.Scheme) + "://" + strings.ToLower(u.Host) + strings.TrimRight(u.Path, "/")
}

// hasReplicaLocked reports whether a replica of that id is served; modelsMu held.
func (s *Server) hasReplicaLocked(id string) bool {
	for _, reps := range s.models {
		for _, r := range reps {
			if r.ID() == id {
				return true
			}
		}
	}
	return false
}

// workerHeartbeat records that a worker is alive. Only the registered worker (holding its
// registration's secret) can keep a registration alive; an unknown id answers 404 so that the
// worker registers again.
func (s *Server) workerHeartbeat(w http.ResponseWriter, r *http.Request, _ string) (any, error) {
	var hb worker.Heartbeat
	if _, err := s.workerRequest(r, &hb); err != nil {
		return nil, err
	}
	if err := hb.Validate(); err != nil {
		return nil, errf(http.StatusBadRequest, "%v", err)
	}
	s.modelsMu.Lock()
	defer s.modelsMu.Unlock()
	ws := s.workers[hb.ID]
	if ws == nil || ws.rep == nil {
		return nil, errf(http.StatusNotFound, "worker %q is not registered", hb.ID)
	}
	if subtle.ConstantTimeCompare([]byte(hb.Secret), []byte(ws.secret)) != 1 {
		return nil, errf(http.StatusForbidden, "heartbeat for worker %q does not carry its registration's secret", hb.ID)
	}
	hb.Secret = ""
	ws.lastSeen, ws.reported = time.Now(), hb
	if hb.Draining && ws.rep.Healthy() { // SIGTERM: nothing new goes there (a worker never undrains)
		ws.rep.SetHealthy(false)
		go s.drainReplica(ws.rep.ID())
	}
	return api.OKResponse{OK: true}, nil
}

// reapWorkers removes workers that stopped heartbeating: nothing more is routed to them, and
// their adapters are placed elsewhere on their next request, from their last saved state.
func (s *Server) reapWorkers(now time.Time) {
	s.workersMu.Lock()
	s.modelsMu.Lock()
	var dead []*workerState
	for id, ws := range s.workers {
		if ws.rep != nil && now.Sub(ws.lastSeen) > s.opts.WorkerTimeout {
			dead = append(dead, ws)
			delete(s.workers, id)
		}
	}
	s.modelsMu.Unlock()
	for _, ws := range dead {
		s.log.Warn("worker missed its heartbeats: removed", "id", ws.rep.ID())
		s.removeReplica(ws.rep.ID())
		ws.dropClient() // its calls in flight end now, as may-have-run: nothing waits on a frozen worker
	}
	s.workersMu.Unlock()
	for _, ws := range dead {
		go ws.rep.Close()
	}
}

// dropWorker removes the worker behind rep (if rep is a worker's and still registered) at once,
// without waiting for its heartbeats to stop: a call to it failed in transport. If it is alive
// after all, its next heartbeat answers 404 and it registers again, holding nothing.
func (s *Server) dropWorker(rep *replica.Replica, cause error) {
	s.workersMu.Lock()
	s.modelsMu.Lock()
	ws := s.workers[rep.ID()]
	mine := ws != nil && ws.rep == rep
	if mine {
		delete(s.workers, rep.ID())
	}
	s.modelsMu.Unlock()
	if mine {
		s.log.Warn("worker failed a call: removed", "id", rep.ID(), "err", cause)
		s.removeReplica(rep.ID())
		ws.dropClient()
	}
	s.workersMu.Unlock()
	if mine {
		go rep.Close() // its queued work fails fast and is routed again by its callers
	}
}

// transportFailed reports whether err means that rep could not be reached or was lost during a
// call (or was closed meanwhile); such a worker is dropped at once.
func (s *Server) transportFailed(rep *replica.Replica, err error) bool {
	if !lost(err) {
		return false
	}
	s.dropWorker(rep, err)
	return true
}

// lost reports whether err is a failure to reach a replica or to hear back from it.
func lost(err error) bool {
	return errors.Is(err, worker.ErrUnreachable) || errors.Is(err, worker.ErrLost) || errors.Is(err, replica.ErrClosed)
}

// errMayHaveRun is the error of an op whose worker was lost after the op reached it.
var errMayHaveRun = errors.New("the worker running this request was lost after the request reached it, so it may have run there; " +
	"it was not run again: the model goes on from its last saved state on another worker")

// maxReroutes bounds how often one op moves on after a lost worker.
const maxReroutes = 4

func rerouteErr(err error) error { return fmt.Errorf("%w (%v)", errMayHaveRun, err) }

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
