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
// The parts other than the first go to a pool of worker goroutines that spin for a while
// (spinFor) after each part before they sleep, and the caller runs the first part itself and
// then spins for the rest, running queued parts while it waits. A decode step is ~170 products
// of 50–200 µs back to back: with a fresh goroutine per part, the other core had gone to sleep
// between two products, and waking it (a halted vCPU, in a VM) cost about what its half of the
// product saved, so two cores decoded no faster than one.
func Rows(n int, fn func(lo, hi int)) {
	k := min(runtime.GOMAXPROCS(0), n)
	if k <= 1 {
		fn(0, n)
		return
	}
	c := &call{fn: fn}
	c.left.Store(int32(k - 1))
	ensureWorkers(k - 1)
	for i := 1; i < k; i++ {
		j := job{c: c, lo: n * i / k, hi: n * (i + 1) / k}
		select {
		case jobs <- j:
		default: // the queue is full (many calls at once): the caller runs the part itself
			j.do()
		}
	}
	c.run(0, n/k)
	// Wait for the other parts, running queued parts (this call's or another's: a part may call
	// Rows itself) so that waiting never deadlocks, and spinning rather than sleeping at first.
	start := time.Now()
	for c.left.Load() > 0 {
		select {
		case j := <-jobs:
			j.do()
		default:
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
	}
	if p := c.panicked.Load(); p != nil {
		panic(*p)
	}
}

// spinFor is how long a worker, or a caller waiting for its parts, stays awake with nothing to
// do: longer than the gap between two products of a step, short enough not to matter idle.
const spinFor = 200 * time.Microsecond

// call is one Rows call: its function, the parts not yet ended and the first panic.
type call struct {
	fn       func(lo, hi int)
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

func (c *call) run(lo, hi int) {
	defer func() {
		if r := recover(); r != nil {
			c.panicked.CompareAndSwap(nil, &r)
		}
	}()
	c.fn(lo, hi)
}

// job is a part of a call, run by a worker or a waiting caller.
type job struct {
	c      *call
	lo, hi int
}

func (j job) do() {
	j.c.run(j.lo, j.hi)
	j.c.mu.Lock()
	if j.c.left.Add(-1) == 0 && j.c.c != nil {
		j.c.c.Broadcast()
	}
	j.c.mu.Unlock()
}

var (
	jobs    = make(chan job, 1024)
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
		select {
		case j := <-jobs:
			j.do()
			continue
		default:
		}
		got := false
		for start := time.Now(); time.Since(start) < spinFor; {
			select {
			case j := <-jobs:
				j.do()
				got = true
			default:
				runtime.Gosched()
			}
			if got {
				break
			}
		}
		if !got {
			(<-jobs).do()
		}
	}
}
