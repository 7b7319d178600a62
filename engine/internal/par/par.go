// Package par spreads a loop over rows across the cores: the backends' kernels use it, and so
// does host-side work over rows that have reached the host (the sampler's draws).
package par

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Rows calls fn on GOMAXPROCS contiguous parts of [0, n) at once (fewer when n is small) and
// waits for them. A panic in fn is raised again on the caller's goroutine once every part has
// ended (the others may still be writing what the caller owns).
//
// A pool of worker goroutines takes the parts; a worker spins for a while (spinFor) after its
// last part before it sleeps, and the caller runs the first part, then any part no worker has
// claimed yet, then spins until the rest end. A decode step is ~170 products of 50–200 µs back
// to back: with a fresh goroutine per part, the other core had gone to sleep between two
// products, and waking it (a halted vCPU, in a VM) cost about what its half of the product
// saved, so two cores decoded no faster than one. Only a call's own caller and the workers run
// its parts: a caller never runs another call's part (it may hold a lock that part needs), and
// since it runs every part of its own that no worker claimed, waiting never deadlocks, also when
// a part calls Rows itself.
func Rows(n int, fn func(lo, hi int)) {
	k := min(runtime.GOMAXPROCS(0), n)
	if k <= 1 {
		fn(0, n)
		return
	}
	c := &call{fn: fn, n: n, k: int32(k)}
	c.next.Store(1)
	c.left.Store(int32(k - 1))
	ensureWorkers(k - 1)
	for range k - 1 {
		select {
		case tickets <- c:
		default: // the queue is full (many calls at once): the caller claims the parts itself
		}
	}
	c.run(0)
	for c.claim() {
	}
	start := time.Now()
	for c.left.Load() > 0 {
		if time.Since(start) < spinFor {
			runtime.Gosched()
			continue
		}
		c.mu.Lock()
		for c.left.Load() > 0 {
			c.cond().Wait()
		}
		c.mu.Unlock()
	}
	if p := c.panicked.Load(); p != nil {
		panic(*p)
	}
}

// spinFor is how long a worker, or a caller waiting for its parts, stays awake with nothing to
// do: longer than the gap between two products of a step, short enough not to matter idle.
const spinFor = 200 * time.Microsecond

// call is one Rows call: its function and parts, the next part not yet claimed, the parts other
// than the first not yet ended, and the first panic.
type call struct {
	fn       func(lo, hi int)
	n        int
	k        int32
	next     atomic.Int32
	left     atomic.Int32
	panicked atomic.Pointer[any]
	mu       sync.Mutex
	c        *sync.Cond
}

func (c *call) cond() *sync.Cond {
	if c.c == nil {
		c.c = sync.NewCond(&c.mu)
	}
	return c.c
}

// run runs part i, keeping a panic for the caller.
func (c *call) run(i int) {
	defer func() {
		if r := recover(); r != nil {
			c.panicked.CompareAndSwap(nil, &r)
		}
	}()
	c.fn(c.n*i/int(c.k), c.n*(i+1)/int(c.k))
}

// claim runs the next unclaimed part, if any, and reports whether there was one.
func (c *call) claim() bool {
	i := c.next.Add(1) - 1
	if i >= c.k {
		return false
	}
	c.run(int(i))
	c.mu.Lock()
	if c.left.Add(-1) == 0 && c.c != nil {
		c.c.Broadcast()
	}
	c.mu.Unlock()
	return true
}

var (
	// tickets tell the workers a call has parts to claim: one per part, possibly stale (the
	// caller may have claimed the part itself).
	tickets = make(chan *call, 1024)
	workers atomic.Int32
	startMu sync.Mutex
)

// ensureWorkers starts workers until there are at least n (they never exit: at most the largest
// GOMAXPROCS seen, less one).
func ensureWorkers(n int) {
	if int(workers.Load()) >= n {
		return
	}
	startMu.Lock()
	defer startMu.Unlock()
	for int(workers.Load()) < n {
		workers.Add(1)
		go work()
	}
}

func work() {
	for {
		var c *call
		select {
		case c = <-tickets:
		default:
			for start := time.Now(); c == nil && time.Since(start) < spinFor; {
				select {
				case c = <-tickets:
				default:
					runtime.Gosched()
				}
			}
			if c == nil {
				c = <-tickets
			}
		}
		c.claim()
	}
}
