// Package replica runs one base model's compute: it holds an engine (the shared base weights
// plus up to MaxLoras adapters) and runs all of its work on one worker goroutine, so ops on a
// replica never race. The gateway orders each adapter's ops by seq_id before they get here (an
// adapter can move between replicas, so ordering cannot live in one of them); the router decides
// which replica holds which adapter. A Replica is a router.Endpoint.
package replica

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"sync/atomic"

	"github.com/skein-ai/skein/engine"
)

// DefaultMaxLoras is the adapter slots of a replica when none is configured.
const DefaultMaxLoras = 16

// Replica is one base model in memory.
type Replica struct {
	Engine engine.Compute

	id, baseModel string
	maxLoras      int
	healthy       atomic.Bool
	queued        atomic.Int64 // ops accepted and not yet finished

	work   chan func()
	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup
}

// ErrClosed is returned after Close.
var ErrClosed = errors.New("replica closed")

// New starts a replica over a loaded engine (see engine.Fork to share one base model's weights
// between replicas). maxLoras ≤ 0 means DefaultMaxLoras.
func New(id, baseModel string, e engine.Compute, maxLoras int) *Replica {
	if maxLoras <= 0 {
		maxLoras = DefaultMaxLoras
	}
	r := &Replica{id: id, baseModel: baseModel, maxLoras: maxLoras, Engine: e, work: make(chan func(), 4096)}
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
	for fn := range r.work {
		if err := r.protect(fn); err != nil {
			slog.Error("replica work panicked", "replica", r.id, "err", err)
		}
		r.queued.Add(-1)
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
		close(r.work)
	}
	r.mu.Unlock()
	r.wg.Wait()
}

// Run queues fn on the worker; it does not wait.
func (r *Replica) Run(fn func()) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return ErrClosed
	}
	r.queued.Add(1)
	r.work <- fn
	return nil
}

// Do runs fn on the worker and waits for it (or for ctx to end; fn still runs then). A panic in
// fn is returned as a *PanicError.
func (r *Replica) Do(ctx context.Context, fn func()) error {
	done := make(chan struct{})
	var panicked error
	if err := r.Run(func() {
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
