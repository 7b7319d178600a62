package gateway

import (
	"fmt"
	"sync"
	"time"
)

// future is one asynchronous request. It reaches exactly one terminal state (result or error),
// and that state never changes; done is closed at that moment, waking every long-poll at once.
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
	waiting                 int // long-polls parked on this future (for benchmarks and metrics)
}

type futureTable struct {
	mu      sync.Mutex
	seq     uint64
	prefix  string
	byID    map[string]*future
	byOpKey map[string]string // "model_id#seq" -> request id, to answer retries with the original
	ttl     time.Duration
}

func newFutureTable(prefix string, ttl time.Duration) *futureTable {
	return &futureTable{prefix: prefix, byID: map[string]*future{}, byOpKey: map[string]string{}, ttl: ttl}
}

// create registers a pending future. With opKey set, a second create with the same key returns
// the first future and false.
func (t *futureTable) create(tenant, kind, opKey string) (*future, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if opKey != "" {
		if id, ok := t.byOpKey[opKey]; ok {
			if f, ok := t.byID[id]; ok {
				return f, false
			}
		}
	}
	t.seq++
	f := &future{id: fmt.Sprintf("%s-%d", t.prefix, t.seq), tenant: tenant, kind: kind, created: time.Now(),
		done: make(chan struct{}), queueState: "active"}
	t.byID[f.id] = f
	if opKey != "" {
		t.byOpKey[opKey] = f.id
	}
	return f, true
}

// get returns a tenant's future; another tenant's is as absent as a missing one.
func (t *futureTable) get(tenant, id string) *future {
	t.mu.Lock()
	defer t.mu.Unlock()
	f := t.byID[id]
	if f == nil || f.tenant != tenant {
		return nil
	}
	return f
}

func (t *futureTable) complete(f *future, result any) {
	t.mu.Lock()
	defer t.mu.Unlock()
	select {
	case <-f.done:
		return // terminal already
	default:
	}
	f.result = result
	close(f.done)
}

func (t *futureTable) fail(f *future, category, msg string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	select {
	case <-f.done:
		return
	default:
	}
	f.category, f.errMsg = category, msg
	close(f.done)
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

// sweep forgets completed futures older than the retention time.
func (t *futureTable) sweep(now time.Time) int {
	t.mu.Lock()
	defer t.mu.Unlock()
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
	for k, id := range t.byOpKey {
		if _, ok := t.byID[id]; !ok {
			delete(t.byOpKey, k)
		}
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
