// Package replica runs one base model's compute: it holds a compute (an in-process engine with
// the shared base weights plus up to MaxLoras adapters, or a remote worker's) and runs all of its
// work on one worker goroutine, so ops on a replica never race; the worker shares its time
// between lanes (tenants) in turn.
//
// A replica owns its adapters' lifecycle (adapters.go: reload, create, save, evict) and its
// sampling (sampling.go: read-only sampler copies, batching of requests for the same weights),
// behind typed operations that take a context. The gateway orders each adapter's ops by seq_id
// before they get here (an adapter can move between replicas, so ordering cannot live in one of
// them) and keeps the adapters' durable records (StateKeeper); the router decides which replica
// holds which adapter. In-process and worker replicas are the same type over two computes. A
// Replica is a router.Endpoint.
package replica

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/skein-ai/skein/engine"
)

// DefaultMaxLoras is the adapter slots of a replica when none is configured.
const DefaultMaxLoras = 16

// Replica is one base model in memory.
//
// Its worker shares its time fairly between lanes (the gateway gives each tenant its own): it
// runs one op of each lane with queued work in turn, round-robin, rather than first come first
// served, so one tenant's long queue of big ops cannot keep another's one-token sample waiting
// behind all of it; within a lane ops run in the order they came.
type Replica struct {
	compute engine.Compute
	local   *engine.Engine // the in-process engine behind compute; nil for a remote worker

	id, baseModel string
	maxLoras      int
	logger        *slog.Logger // nil: slog.Default() (SetLogger)
	healthy       atomic.Bool
	queued        atomic.Int64 // ops accepted and not yet finished

	slots   chan struct{} // one per queued op: Run waits when the replica has maxQueued
	closing chan struct{} // closed by Close: waiting Runs give up
	mu      sync.Mutex
	wake    *sync.Cond
	lanes   map[string][]queuedOp // lane -> its queued ops, oldest first
	groups  map[string][]string   // group (a tenant) -> its lanes with queued ops, in turn order
	turns   []string              // groups with queued ops, in the order they get their next turn
	running string                // the lane of the op running now, if busy
	since   time.Time             // when the op running now started
	busy    bool
	closed  bool
	wg      sync.WaitGroup
	// Turns inside a long op (giveTurn): how many queued ops may run inside another, and
	// whether one is running inside another now (worker goroutine only).
	interleavable int
	inTurn        bool
	// turnWanted is signalled when an interleaved op is queued while another op runs: a remote
	// worker's compute waits on it during its call and gives the turn (engine.WithTurnWanted).
	turnWanted chan struct{}
	waits      map[string]LaneWait

	sampling   samplingState
	copies     copyLRU
	continuous atomic.Bool // SetContinuousBatching

	// fences: each resident training adapter's claim on its saved state (StateKeeper.Claim).
	fenceMu sync.Mutex
	fences  map[string]string
	// vouched: resident adapters the gateway adopted as they are (clean, at the step their saved
	// state records: gateway.adoptable), to be claimed without a reload (ensure).
	vouched map[string]bool
}

// maxQueued bounds the ops queued on one replica, all lanes together; Run waits past it.
const maxQueued = 4096

// ErrClosed is returned after Close.
var ErrClosed = errors.New("replica closed")

// New starts a replica over a compute: a loaded engine (see engine.Fork to share one base
// model's weights between replicas) or a worker's client. maxLoras ≤ 0 means DefaultMaxLoras.
func New(id, baseModel string, e engine.Compute, maxLoras int) *Replica {
	if maxLoras <= 0 {
		maxLoras = DefaultMaxLoras
	}
	r := &Replica{id: id, baseModel: baseModel, maxLoras: maxLoras, compute: e, local: localEngine(e),
		slots: make(chan struct{}, maxQueued), closing: make(chan struct{}), lanes: map[string][]queuedOp{},
		groups: map[string][]string{}, turnWanted: make(chan struct{}, 1)}
	r.sampling.limit = DefaultMaxQueuedSamples
	r.wake = sync.NewCond(&r.mu)
	r.healthy.Store(true)
	r.wg.Add(1)
	go r.loop()
	return r
}

// ID names the replica (X-Skein-Replica).
func (r *Replica) ID() string { return r.id }

// BaseModel is the base-model name clients use.
func (r *Replica) BaseModel() string { return r.baseModel }

// MaxLoras is the number of adapter slots.
func (r *Replica) MaxLoras() int { return r.maxLoras }

// Healthy reports whether the replica takes work.
func (r *Replica) Healthy() bool { return r.healthy.Load() }

// SetHealthy marks the replica up or down.
func (r *Replica) SetHealthy(ok bool) { r.healthy.Store(ok) }

// QueueDepth is the number of ops accepted and not finished (queued or running).
func (r *Replica) QueueDepth() int { return int(r.queued.Load()) }

func (r *Replica) loop() {
	defer r.wg.Done()
	for {
		lane, fn, ok := r.nextOp()
		if !ok {
			return
		}
		r.runOne(fn)
		r.doneOp(lane)
		<-r.slots
		r.queued.Add(-1)
	}
}

// queuedOp is an op waiting in its lane. An interleaved op (a sampling batch) may also run inside
// a long op of another lane, between its layers (giveTurn).
type queuedOp struct {
	fn          func()
	interleaved bool
	queued      time.Time
}

// LaneWait sums how long a group's ops (a tenant's, the sampling batches', the placements')
// waited in the queue before they ran.
type LaneWait struct {
	Ops     int64
	Seconds float64
}

// waited records that an op of group g starts now. Called holding r.mu.
func (r *Replica) waited(g string, op queuedOp) {
	if r.waits == nil {
		r.waits = map[string]LaneWait{}
	}
	w := r.waits[g]
	w.Ops++
	w.Seconds += time.Since(op.queued).Seconds()
	r.waits[g] = w
}

// Running reports how long the op running now has run (0 and false when the replica is idle),
// so that a long op shows as running, not as silence.
func (r *Replica) Running() (time.Duration, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.busy {
		return 0, false
	}
	return time.Since(r.since), true
}

// Resident is the memory of the in-process compute: its base weights (shared with the other
// replicas of the model) and its adapters; ok is false for a remote worker's.
func (r *Replica) Resident() (weights, adapters int, ok bool) {
	if r.local == nil {
		return 0, 0, false
	}
	return r.local.WeightBytes(), r.local.AdapterBytes(), true
}

// SamplerStats are the in-process engine's sampler counters (prompt positions requested,
// computed and served from the prefix cache; the cache's bytes), shared with the other replicas
// of the model (they share its base, and so its cache); ok is false for a remote worker's.
func (r *Replica) SamplerStats() (engine.SamplerStats, bool) {
	if r.local == nil {
		return engine.SamplerStats{}, false
	}
	return r.local.SamplerStats(), true
}

// LaneWaits is how long each group's ops waited so far, by group (a tenant, SamplingLane,
// PlacementLane).
func (r *Replica) LaneWaits() map[string]LaneWait {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.waits)
}

// Lanes and groups: a lane is one FIFO of ops (an adapter's, the sampling batches', the
// placements'); a group is whose turn it is (a tenant). Turns go round the groups, and within a
// group round its lanes: a tenant with many runs gets one turn like a tenant with one, and its
// runs share that turn in rotation. A lane named "group\x00name" (AdapterLane) is in that
// group; any other lane is a group of its own.

// AdapterLane is the lane of one adapter's ops, in its tenant's group.
func AdapterLane(group, adapter string) string { return group + "\x00" + adapter }

// groupOf is the group a lane takes its turns in.
func groupOf(lane string) string {
	if i := strings.IndexByte(lane, 0); i >= 0 {
		return lane[:i]
	}
	return lane
}

// nextOp waits for work and takes the oldest op of the next lane of the group whose turn it is.
// It reports false once closed and drained.
func (r *Replica) nextOp() (string, func(), bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for len(r.turns) == 0 {
		if r.closed {
			return "", nil, false
		}
		r.wake.Wait()
	}
	g := r.turns[0]
	r.turns = r.turns[1:]
	lane := r.groups[g][0]
	ops := r.lanes[lane]
	r.lanes[lane] = ops[1:]
	r.groups[g] = r.groups[g][1:]
	if len(r.lanes[lane]) > 0 {
		r.groups[g] = append(r.groups[g], lane) // its next op after the group's other lanes
	} else {
		delete(r.lanes, lane)
	}
	if ops[0].interleaved {
		r.interleavable--
	}
	r.waited(g, ops[0])
	r.running, r.busy, r.since = lane, true, time.Now()
	return lane, ops[0].fn, true
}

// doneOp ends a group's turn: if it has more queued (including ops that came while it ran), it
// goes to the back of the line, behind every group that waited meanwhile.
func (r *Replica) doneOp(lane string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.busy = false
	g := groupOf(lane)
	if len(r.groups[g]) > 0 {
		r.turns = append(r.turns, g)
	} else {
		delete(r.groups, g)
	}
}

// runOne runs an op; a panic (a bug) is logged and the worker goes on serving everyone else.
func (r *Replica) runOne(fn func()) {
	if err := r.protect(fn); err != nil {
		slog.Error("replica op panicked", "replica", r.id, "err", err, "stack", err.(*PanicError).Stack)
	}
}

// PanicError is a panic in work run on a replica, turned into an error: one broken op (or a
// worker's malformed answer) fails that op, never the replica or the process.
type PanicError struct {
	Replica string
	Value   any
	Stack   string
}

func (e *PanicError) Error() string {
	return fmt.Sprintf("internal error on replica %s: %v", e.Replica, e.Value)
}

// protect runs fn, returning a panic as a *PanicError.
func (r *Replica) protect(fn func()) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &PanicError{Replica: r.id, Value: v, Stack: string(debug.Stack())}
		}
	}()
	fn()
	return nil
}

// Close stops the worker after queued work finishes.
func (r *Replica) Close() {
	r.mu.Lock()
	if !r.closed {
		r.closed = true
		close(r.closing)
		r.wake.Broadcast()
	}
	r.mu.Unlock()
	r.wg.Wait()
}

// Run queues fn on the worker's shared lane; it does not wait.
func (r *Replica) Run(fn func()) error { return r.RunIn("", fn) }

// RunIn queues fn in a lane (a tenant, say): lanes take turns on the worker. It does not wait
// for fn, only, when the replica already has its maximum queued, for room.
func (r *Replica) RunIn(lane string, fn func()) error { return r.enqueue(lane, queuedOp{fn: fn}) }

func (r *Replica) enqueue(lane string, op queuedOp) error {
	select {
	case r.slots <- struct{}{}:
	case <-r.closing:
		return ErrClosed
	}
	return r.push(lane, op)
}

// errNoRoom: the replica has its maximum of ops queued.
var errNoRoom = errors.New("replica queue full")

// tryEnqueue is enqueue without waiting for room: errNoRoom when there is none.
func (r *Replica) tryEnqueue(lane string, op queuedOp) error {
	select {
	case r.slots <- struct{}{}:
	case <-r.closing:
		return ErrClosed
	default:
		return errNoRoom
	}
	return r.push(lane, op)
}

// push adds an op to its lane, holding a slot.
func (r *Replica) push(lane string, op queuedOp) error {
	op.queued = time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		<-r.slots
		return ErrClosed
	}
	r.queued.Add(1)
	// A lane joins its group's rotation when it gets work; a group joins the line when it gets
	// work, unless it is in line already or running now (doneOp puts it in line then).
	g := groupOf(lane)
	if len(r.lanes[lane]) == 0 {
		if len(r.groups[g]) == 0 && !(r.busy && groupOf(r.running) == g) {
			r.turns = append(r.turns, g)
		}
		r.groups[g] = append(r.groups[g], lane)
	}
	r.lanes[lane] = append(r.lanes[lane], op)
	if op.interleaved {
		r.interleavable++
		if r.busy {
			select { // one pending signal is enough: giveTurn takes every op queued by then
			case r.turnWanted <- struct{}{}:
			default:
			}
		}
	}
	r.wake.Signal()
	return nil
}

// giveTurn is called by the compute between the layers of a long op (engine.WithTurns), on the
// worker: it runs the interleaved ops (sampling batches) queued by then, so that another
// tenant's short sample waits about one layer, not the whole op. They read sampler copies and
// the base model, never the training adapter the op is changing; other ops wait for the op to
// end. An op run here gives no turns itself.
func (r *Replica) giveTurn() {
	if r.inTurn {
		return
	}
	r.mu.Lock()
	n := r.interleavable
	r.mu.Unlock()
	if n == 0 {
		return
	}
	r.inTurn = true
	defer func() { r.inTurn = false }()
	for range n { // those queued by now: a stream of new ones cannot hold the op up for ever
		fn, ok := r.takeInterleaved()
		if !ok {
			return
		}
		r.runOne(fn)
		<-r.slots
		r.queued.Add(-1)
	}
}

// takeInterleaved takes the oldest interleaved op of the first group in line that has one, or
// else of the running op's group (which is out of line while it runs).
func (r *Replica) takeInterleaved() (func(), bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	groups := r.turns
	if r.busy {
		groups = append(slices.Clone(r.turns), groupOf(r.running))
	}
	for _, g := range groups {
		for _, lane := range r.groups[g] {
			ops := r.lanes[lane]
			for i, op := range ops {
				if !op.interleaved {
					continue
				}
				r.lanes[lane] = slices.Delete(ops, i, i+1)
				r.interleavable--
				r.waited(g, op)
				if len(r.lanes[lane]) == 0 {
					delete(r.lanes, lane)
					r.groups[g] = slices.DeleteFunc(r.groups[g], func(l string) bool { return l == lane })
					if len(r.groups[g]) == 0 {
						delete(r.groups, g)
						r.turns = slices.DeleteFunc(r.turns, func(x string) bool { return x == g })
					}
				}
				return op.fn, true
			}
		}
	}
	return nil, false
}

// withTurns is ctx with giveTurn for the compute to call between layers, and the signal that
// one is wanted: a remote worker's compute runs no layers here, so it waits on the signal while
// its call is in flight and gives the turn then (the sampling batch goes to the worker, which
// runs it between the layers of the call in flight: issue 39's turns across the worker protocol).
func (r *Replica) withTurns(ctx context.Context) context.Context {
	return engine.WithTurnWanted(engine.WithTurns(ctx, r.giveTurn), r.turnWanted)
}

// Do runs fn on the worker's shared lane and waits for it (or for ctx to end; fn still runs then).
func (r *Replica) Do(ctx context.Context, fn func()) error { return r.DoIn(ctx, "", fn) }

// DoIn runs fn in a lane and waits for it (or for ctx to end; fn still runs then). A panic in fn
// is returned as a *PanicError.
func (r *Replica) DoIn(ctx context.Context, lane string, fn func()) error {
	done := make(chan struct{})
	var panicked error
	if err := r.RunIn(lane, func() {
		defer close(done)
		panicked = r.protect(fn)
	}); err != nil {
		return err
	}
	select {
	case <-done:
		return panicked
	case <-ctx.Done():
		return ctx.Err()
	}
}
