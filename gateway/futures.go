package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/store"
)

// future is one asynchronous request. It reaches exactly one terminal state (result or error),
// and that state never changes; done is closed at that moment, waking every long-poll at once.
// The store holds the durable copy; this struct is what waiters park on.
type future struct {
	id       string
	tenant   string
	kind     string // CreateModel, ForwardBackward, Sample, ...
	created  time.Time
	done     chan struct{}
	result   any    // JSON-able result, or *api.ForwardBackwardOutput / *api.SampleResponse
	errMsg   string // failure message
	category string // "user" or "server" on failure
	// queueState is what a pending future reports in try_again ("active", "paused_capacity").
	queueState, queueReason string
	waiting                 int    // long-polls parked on this future
	finishing               bool   // a terminal state is being recorded
	remote                  bool   // running on another gateway: wakes on its notification
	replica                 string // the replica that ran it
	// fence, for a sequenced op under a run lease, makes its result count only while this
	// gateway still holds the run at that epoch (store.FinishFutureFenced).
	fence *store.Fence
	// replayed: the op was acknowledged by a gateway that died, and runs again here.
	replayed bool
	// stored: its request is in the store, so the run's next holder can run it (a sequenced op
	// under a lease); without it, a refused result ends the future as an error instead.
	stored bool
}

type futureTable struct {
	mu     sync.Mutex
	seq    uint64
	prefix string // this gateway's instance id, also the owner of the futures it runs
	byID   map[string]*future
	ttl    time.Duration
	st     store.Store
	log    *slog.Logger
	// remotePoll is how often a wait on another gateway's future re-reads the store, in case a
	// notification was lost.
	remotePoll time.Duration
}

func newFutureTable(prefix string, ttl, remotePoll time.Duration, st store.Store, log *slog.Logger) *futureTable {
	return &futureTable{prefix: prefix, byID: map[string]*future{}, ttl: ttl, remotePoll: remotePoll, st: st, log: log}
}

// create registers a pending future. With opKey set, a second create with the same key returns
// the first future and false (a retried request is answered with the original request id, also
// across a restart, since the store enforces the key).
func (t *futureTable) create(tenant, kind, opKey string) (*future, bool, error) {
	return t.createOp(tenant, kind, opKey, "", nil, nil, "")
}

// createOp is create for a run's sequenced op: with a fence (a run lease), the future keeps its
// run and request, so that the run's next holder can run it; with replay, the future of that id
// (acknowledged by a gateway that died) is adopted rather than created.
func (t *futureTable) createOp(tenant, kind, opKey, run string, request []byte, fence *store.Fence, replay string) (*future, bool, error) {
	t.mu.Lock()
	t.seq++
	id := fmt.Sprintf("%s-%d", t.prefix, t.seq)
	t.mu.Unlock()
	now := time.Now()
	row := store.Future{ID: id, Tenant: tenant, Kind: kind, OpKey: opKey, Owner: t.prefix, Created: now}
	stored := fence != nil && opKey != "" && request != nil
	if stored {
		row.Run, row.Request = run, request
	}
	row, fresh, err := t.st.CreateFuture(context.Background(), row)
	if err != nil {
		return nil, false, fmt.Errorf("recording request: %w", err)
	}
	if !fresh && replay != "" && row.ID == replay && row.State == store.FuturePending {
		f, err := t.adopt(row, fence)
		return f, err == nil, err
	}
	if !fresh {
		f, err := t.get(row.Tenant, row.ID)
		if err != nil {
			return nil, false, fmt.Errorf("reading request %s: %w", row.ID, err)
		}
		if f == nil {
			return nil, false, fmt.Errorf("request %s vanished", row.ID)
		}
		return f, false, nil
	}
	f := &future{id: id, tenant: tenant, kind: kind, created: now, done: make(chan struct{}), queueState: "active", fence: fence, stored: stored}
	t.mu.Lock()
	t.byID[id] = f
	t.mu.Unlock()
	return f, true, nil
}

// adopt makes a pending future another gateway acknowledged this gateway's to run (see
// takeOver). Long-polls already parked on it here (as a remote future) are woken by its result.
func (t *futureTable) adopt(row store.Future, fence *store.Fence) (*future, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	f := t.byID[row.ID]
	if f != nil {
		select {
		case <-f.done:
			return nil, fmt.Errorf("request %s already finished", row.ID)
		default:
		}
		f.remote, f.finishing = false, false
	} else {
		f = &future{id: row.ID, tenant: row.Tenant, kind: row.Kind, created: row.Created, done: make(chan struct{}), queueState: "active"}
		t.byID[row.ID] = f
	}
	f.fence, f.replayed, f.stored = fence, true, true
	return f, nil
}

// movedMsg ends a request of a run another gateway took while it was queued or running here,
// when its request was not kept for the new gateway to run.
const movedMsg = "another gateway took this model over while the request ran; submit it again"

// handOver leaves a pending future to the gateway that now holds its run: it is waited on as
// another gateway's. One whose request was not kept ends as an error instead.
func (t *futureTable) handOver(f *future) {
	if !f.stored {
		t.fail(f, "server", movedMsg)
		return
	}
	t.mu.Lock()
	if f.finishing {
		t.mu.Unlock()
		return
	}
	f.remote, f.finishing = true, true
	t.mu.Unlock()
	t.remoteDone(f.id)
}

// adopted is a future adopted here, if it is still pending.
func (t *futureTable) adopted(id string) *future {
	t.mu.Lock()
	defer t.mu.Unlock()
	f := t.byID[id]
	if f == nil || !f.replayed || f.finishing {
		return nil
	}
	return f
}

// get returns a tenant's future, from memory or from the store (after a restart, or when another
// gateway runs it); another tenant's is as absent as a missing one (nil). An error is a store
// that did not answer: the future may well exist, and the client should ask again.
func (t *futureTable) get(tenant, id string) (*future, error) {
	t.mu.Lock()
	f := t.byID[id]
	t.mu.Unlock()
	if f != nil {
		if f.tenant != tenant {
			return nil, nil
		}
		return f, nil
	}
	row, err := t.st.GetFuture(context.Background(), id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if row.Tenant != tenant || (row.State == store.FuturePending && row.Owner == t.prefix) {
		return nil, nil
	}
	f = &future{id: row.ID, tenant: row.Tenant, kind: row.Kind, created: row.Created, done: make(chan struct{}), queueState: "active"}
	if row.State == store.FuturePending {
		// Another gateway runs it; its completion arrives as a notification (see remoteDone).
		f.remote, f.finishing = true, true
		t.mu.Lock()
		existing := t.byID[id]
		if existing != nil {
			f = existing
		} else {
			t.byID[id] = f
		}
		t.mu.Unlock()
		if existing == nil {
			// Its completion may have been notified between the read above and the registration,
			// when remoteDone could not find it: read it once more now that notices reach it.
			t.remoteDone(id)
		}
		return f, nil
	}
	t.fill(f, row)
	close(f.done)
	return f, nil
}

func (t *futureTable) fill(f *future, row store.Future) {
	if row.State == store.FutureFailed {
		f.errMsg, f.category = string(row.Result), row.Category
	} else {
		f.result = decodeResult(row.Kind, row.Result)
	}
}

// recheckRemote re-reads every future other gateways run that is still waited on here: the
// notification listener calls it each time it (re)connects, since notices sent while it was not
// listening are lost.
func (t *futureTable) recheckRemote() {
	t.mu.Lock()
	var ids []string
	for id, f := range t.byID {
		if !f.remote {
			continue
		}
		select {
		case <-f.done:
		default:
			ids = append(ids, id)
		}
	}
	t.mu.Unlock()
	for _, id := range ids {
		t.remoteDone(id)
	}
}

// remoteDone completes a future another gateway finished, waking local waiters at once.
func (t *futureTable) remoteDone(id string) {
	t.mu.Lock()
	f := t.byID[id]
	t.mu.Unlock()
	if f == nil || !f.remote {
		return
	}
	row, err := t.st.GetFuture(context.Background(), id)
	if err != nil || row.State == store.FuturePending {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	select {
	case <-f.done:
	default:
		t.fill(f, row)
		close(f.done)
	}
}

// decodeResult turns a stored result back into what retrieve_future serves.
func decodeResult(kind string, b []byte) any {
	switch kind {
	case "ForwardBackward", "Forward":
		var o api.ForwardBackwardOutput
		if json.Unmarshal(b, &o) == nil {
			return &o
		}
	case "Sample":
		var o api.SampleResponse
		if json.Unmarshal(b, &o) == nil {
			return &o
		}
	}
	return json.RawMessage(b)
}

func (t *futureTable) complete(f *future, result any) {
	b, err := json.Marshal(result)
	if err != nil {
		t.fail(f, "server", fmt.Sprintf("encoding result: %v", err))
		return
	}
	t.finish(f, store.FutureComplete, b, "", func() { f.result = result })
}

func (t *futureTable) fail(f *future, category, msg string) {
	t.finish(f, store.FutureFailed, []byte(msg), category, func() { f.category, f.errMsg = category, msg })
}

func (t *futureTable) finish(f *future, state string, payload []byte, category string, set func()) {
	t.mu.Lock()
	if f.finishing {
		t.mu.Unlock()
		return // a terminal state was already chosen
	}
	f.finishing = true
	fence := f.fence
	t.mu.Unlock()
	// The durable write comes first: a result a client has seen must survive a crash.
	if fence != nil {
		err := durably(func() error {
			_, err := t.st.FinishFutureFenced(context.Background(), f.id, state, payload, category, *fence)
			return err
		})
		if errors.Is(err, store.ErrFenced) && !f.stored {
			// Nobody can run it again (its request was not kept): it ends as an error.
			state, payload, category = store.FutureFailed, []byte(movedMsg), "server"
			set = func() { f.category, f.errMsg = category, movedMsg }
			err = durably(func() error {
				_, err := t.st.FinishFuture(context.Background(), f.id, state, payload, category)
				return err
			})
		}
		if errors.Is(err, store.ErrFenced) {
			// Another gateway took the run: its holder runs this op again and stores the one
			// result; waiters here wait for it as for any other gateway's.
			t.log.Warn("a result of a run this gateway lost was refused; its new holder runs it", "id", f.id, "err", err)
			t.mu.Lock()
			f.remote = true
			t.mu.Unlock()
			t.remoteDone(f.id)
			return
		}
		if err != nil {
			t.log.Error("storing future result", "id", f.id, "err", err)
		}
	} else if err := durably(func() error {
		_, err := t.st.FinishFuture(context.Background(), f.id, state, payload, category)
		return err
	}); err != nil {
		t.log.Error("storing future result", "id", f.id, "err", err)
	}
	t.mu.Lock()
	set()
	close(f.done)
	t.mu.Unlock()
}

func (t *futureTable) setQueueState(f *future, state, reason string) {
	t.mu.Lock()
	f.queueState, f.queueReason = state, reason
	t.mu.Unlock()
}

// setReplica records which replica ran a future (reported as X-Skein-Replica).
func (t *futureTable) setReplica(f *future, id string) {
	t.mu.Lock()
	f.replica = id
	t.mu.Unlock()
}

func (t *futureTable) replicaOf(f *future) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return f.replica
}

func (t *futureTable) queueState(f *future) (string, string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return f.queueState, f.queueReason
}

// memoryTTL is how long a finished future's result stays in memory. Clients fetch results at
// once; later reads come from the store, which keeps them for the full retention time. (Keeping a
// day of forward_backward outputs in memory would grow without bound on a busy server.)
const memoryTTL = 2 * time.Minute

// sweep forgets finished futures from memory after memoryTTL; withStore also deletes those older
// than the retention time from the store (the gateway holding the sweep lease does that).
func (t *futureTable) sweep(now time.Time, withStore bool) int {
	t.mu.Lock()
	n := 0
	for id, f := range t.byID {
		select {
		case <-f.done:
			if now.Sub(f.created) > min(t.ttl, memoryTTL) {
				delete(t.byID, id)
				n++
			}
		default:
		}
	}
	t.mu.Unlock()
	if withStore {
		if _, err := t.st.SweepFutures(context.Background(), now.Add(-t.ttl)); err != nil {
			t.log.Error("sweeping futures", "err", err)
		}
	}
	return n
}

// wait parks until the future is terminal, the timeout passes or cancel closes; it reports
// whether the future is done.
func (t *futureTable) wait(f *future, timeout time.Duration, cancel <-chan struct{}) bool {
	select {
	case <-f.done: // answered already (most retrieves of a finished future): no timer, no waiter count
		return true
	default:
	}
	t.mu.Lock()
	f.waiting++
	remote := f.remote // adopt writes it under t.mu when a takeover makes the future this gateway's
	t.mu.Unlock()
	defer func() {
		t.mu.Lock()
		f.waiting--
		t.mu.Unlock()
	}()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	var poll <-chan time.Time
	if remote { // notifications can be missed (a dropped connection): check the store now and then
		tick := time.NewTicker(t.remotePoll)
		defer tick.Stop()
		poll = tick.C
	}
	for {
		select {
		case <-f.done:
			return true
		case <-poll:
			t.remoteDone(f.id)
		case <-timer.C:
			return false
		case <-cancel:
			return false
		}
	}
}

func (t *futureTable) waiters(f *future) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return f.waiting
}

// storeRetryFor is how long a result's write is retried while the store does not answer (a
// PostgreSQL restart or failover takes seconds). A result only in memory would be lost to a
// client asking another gateway, and run again by its run's next holder.
var storeRetryFor = 30 * time.Second

// durably runs a store write until it succeeds, is fenced (a decision, not a failure), or has
// failed for storeRetryFor, backing off from 50 ms to 2 s; it returns the last error.
func durably(write func() error) error {
	deadline := time.Now().Add(storeRetryFor)
	wait := 50 * time.Millisecond
	for {
		err := write()
		if err == nil || errors.Is(err, store.ErrFenced) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(wait)
		wait = min(2*wait, 2*time.Second)
	}
}

// drain waits until every future this gateway runs has ended, or until deadline: a gateway that
// stops gracefully finishes the requests it acknowledged (samples in flight; sequenced ops also
// wait in their run queues) rather than leave them to be failed as a dead gateway's.
func (t *futureTable) drain(deadline time.Time) {
	for time.Now().Before(deadline) {
		running := 0
		t.mu.Lock()
		for _, f := range t.byID {
			if f.remote {
				continue
			}
			select {
			case <-f.done:
			default:
				running++
			}
		}
		t.mu.Unlock()
		if running == 0 {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}
