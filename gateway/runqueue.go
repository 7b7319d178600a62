package gateway

// The run queue: each training run's ops in seq_id order, one at a time, with its bounds on what
// may wait (runQueue, queueOf). Where an op then runs is replicas.go's.

import (
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"slices"
	"sync"
)

// runQueue orders one training run's ops by seq_id, buffering early arrivals, and feeds them one
// at a time to the run's dispatcher. Ordering lives here, in the gateway, rather than in a replica,
// because an adapter may move between replicas (evicted, reloaded elsewhere) between two ops.
//
// What a run may hold queued (buffered early arrivals and ready ops not yet running) is bounded in
// count and bytes: a client cannot pin memory by sending seq_ids far ahead of the next one. A
// request reserves its room before it is validated and queued, so the bound holds under
// concurrency; past it the request is refused (429) and consumes nothing, for the client to retry.
type runQueue struct {
	mu       sync.Mutex
	next     int // next seq_id to run; -1: the first to arrive (after a restart)
	pending  map[int]queuedOp
	ready    []queuedOp
	running  bool
	ops      int   // reserved: queued or about to be
	bytes    int64 // reserved bytes of those
	maxOps   int   // ≤ 0: unbounded
	maxBytes int64 // ≤ 0: unbounded
	// budget is the server-wide account of queued bytes (per tenant and in total) this run's
	// reservations are also charged to; nil: none.
	budget *queueBudget
	tenant string
}

// queueBudget bounds the queued bytes of all runs together: per tenant (a tenant has several
// runs) and across the server (open mode has any number of tenants). A run's own bound alone
// would let memory grow with the number of runs.
type queueBudget struct {
	mu        sync.Mutex
	byTenant  map[string]int64
	total     int64
	maxTenant int64 // ≤ 0: unbounded
	maxTotal  int64 // ≤ 0: unbounded
}

func newQueueBudget(maxTenant, maxTotal int64) *queueBudget {
	return &queueBudget{byTenant: map[string]int64{}, maxTenant: maxTenant, maxTotal: maxTotal}
}

// take charges cost to tenant; with check, only if that stays within both bounds.
func (b *queueBudget) take(tenant string, cost int64, check bool) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if check {
		if b.maxTenant > 0 && b.byTenant[tenant]+cost > b.maxTenant {
			return fmt.Errorf("%w: your queued requests hold about %d bytes and this one %d (limit %d per tenant, tenant_queue_bytes); wait for earlier results (or send the missing seq_ids) and retry", errQueueFull, b.byTenant[tenant], cost, b.maxTenant)
		}
		if b.maxTotal > 0 && b.total+cost > b.maxTotal {
			return fmt.Errorf("%w: the server's queued requests hold about %d bytes and this one %d (limit %d, total_queue_bytes); retry later", errQueueFull, b.total, cost, b.maxTotal)
		}
	}
	b.byTenant[tenant] += cost
	b.total += cost
	return nil
}

func (b *queueBudget) give(tenant string, cost int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.total -= cost
	if b.byTenant[tenant] -= cost; b.byTenant[tenant] <= 0 {
		delete(b.byTenant, tenant) // no entry per tenant that holds nothing
	}
}

type queuedOp struct {
	run  func()
	cost int64
}

func newRunQueue(next int) *runQueue { return &runQueue{next: next, pending: map[int]queuedOp{}} }

// errQueueFull is the typed error of a run whose queue is at its bound.
var errQueueFull = errors.New("queue full")

// reserve makes room for op number seq of cost bytes, or says why there is none. The next seq_id
// is let in over the run's bounds when ops wait for it, since it is what releases them; so is one
// op alone on its run, so that a request within the body limit runs even if it is larger than
// the byte bound. An op that cannot run yet (a seq_id ahead of the next) is also held to the
// tenant's and the server's bounds: those keep memory bounded whatever the number of runs, while
// ready ops, bounded per run, drain by themselves (so one tenant's parked ops never refuse
// another tenant's runnable ones).
func (q *runQueue) reserve(seq int, cost int64) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	// runnable: it joins the ready ops (which drain by themselves) rather than waiting for a
	// missing seq_id; releases: it is the missing one that buffered ops wait for.
	runnable := seq <= 0 || seq == q.next || q.next == -1
	releases := seq > 0 && seq == q.next && len(q.pending) > 0
	if q.budget != nil {
		if err := q.budget.take(q.tenant, cost, !runnable); err != nil {
			return err
		}
	}
	if q.ops > 0 && !releases {
		if q.maxOps > 0 && q.ops >= q.maxOps {
			q.giveBudget(cost)
			return fmt.Errorf("%w: the model already has %d requests queued (limit %d); wait for earlier results (or send the missing seq_ids) and retry", errQueueFull, q.ops, q.maxOps)
		}
		if q.maxBytes > 0 && q.bytes+cost > q.maxBytes {
			q.giveBudget(cost)
			return fmt.Errorf("%w: the model's queued requests hold %d bytes and this one %d (limit %d); wait for earlier results (or send the missing seq_ids) and retry", errQueueFull, q.bytes, cost, q.maxBytes)
		}
	}
	q.ops++
	q.bytes += cost
	return nil
}

// release gives back a reservation that was not queued.
func (q *runQueue) release(cost int64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.releaseLocked(cost)
}

func (q *runQueue) releaseLocked(cost int64) {
	q.ops--
	q.bytes -= cost
	q.giveBudget(cost)
}

func (q *runQueue) giveBudget(cost int64) {
	if q.budget != nil {
		q.budget.give(q.tenant, cost)
	}
}

// submit queues op number seq (seq ≤ 0: no seq_id, runs in arrival order) under a reservation of
// cost made by reserve; on error the reservation is given back.
func (q *runQueue) submit(seq int, cost int64, op func()) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	qo := queuedOp{run: op, cost: cost}
	if seq <= 0 {
		q.ready = append(q.ready, qo)
	} else {
		if q.next == -1 {
			q.next = seq
		}
		if seq < q.next {
			q.releaseLocked(cost)
			return fmt.Errorf("seq_id %d already ran (the next expected is %d)", seq, q.next)
		}
		if _, dup := q.pending[seq]; dup {
			q.releaseLocked(cost)
			return fmt.Errorf("seq_id %d is already queued", seq)
		}
		q.pending[seq] = qo
		for {
			f, ok := q.pending[q.next]
			if !ok {
				break
			}
			delete(q.pending, q.next)
			q.next++
			q.ready = append(q.ready, f)
		}
	}
	if !q.running && len(q.ready) > 0 {
		q.running = true
		go q.drain()
	}
	return nil
}

// skip consumes seq's slot with no work, under a reservation of cost: a sequenced request that
// failed before it was queued must not leave the run waiting for it forever.
func (q *runQueue) skip(seq int, cost int64) {
	if seq <= 0 {
		q.release(cost)
		return
	}
	// The bytes go back now; the slot (one op, of no bytes) when it drains.
	q.mu.Lock()
	q.bytes -= cost
	q.giveBudget(cost)
	q.mu.Unlock()
	_ = q.submit(seq, 0, func() {}) // an error means the slot is already taken: nothing to do
}

// abandon moves every buffered op to the ready ones, in seq_id order, for a run that can never
// run again (unloaded, or its session expired): each ends its future saying so (see
// submitOrderedSized) and gives back what it held, rather than holding it until the run is
// forgotten. Later seq_ids go on after the last of them.
func (q *runQueue) abandon() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.pending) == 0 {
		return
	}
	seqs := make([]int, 0, len(q.pending))
	for seq := range q.pending {
		seqs = append(seqs, seq)
	}
	slices.Sort(seqs)
	for _, seq := range seqs {
		q.ready = append(q.ready, q.pending[seq])
		delete(q.pending, seq)
	}
	q.next = seqs[len(seqs)-1] + 1
	if !q.running {
		q.running = true
		go q.drain()
	}
}

// drain runs ready ops one after another; each op itself routes to a replica and waits.
func (q *runQueue) drain() {
	for {
		q.mu.Lock()
		if len(q.ready) == 0 {
			q.running = false
			q.mu.Unlock()
			return
		}
		op := q.ready[0]
		q.ready = q.ready[1:]
		q.releaseLocked(op.cost) // running now: no longer buffered
		q.mu.Unlock()
		runRecovered(op.run)
	}
}

// runRecovered runs an op and logs a panic rather than letting it end the process (and with it
// every tenant's work); the op itself ends its future on a panic (see submitOrdered).
func runRecovered(op func()) {
	defer func() {
		if v := recover(); v != nil {
			slog.Error("queued op panicked", "panic", v, "stack", string(debug.Stack()))
		}
	}()
	op()
}

func (s *Server) queueOf(run *trainingRun) *runQueue {
	s.runs.mu.Lock()
	defer s.runs.mu.Unlock()
	if run.queue == nil {
		run.queue = newRunQueue(1)
	}
	run.queue.mu.Lock()
	run.queue.maxOps, run.queue.maxBytes = s.opts.MaxRunQueueOps, s.opts.MaxRunQueueBytes
	if run.queue.budget == nil && run.queue.ops == 0 { // set once, before any reservation: each is given back where it was charged
		run.queue.budget, run.queue.tenant = s.queued, run.tenant
	}
	run.queue.mu.Unlock()
	return run.queue
}
