package gateway

// Run leases (issue 38): several gateways on one PostgreSQL, any of which may die, and no
// acknowledged op lost. One gateway at a time sequences a training run (seq_id order needs one
// sequencer): it holds the run's lease in the store, with an epoch that only grows
// (store.RunLeases). A request for a run another gateway holds is forwarded there; one for a
// run whose lease lapsed takes it over. Taking over re-reads the run from the store, and runs
// every acknowledged op of the run that has no stored result, in seq_id order, from the request
// its first gateway stored with its future. The epoch fences the gateway that lost the run: its
// results are refused by the store (FinishFutureFenced), its saves by the state pointer (a
// newer holder's replica claims it, and a claim below the pointer's epoch is refused). A single
// gateway on SQLite has no leases at all (nothing changes for `skein serve`); with leases, the
// hot path reads the epoch from memory, and a background loop renews every held lease in one
// statement.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/store"
)

// DefaultRunLeaseTTL is how long a run's lease lasts unrenewed: a dead gateway's runs are taken
// over within about this long (the holder renews every third of it).
const DefaultRunLeaseTTL = 6 * time.Second

// forwardedHeader marks a request one gateway forwarded to the run's holder: the holder never
// forwards it again (no loops while a lease moves).
const forwardedHeader = "X-Skein-Forwarded-By"

type leaseTable struct {
	on   bool
	ttl  time.Duration
	addr string // where this gateway serves, for the others to forward to
	mu   sync.Mutex
	held map[string]heldLease
	// last is the epoch this gateway last held each run at (kept after a lease is lost): its
	// writes of the run's row carry it, so that once the run moved they are refused.
	last map[string]int64
	// turns serializes taking and taking over one run (a takeover replays its ops before any new
	// request of the run is queued).
	turns map[string]*sync.Mutex
}

type heldLease struct {
	epoch int64
	until time.Time // by this process's clock: a margin before the store's expiry
	// ready: the run is taken over (its pending ops queued again); until then new requests
	// wait for the takeover (ownRun), while the ops it queues already run under the epoch.
	ready bool
}

func newLeaseTable(on bool, ttl time.Duration, addr string) *leaseTable {
	return &leaseTable{on: on, ttl: ttl, addr: addr, held: map[string]heldLease{}, last: map[string]int64{}, turns: map[string]*sync.Mutex{}}
}

// serving is the hot path: the epoch this gateway holds run at and serves it under, from memory.
func (t *leaseTable) serving(run string) (int64, bool) {
	t.mu.Lock()
	h, ok := t.held[run]
	t.mu.Unlock()
	if !ok || !h.ready || !time.Now().Before(h.until) {
		return 0, false
	}
	return h.epoch, true
}

// valid is the epoch this gateway holds run at (taken over or still being taken over).
func (t *leaseTable) valid(run string) (int64, bool) {
	t.mu.Lock()
	h, ok := t.held[run]
	t.mu.Unlock()
	if !ok || !time.Now().Before(h.until) {
		return 0, false
	}
	return h.epoch, true
}

// lastEpoch is the epoch this gateway last held run at (false: never held here).
func (t *leaseTable) lastEpoch(run string) (int64, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.last[run]
	return e, ok
}

// hold records a lease taken or renewed at sent (call with t.mu held); a renewal keeps whether
// the run is ready.
func (t *leaseTable) hold(run string, epoch int64, sent time.Time, ready bool) {
	if h, ok := t.held[run]; ok && h.epoch == epoch {
		ready = ready || h.ready
	}
	t.held[run] = heldLease{epoch: epoch, until: t.localUntil(sent), ready: ready}
	t.last[run] = epoch
}

// holds reports whether run is still held at epoch (an op queued under it may run).
func (t *leaseTable) holds(run string, epoch int64) bool {
	e, ok := t.valid(run)
	return ok && e == epoch
}

// localUntil is when a lease renewed by a call sent at sent stops counting here: a quarter of the
// TTL before the store's expiry, so that this gateway stops sequencing before another may start.
func (t *leaseTable) localUntil(sent time.Time) time.Time { return sent.Add(t.ttl - t.ttl/4) }

func (t *leaseTable) turn(run string) *sync.Mutex {
	t.mu.Lock()
	defer t.mu.Unlock()
	m := t.turns[run]
	if m == nil {
		m = &sync.Mutex{}
		t.turns[run] = m
	}
	return m
}

// self is this gateway's holder name (its futures' owner name too).
func (s *Server) self() string { return s.futures.prefix }

// ownRun makes sure this gateway sequences run, taking the lease (and taking the run over from
// the store if it was another's or lapsed), or says who does. A lease another gateway holds is
// returned as it is, for forwarding.
func (s *Server) ownRun(ctx context.Context, runID string) (store.RunLease, error) {
	if e, ok := s.leases.serving(runID); ok {
		return store.RunLease{Run: runID, Holder: s.self(), Epoch: e}, nil
	}
	m := s.leases.turn(runID)
	m.Lock()
	defer m.Unlock()
	if e, ok := s.leases.serving(runID); ok { // taken while this one waited
		return store.RunLease{Run: runID, Holder: s.self(), Epoch: e}, nil
	}
	sent := time.Now()
	l, err := s.st.AcquireRunLease(ctx, runID, s.self(), s.leases.addr, s.leases.ttl)
	if err != nil {
		return store.RunLease{}, fmt.Errorf("taking model %s's lease: %w", runID, err)
	}
	if l.Holder != s.self() {
		return l, nil
	}
	s.leases.mu.Lock()
	prev, had := s.leases.held[runID]
	current := had && prev.epoch == l.Epoch && prev.ready
	s.leases.hold(runID, l.Epoch, sent, current) // renewed in time: this gateway's view is current
	s.leases.mu.Unlock()
	if current {
		return l, nil
	}
	// Not ready yet: requests of the run wait on its turn, while the ops the takeover queues
	// run under the new epoch.
	if err := s.takeOver(ctx, runID, l.Epoch); err != nil {
		s.leases.mu.Lock()
		delete(s.leases.held, runID)
		s.leases.mu.Unlock()
		_ = s.st.ReleaseRunLease(context.WithoutCancel(ctx), runID, s.self(), l.Epoch)
		return store.RunLease{}, err
	}
	s.leases.mu.Lock()
	if h, ok := s.leases.held[runID]; ok && h.epoch == l.Epoch {
		h.ready = true
		s.leases.held[runID] = h
	}
	s.leases.mu.Unlock()
	return l, nil
}

// holdNew records the lease of a run this gateway just created (epoch 1, nothing to take over).
func (s *Server) holdNew(runID string) {
	if !s.leases.on {
		return
	}
	sent := time.Now()
	l, err := s.st.AcquireRunLease(context.Background(), runID, s.self(), s.leases.addr, s.leases.ttl)
	if err != nil || l.Holder != s.self() {
		s.log.Warn("a new model's lease", "run", runID, "holder", l.Holder, "err", err)
		return
	}
	s.leases.mu.Lock()
	s.leases.hold(runID, l.Epoch, sent, true)
	s.leases.mu.Unlock()
}

// takeOver makes this gateway's view of a run it just took (at epoch) the store's: the run's row
// is read again, a copy of its adapter this gateway may still hold from an earlier epoch is
// dropped (a newer holder may have stepped it since), and the run's acknowledged ops without a
// result are queued again, in seq_id order, under the new epoch.
func (s *Server) takeOver(ctx context.Context, runID string, epoch int64) error {
	if old := s.runs.get(runID); old != nil {
		// Ops this gateway queued under an earlier epoch do nothing now (see submitOrderedSized);
		// one still running must end before the run's ops are queued again.
		s.waitIdle(old.queue)
		if ep, ok := s.router.Where(runID); ok {
			if rep, err := s.replicaFor(ep); err == nil {
				_ = rep.Unload(s.adapterOf(old))
			}
		}
		s.router.Forget(runID)
	}
	// Read after that copy is gone: its save (if no other gateway claimed the state since, it is
	// the latest) may have written the row.
	row, err := s.st.GetRun(ctx, runID)
	if errors.Is(err, store.ErrNotFound) {
		s.failPendingOps(ctx, runID, fmt.Sprintf("model %s no longer exists", runID))
		return errf(http.StatusNotFound, "model %q not found", runID)
	}
	if err != nil {
		return fmt.Errorf("reading model %s: %w", runID, err)
	}
	run := runFromRow(row)
	ops, err := s.st.PendingOps(ctx, runID)
	if err != nil {
		return fmt.Errorf("reading model %s's pending requests: %w", runID, err)
	}
	slices.SortFunc(ops, func(a, b store.Future) int { return seqOf(a.OpKey) - seqOf(b.OpKey) })
	if len(ops) > 0 {
		run.queue = newRunQueue(seqOf(ops[0].OpKey))
	}
	s.runs.mu.Lock()
	s.runs.m[runID] = run
	s.runs.mu.Unlock()
	if len(ops) > 0 {
		s.log.Info("took a model over: running its acknowledged requests again", "run", runID, "epoch", epoch, "requests", len(ops))
	}
	q := s.queueOf(run)
	next := 0
	for _, f := range ops {
		seq := seqOf(f.OpKey)
		for gap := next; next > 0 && gap < seq; gap++ {
			// A seq_id refused before its future was created (its client was told): consumed.
			if q.reserve(gap, 0) == nil {
				q.skip(gap, 0)
			}
		}
		next = seq + 1
		if ok, err := s.st.AdoptFuture(ctx, f.ID, s.self()); err != nil || !ok {
			// Finished meanwhile (its old gateway's write got there first): its seq_id is
			// consumed, so the ops after it run.
			if q.reserve(seq, 0) == nil {
				q.skip(seq, 0)
			}
			continue
		}
		if err := s.replayOp(row.Tenant, f); err != nil {
			s.log.Warn("a taken-over request failed again", "run", runID, "request", f.ID, "err", err)
		}
	}
	return nil
}

// runFromRow is a run as its store row says.
func runFromRow(row store.Run) *trainingRun {
	var d runData
	_ = json.Unmarshal(row.Data, &d)
	return &trainingRun{id: row.ID, tenant: row.Tenant, session: row.SessionID, baseModel: row.BaseModel,
		lora: d.Lora, step: d.Step, created: row.Created, lastRequest: row.LastRequest, metadata: d.Metadata,
		ready: row.Live, lastCkpt: d.LastCkpt, lastSamplerCkpt: d.LastSamplerCkpt, project: d.Project,
		grads: gradientLedger{pending: d.PendingForwardBackwards, untracked: d.UntrackedGradients},
		queue: newRunQueue(-1)} // the client's seq_ids go on from wherever it is
}

// seqOf is the seq_id of an op key "model#seq" (0 if none).
func seqOf(opKey string) int {
	i := strings.LastIndexByte(opKey, '#')
	if i < 0 {
		return 0
	}
	n, _ := strconv.Atoi(opKey[i+1:])
	return n
}

// waitIdle waits until a run queue runs nothing (an op of an earlier epoch still on a replica).
func (s *Server) waitIdle(q *runQueue) {
	if q == nil {
		return
	}
	for {
		q.mu.Lock()
		busy := q.running
		q.mu.Unlock()
		if !busy {
			return
		}
		select {
		case <-s.stop:
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// opRequest is what a sequenced op's future keeps of its request, so that the run's next holder
// can run it: the endpoint, the content type and the (decompressed) body.
type opRequest struct {
	Path        string `json:"path"`
	ContentType string `json:"content_type"`
	Body        []byte `json:"body"`
}

type opRequestKey struct{}

// replayKey marks a request that runs an acknowledged op again: its future (this id) is adopted,
// not created.
type replayKey struct{}

func requestOf(r *http.Request) []byte {
	if r == nil {
		return nil
	}
	req, ok := r.Context().Value(opRequestKey{}).(opRequest)
	if !ok {
		return nil
	}
	b, _ := json.Marshal(req)
	return b
}

func replayOf(r *http.Request) string {
	if r == nil {
		return ""
	}
	id, _ := r.Context().Value(replayKey{}).(string)
	return id
}

// replayOp queues a stored request again through its own handler, which adopts its future.
func (s *Server) replayOp(tenant string, f store.Future) error {
	var req opRequest
	fn := s.replayable[""]
	if err := json.Unmarshal(f.Request, &req); err == nil {
		fn = s.replayable[req.Path]
	}
	fail := func(msg string) error {
		local, _ := s.futures.adopt(f, nil)
		if local != nil {
			s.futures.fail(local, "server", msg)
		}
		return errors.New(msg)
	}
	if fn == nil {
		return fail(fmt.Sprintf("the gateway that accepted this request died, and its request (%q) cannot be run again; submit it again", req.Path))
	}
	ctx := context.WithValue(context.WithValue(context.Background(), replayKey{}, f.ID), opRequestKey{}, req)
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, req.Path, bytes.NewReader(req.Body))
	if err != nil {
		return fail(err.Error())
	}
	hr.Header.Set("Content-Type", req.ContentType)
	if _, err := fn(discardWriter{}, hr, tenant); err != nil {
		// Refused now (its validation changed, or its model is gone): the request was
		// acknowledged, so its future says why.
		if local := s.futures.adopted(f.ID); local != nil {
			s.futures.fail(local, "user", err.Error())
			return err
		}
		return fail(err.Error())
	}
	return nil
}

// failPendingOps ends the pending ops of a run that no longer exists.
func (s *Server) failPendingOps(ctx context.Context, runID, msg string) {
	ops, err := s.st.PendingOps(ctx, runID)
	if err != nil {
		return
	}
	for _, f := range ops {
		if ok, _ := s.st.AdoptFuture(ctx, f.ID, s.self()); ok {
			if _, err := s.st.FinishFuture(ctx, f.ID, store.FutureFailed, []byte(msg), "user"); err != nil {
				s.log.Warn("ending a request of a missing model", "request", f.ID, "err", err)
			}
		}
	}
}

// discardWriter is the ResponseWriter of a replayed request: its answer (the future's id) was
// given to the client long ago.
type discardWriter struct{}

func (discardWriter) Header() http.Header         { return http.Header{} }
func (discardWriter) Write(b []byte) (int, error) { return len(b), nil }
func (discardWriter) WriteHeader(int)             {}

// runScoped wraps the handlers of requests that act on one training run: with leases, the run's
// holder answers them. Elsewhere they are forwarded to it (one hop), or the run is taken over if
// its lease lapsed. The body is read here once (the handler reads it again from memory), and
// kept, with sequenced ops, in their futures.
func (s *Server) runScoped(fn handlerFunc) handlerFunc {
	return s.scopedBy(func(r *http.Request, body []byte) string { return peekModelID(r.Header.Get("Content-Type"), body) }, true, fn)
}

// checkpointScoped wraps the requests that change a checkpoint (publish, TTL, delete): with
// leases they go to the gateway that holds the checkpoint's run, which keeps the checkpoint in
// memory (it saved it, or read it from the store), so that its view stays the current one. A
// checkpoint whose run is gone is served where it arrives.
func (s *Server) checkpointScoped(fn handlerFunc) handlerFunc {
	return s.scopedBy(func(r *http.Request, _ []byte) string { return r.PathValue("id") }, false, fn)
}

// runReadScoped wraps the reads of one run (get_training_run, its metrics): with leases, a run
// another gateway holds live is read there, where its step and checkpoints are current; any
// other is read here (a run this gateway never held, from its row: see accessibleRun). A read
// never takes a lease.
func (s *Server) runReadScoped(fn handlerFunc) handlerFunc {
	if !s.leases.on {
		return fn
	}
	return func(w http.ResponseWriter, r *http.Request, tenant string) (any, error) {
		id := r.PathValue("id")
		if _, held := s.leases.serving(id); !held && r.Header.Get(forwardedHeader) == "" {
			l, err := s.st.RunLeaseOf(r.Context(), id)
			if err == nil && l.Holder != s.self() && l.Addr != "" && l.Live(time.Now()) {
				if s.forward(w, r, nil, l.Addr) == nil {
					return nil, nil
				}
			}
		}
		return fn(w, r, tenant)
	}
}

// scopedBy serves a request of the run idOf names at the gateway that holds the run's lease:
// here, else forwarded there, else (the lease lapsed) here after taking the run over. op marks
// a run's op, whose request is kept with its future for the run's next holder.
func (s *Server) scopedBy(idOf func(r *http.Request, body []byte) string, op bool, fn handlerFunc) handlerFunc {
	if !s.leases.on {
		return fn
	}
	return func(w http.ResponseWriter, r *http.Request, tenant string) (any, error) {
		body, err := s.readBody(r)
		if err != nil {
			return nil, err
		}
		r.Header.Del("Content-Encoding") // readBody undid it
		r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
		id := idOf(r, body)
		if id == "" {
			return fn(w, r, tenant) // the handler says what is wrong with it
		}
		if err := s.knowRun(r.Context(), tenant, id); err != nil {
			var he *httpError
			if !op && errors.As(err, &he) && he.status == http.StatusNotFound {
				return fn(w, r, tenant)
			}
			return nil, err
		}
		l, err := s.ownRun(r.Context(), id)
		if err != nil {
			var he *httpError
			if errors.As(err, &he) {
				return nil, err
			}
			return nil, errf(http.StatusServiceUnavailable, "%v; retry", err)
		}
		if l.Holder != s.self() {
			unreachable := fmt.Sprintf("model %s is sequenced by gateway %s, which this gateway cannot reach (its lease moves within %s if it is gone); retry", id, l.Holder, s.leases.ttl)
			if by := r.Header.Get(forwardedHeader); by != "" || l.Addr == "" {
				return nil, errf(http.StatusServiceUnavailable, "%s", unreachable)
			}
			err := s.forward(w, r, body, l.Addr)
			if err == nil {
				return nil, nil
			}
			// The holder did not answer: if its lease lapsed meanwhile, this gateway takes the run
			// and serves the request itself (a sequenced one that did reach the holder is found
			// by its op key, not run twice); else the client retries.
			if l, oerr := s.ownRun(r.Context(), id); oerr != nil || l.Holder != s.self() {
				return nil, errf(http.StatusServiceUnavailable, "%s (%v)", unreachable, err)
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
		}
		if !op {
			return fn(w, r, tenant)
		}
		ctx := context.WithValue(r.Context(), opRequestKey{}, opRequest{Path: r.URL.Path, ContentType: r.Header.Get("Content-Type"), Body: body})
		return fn(w, r.WithContext(ctx), tenant)
	}
}

// knowRun checks that a tenant's run exists, here or in the store (it may have been created on
// another gateway since this one started); another tenant's is as absent as a missing one.
func (s *Server) knowRun(ctx context.Context, tenant, id string) error {
	if run := s.runs.get(id); run != nil {
		if run.tenant != tenant {
			return errf(http.StatusNotFound, "model %q not found", id)
		}
		return nil
	}
	row, err := s.st.GetRun(ctx, id)
	if errors.Is(err, store.ErrNotFound) || (err == nil && row.Tenant != tenant) {
		return errf(http.StatusNotFound, "model %q not found", id)
	}
	return err
}

// peekModelID finds the model_id of a run's request without decoding the rest ("" if none).
func peekModelID(contentType string, body []byte) string {
	if strings.Contains(contentType, "protobuf") {
		return api.ForwardBackwardModelID(body) // the data is decoded once, by the handler
	}
	var v struct {
		ModelID string `json:"model_id"`
	}
	if json.Unmarshal(body, &v) != nil {
		return ""
	}
	return v.ModelID
}

// forward sends a request to the gateway that holds its run and copies the answer back. An error
// means nothing was written (the holder did not answer).
func (s *Server) forward(w http.ResponseWriter, r *http.Request, body []byte, addr string) error {
	req, err := http.NewRequestWithContext(r.Context(), r.Method, strings.TrimSuffix(addr, "/")+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		return err
	}
	for k, v := range r.Header {
		switch http.CanonicalHeaderKey(k) {
		case "Connection", "Content-Length", "Content-Encoding", "Transfer-Encoding", "Keep-Alive", "Upgrade", "Te", "Trailer", "Proxy-Connection":
			continue
		}
		req.Header[k] = v
	}
	req.Header.Set(forwardedHeader, s.self())
	resp, err := s.forwarder.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	for k, v := range resp.Header {
		switch http.CanonicalHeaderKey(k) {
		case "Connection", "Content-Length", "Transfer-Encoding", "Keep-Alive":
			continue
		}
		w.Header()[k] = v
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(w, resp.Body)
	return nil
}

// leaseLoop renews this gateway's leases (one statement for all of them), drops those it lost,
// and takes over runs whose gateway died with acknowledged ops pending, so that none waits for
// a client to come back.
func (s *Server) leaseLoop() {
	renew := time.NewTicker(s.leases.ttl / 3)
	defer renew.Stop()
	orphans := time.NewTicker(max(s.leases.ttl/6, 10*time.Millisecond))
	defer orphans.Stop()
	ctx := context.Background()
	for {
		select {
		case <-s.handedOver: // renewed while a stopping gateway's last ops run and save
			return
		case <-renew.C:
			s.renewLeases(ctx)
		case <-orphans.C:
			select {
			case <-s.stop:
				continue // stopping: it takes no run over
			default:
			}
			runs, err := s.st.OrphanedRuns(ctx, 16)
			if err != nil {
				s.log.Warn("finding runs whose gateway died", "err", err)
				continue
			}
			for _, id := range runs {
				if _, err := s.ownRun(ctx, id); err != nil {
					s.log.Warn("taking over a run whose gateway died", "run", id, "err", err)
				}
			}
		}
	}
}

func (s *Server) renewLeases(ctx context.Context) {
	s.leases.mu.Lock()
	n := len(s.leases.held)
	s.leases.mu.Unlock()
	if n == 0 {
		return
	}
	sent := time.Now()
	held, err := s.st.RenewRunLeases(ctx, s.self(), s.leases.ttl)
	if err != nil {
		s.log.Warn("renewing run leases", "err", err)
		return // they count down in memory; the hot path tries again
	}
	now := map[string]int64{}
	for _, l := range held {
		now[l.Run] = l.Epoch
	}
	var lost []string
	s.leases.mu.Lock()
	for run, h := range s.leases.held {
		if e, ok := now[run]; ok && e == h.epoch {
			s.leases.hold(run, h.epoch, sent, h.ready)
			continue
		}
		delete(s.leases.held, run)
		lost = append(lost, run)
	}
	s.leases.mu.Unlock()
	for _, run := range lost {
		s.log.Warn("lost a run's lease: another gateway sequences it now", "run", run)
	}
}

// releaseLeases hands every held lease back (a graceful stop, item 4): the ops already queued
// finish first (for at most handoverWait together), then the leases end, and other gateways
// take the runs at their next request instead of waiting for the leases to lapse. An op still
// running after that is fenced like a dead gateway's.
func (s *Server) releaseLeases() {
	if !s.leases.on {
		return
	}
	deadline := time.Now().Add(handoverWait)
	s.leases.mu.Lock()
	runs := make([]string, 0, len(s.leases.held))
	for run := range s.leases.held {
		runs = append(runs, run)
	}
	s.leases.mu.Unlock()
	for _, id := range runs {
		if run := s.runs.get(id); run != nil && run.queue != nil {
			for time.Now().Before(deadline) {
				run.queue.mu.Lock()
				busy := run.queue.running
				run.queue.mu.Unlock()
				if !busy {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
	}
	// Each run's adapter is saved in full (the gradients of forward_backwards not yet stepped
	// included) while its lease is still this gateway's: the run's next holder loads that state.
	// Without it, gradients acknowledged here were lost at a graceful stop. One on an in-process
	// replica is let go too (it dies with this process); one on a worker stays there (the worker
	// outlives this gateway, and the next holder may already count it resident: evicting it
	// failed that holder's next op with "unknown adapter").
	for _, id := range runs {
		run := s.runs.get(id)
		ep, ok := s.router.Where(id)
		if run == nil || !ok {
			continue
		}
		if rep, err := s.replicaFor(ep); err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), time.Until(deadline)+5*time.Second)
			if _, local := rep.Local(); !local {
				s.logErr("saving a run's adapter before handing it over", rep.Save(ctx, s.adapterOf(run)))
				cancel()
				continue
			}
			err := rep.Evict(ctx, s.adapterOf(run))
			cancel()
			s.logErr("saving a run's adapter before handing it over", err)
			if err == nil {
				s.router.Forget(id)
				s.logErr("placement", s.st.DeletePlacement(context.Background(), id))
			}
		}
	}
	s.leases.mu.Lock()
	held := s.leases.held
	s.leases.held = map[string]heldLease{}
	s.leases.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for run, h := range held {
		s.logErr("releasing a run lease", s.st.ReleaseRunLease(ctx, run, s.self(), h.epoch))
	}
}

// handoverWait bounds how long a stopping gateway lets its queued ops finish before it hands
// their runs over.
const handoverWait = 10 * time.Second

// stateHolds reports whether the run's saved state already holds the effect of a request: the
// gradients of forward_backward fb, or the step of optim_step step (and which step that is).
// Read only for ops run again after their gateway died.
func (s *Server) stateHolds(run *trainingRun, fb, step string) (bool, int) {
	dir, err := s.savedState(run.id)
	if err != nil || dir == "" {
		return false, 0
	}
	rec := s.readGradientsRecord(dir)
	if step != "" {
		return rec.Applied == step, rec.Step
	}
	return slices.Contains(rec.ForwardBackwards, fb), rec.Step
}

func (s *Server) holdsGradients(run *trainingRun, fb string) bool {
	held, _ := s.stateHolds(run, fb, "")
	return held
}

// holdsStep is stateHolds for an optim_step's future: read only when it runs again.
func (s *Server) holdsStep(run *trainingRun, f *future) (bool, int) {
	if !f.replayed {
		return false, 0
	}
	return s.stateHolds(run, "", f.id)
}
