package gateway

import (
	"context"
	"encoding/json"
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
	waiting                 int  // long-polls parked on this future
	finishing               bool // a terminal state is being recorded
}

type futureTable struct {
	mu     sync.Mutex
	seq    uint64
	prefix string
	byID   map[string]*future
	ttl    time.Duration
	st     store.Store
	log    *slog.Logger
}

func newFutureTable(prefix string, ttl time.Duration, st store.Store, log *slog.Logger) *futureTable {
	return &futureTable{prefix: prefix, byID: map[string]*future{}, ttl: ttl, st: st, log: log}
}

// create registers a pending future. With opKey set, a second create with the same key returns
// the first future and false (a retried request is answered with the original request id, also
// across a restart, since the store enforces the key).
func (t *futureTable) create(tenant, kind, opKey string) (*future, bool, error) {
	t.mu.Lock()
	t.seq++
	id := fmt.Sprintf("%s-%d", t.prefix, t.seq)
	t.mu.Unlock()
	now := time.Now()
	row, fresh, err := t.st.CreateFuture(context.Background(), store.Future{ID: id, Tenant: tenant, Kind: kind, OpKey: opKey, Created: now})
	if err != nil {
		return nil, false, fmt.Errorf("recording request: %w", err)
	}
	if !fresh {
		f := t.get(row.Tenant, row.ID)
		if f == nil {
			return nil, false, fmt.Errorf("request %s vanished", row.ID)
		}
		return f, false, nil
	}
	f := &future{id: id, tenant: tenant, kind: kind, created: now, done: make(chan struct{}), queueState: "active"}
	t.mu.Lock()
	t.byID[id] = f
	t.mu.Unlock()
	return f, true, nil
}

// get returns a tenant's future, from memory or (after a restart) from the store; another
// tenant's is as absent as a missing one.
func (t *futureTable) get(tenant, id string) *future {
	t.mu.Lock()
	f := t.byID[id]
	t.mu.Unlock()
	if f != nil {
		if f.tenant != tenant {
			return nil
		}
		return f
	}
	row, err := t.st.GetFuture(context.Background(), id)
	if err != nil || row.Tenant != tenant || row.State == store.FuturePending {
		// A pending row with no waiter in memory belongs to a dead process; FailPending ends it at start.
		return nil
	}
	f = &future{id: row.ID, tenant: row.Tenant, kind: row.Kind, created: row.Created, done: make(chan struct{})}
	if row.State == store.FutureFailed {
		f.errMsg, f.category = string(row.Result), row.Category
	} else {
		f.result = decodeResult(row.Kind, row.Result)
	}
	close(f.done)
	return f
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
	t.mu.Unlock()
	// The durable write comes first: a result a client has seen must survive a crash.
	if _, err := t.st.FinishFuture(context.Background(), f.id, state, payload, category); err != nil {
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

func (t *futureTable) queueState(f *future) (string, string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return f.queueState, f.queueReason
}

// sweep forgets completed futures older than the retention time, in memory and in the store.
func (t *futureTable) sweep(now time.Time) int {
	t.mu.Lock()
	n := 0
	for id, f := range t.byID {
		select {
		case <-f.done:
			if now.Sub(f.created) > t.ttl {
				delete(t.byID, id)
				n++
			}
		default:
		}
	}
	t.mu.Unlock()
	if _, err := t.st.SweepFutures(context.Background(), now.Add(-t.ttl)); err != nil {
		t.log.Error("sweeping futures", "err", err)
	}
	return n
}

// wait parks until the future is terminal, the timeout passes or cancel closes; it reports
// whether the future is done.
func (t *futureTable) wait(f *future, timeout time.Duration, cancel <-chan struct{}) bool {
	t.mu.Lock()
	f.waiting++
	t.mu.Unlock()
	defer func() {
		t.mu.Lock()
		f.waiting--
		t.mu.Unlock()
	}()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-f.done:
		return true
	case <-timer.C:
	case <-cancel:
	}
	return false
}

func (t *futureTable) waiters(f *future) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return f.waiting
}
