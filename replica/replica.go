// Package replica runs one base model's compute: it holds the engine (the shared base weights
// plus up to MaxLoras adapters) and executes each adapter's ops strictly in seq_id order,
// buffering early arrivals. All compute on a replica runs on one worker, so ops never race.
package replica

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/skein-ai/skein/engine"
)

// Replica is one base model in memory.
type Replica struct {
	ID     string
	Name   string // base model name clients use
	Engine *engine.Engine

	work chan func()
	mu   sync.Mutex
	// per adapter: the next seq_id to run and the ops that arrived early
	queues map[string]*queue
	closed bool
	wg     sync.WaitGroup
}

type queue struct {
	next    int
	pending map[int]func()
}

// ErrClosed is returned after Close.
var ErrClosed = errors.New("replica closed")

// New starts a replica over a loaded engine.
func New(id, name string, e *engine.Engine) *Replica {
	r := &Replica{ID: id, Name: name, Engine: e, work: make(chan func(), 4096), queues: map[string]*queue{}}
	r.wg.Add(1)
	go r.loop()
	return r
}

func (r *Replica) loop() {
	defer r.wg.Done()
	for fn := range r.work {
		fn()
	}
}

// Close stops the worker after queued work finishes.
func (r *Replica) Close() {
	r.mu.Lock()
	if !r.closed {
		r.closed = true
		close(r.work)
	}
	r.mu.Unlock()
	r.wg.Wait()
}

// Run executes fn on the worker, unordered (sampling, creation, unload). It does not wait.
func (r *Replica) Run(fn func()) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return ErrClosed
	}
	r.work <- fn
	return nil
}

// RunOrdered executes fn as adapter's op number seq: ops of one adapter run in seq order, an op
// that arrives before its predecessors waits for them. seq ≤ 0 means "no seq": run in arrival
// order. The first ordered op of an adapter may have any seq; later ones continue from it.
func (r *Replica) RunOrdered(adapter string, seq int, fn func()) error {
	if seq <= 0 {
		return r.Run(fn)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return ErrClosed
	}
	q := r.queues[adapter]
	if q == nil {
		q = &queue{next: 1, pending: map[int]func(){}}
		r.queues[adapter] = q
	}
	if q.next == -1 {
		q.next = seq
	}
	if seq < q.next {
		return fmt.Errorf("seq_id %d of %s already ran (next is %d)", seq, adapter, q.next)
	}
	if _, dup := q.pending[seq]; dup {
		return fmt.Errorf("seq_id %d of %s is already queued", seq, adapter)
	}
	q.pending[seq] = fn
	for {
		f, ok := q.pending[q.next]
		if !ok {
			break
		}
		delete(q.pending, q.next)
		q.next++
		r.work <- f
	}
	return nil
}

// Resume restarts an adapter's ordering after a restart: the first ordered op that arrives sets
// where its sequence goes on (the ops before it ran in the previous process or were lost with it).
func (r *Replica) Resume(adapter string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.queues[adapter] = &queue{next: -1, pending: map[int]func(){}}
}

// Waiting reports how many ops of an adapter wait for an earlier seq_id.
func (r *Replica) Waiting(adapter string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if q := r.queues[adapter]; q != nil {
		return len(q.pending)
	}
	return 0
}

// Forget drops an adapter's ordering state (after unload).
func (r *Replica) Forget(adapter string) {
	r.mu.Lock()
	delete(r.queues, adapter)
	r.mu.Unlock()
}

// Do runs fn on the worker and waits for it (for synchronous admin work).
func (r *Replica) Do(ctx context.Context, fn func()) error {
	done := make(chan struct{})
	if err := r.Run(func() { fn(); close(done) }); err != nil {
		return err
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
