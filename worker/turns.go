package worker

import (
	"context"
	"slices"
	"sync"
)

// Turns across the worker protocol (issue 39, item 4). In process, a replica runs the sampling
// batches queued during a long op between the op's layers (engine.WithTurns), so another
// tenant's short sample waits about a layer, not the whole op. A remote worker's op used to hold
// the worker for its whole length instead: the gateway's replica sat in the HTTP call, and the
// worker ran one call at a time.
//
// Now the gateway's client gives the replica its turn while a call is in flight (roundTrip), so
// the batch's calls reach the worker beside the call running there; the worker's turnGate queues
// them, and the running call's engine serves them between its layers, as the replica does in
// process. What may run inside another call is what a sampling batch does: look an adapter up,
// load and drop read-only sampler copies, sample. Only forward and forward_backward give turns
// (passes over the layers that leave the weights as they are); a call arriving during any other
// waits for it to end, as before. A turn never touches a training adapter (whose gradients or
// weights the running call may be changing): a call that names one waits for the gate instead.

// turnCalls may run inside another call's turn (and, on the gateway side, give no turns
// themselves: turns do not nest).
var turnCalls = map[string]bool{"sample": true, "load_snapshot": true, "has_adapter": true, "delete": true}

// givesTurns are the calls that serve queued turn calls between their layers.
var givesTurns = map[string]bool{"forward": true, "forward_backward": true}

// turnGate lets one call at a time hold the engine, and a holder that gives turns run the turn
// calls queued meanwhile, on its own goroutine, between its layers.
type turnGate struct {
	mu    sync.Mutex
	cond  *sync.Cond
	held  bool        // a call holds the engine
	open  bool        // its holder gives turns (between the layers of its passes)
	queue []*turnCall // turn calls waiting for the holder's next turn
}

// turnCall is one call waiting for a turn inside the running call.
type turnCall struct {
	run   func() bool // runs the call; false: it may not run in a turn (it names a training adapter)
	taken bool        // a turn took it (under mu)
	ran   bool        // it ran in the turn (set before done closes)
	done  chan struct{}
}

func newTurnGate() *turnGate {
	g := &turnGate{}
	g.cond = sync.NewCond(&g.mu)
	return g
}

// acquire waits until the caller holds the engine and returns false; or, for a turn call
// (run != nil) while a holder gives turns, queues run for the holder's next turn and returns
// true once it ran there. A holder that gives turns says so (gives); release ends the hold.
func (g *turnGate) acquire(gives bool, run func() bool) (ranInTurn bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for {
		if !g.held {
			g.held, g.open = true, gives
			if gives {
				g.cond.Broadcast() // turn calls waiting for an open holder
			}
			return false
		}
		if run != nil && g.open {
			tc := &turnCall{run: run, done: make(chan struct{})}
			g.queue = append(g.queue, tc)
			g.mu.Unlock()
			<-tc.done
			g.mu.Lock()
			if tc.ran {
				return true
			}
			if tc.taken {
				run = nil // refused a turn: wait for the gate like any other call
			}
			continue // the holder ended before its next turn: try again
		}
		g.cond.Wait()
	}
}

// release ends the hold: turn calls still queued go back to waiting for the gate.
func (g *turnGate) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.held, g.open = false, false
	for _, tc := range g.queue {
		close(tc.done)
	}
	g.queue = nil
	g.cond.Broadcast()
}

// give runs the turn calls queued by now, on the holder's goroutine (the engine calls it between
// layers: engine.WithTurns). Those queued while it runs wait for the next turn, so a stream of
// them cannot hold the holder up for ever.
func (g *turnGate) give() {
	g.mu.Lock()
	q := g.queue
	g.queue = nil
	for _, tc := range q {
		tc.taken = true
	}
	g.mu.Unlock()
	for _, tc := range q {
		g.serve(tc)
	}
}

// serve runs one turn call; whatever happens in it, its waiter is woken.
func (g *turnGate) serve(tc *turnCall) {
	defer close(tc.done)
	tc.ran = tc.run()
}

// queued counts the turn calls waiting for a turn (tests).
func (g *turnGate) queued() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.queue)
}

// mayTakeTurn reports whether a turn call may run inside the running call: it must not name a
// training adapter, whose state that call may be changing (a sample of one, a delete of one, a
// snapshot loaded under its id wait for the gate instead). It runs in the turn, on the holder's
// goroutine, while the holder's engine work is paused between two layers.
func (s *Server) mayTakeTurn(ctx context.Context, method string, q callRequest) bool {
	switch method {
	case "has_adapter":
		return true // reads only
	case "load_snapshot", "delete":
		if q.ID == "" {
			return false
		}
	}
	ids := []string{q.ID}
	if method == "sample" {
		for _, r := range q.Samples {
			ids = append(ids, r.Adapter)
		}
	}
	training := s.e.TrainingAdapterIDs(ctx)
	for _, id := range ids {
		if id != "" && slices.Contains(training, id) {
			return false
		}
	}
	return true
}
