package gateway

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/skein-ai/skein/store"
)

// Gradients accumulated by forward_backward live in the adapter's memory until optim_step
// consumes them; the adapter's state on disk is saved at every optim_step (with no pending
// gradients) and whenever the adapter leaves memory (with them). A crash between a
// forward_backward and its optim_step therefore loses gradients that were acknowledged (the
// future's result was stored). skein does not save after every forward_backward (that would
// double the state writes of a training loop); instead it detects the loss and says so:
//
//   - pending: every forward_backward run since the last optim_step, recorded durably in the
//     run's row before its result is stored (so every acknowledged one is in it);
//   - held: the forward_backwards whose gradients the adapter in the engine holds; saved with
//     the adapter's state (gradients.json) and read back when it reloads.
//
// At optim_step, a pending request missing from held whose future completed was acknowledged
// and lost: the step fails with a server error naming them (nothing is applied; the gradients
// that survived stay accumulated), and the lost ones leave pending, so the client can run them
// again and step. A pending request whose future failed (it was interrupted) was never
// acknowledged and is not a loss.

// maxTrackedForwardBackwards bounds the requests a ledger lists between two optim_steps (the
// list is written with the run's row on every forward_backward); past it, losses of that step
// are not detected and a warning says so.
const maxTrackedForwardBackwards = 1024

type gradientLedger struct {
	pending   []string // forward_backward future ids since the last optim_step (durable)
	held      []string // those whose gradients the engine's adapter holds
	untracked bool     // more than maxTrackedForwardBackwards since the last optim_step
	// stepTo is the step an optim_step reached in memory while its state is being saved
	// (in memory only): pending is cleared, and the run's step moves, only once that save
	// succeeded (runState.Save), so a step whose save was cut leaves its forward_backwards
	// in pending, and the next optim_step reports them lost.
	stepTo int
	// stepOp is the future of the optim_step being saved (in memory only): the save records it
	// (gradientsRecord.Applied), so that a gateway taking the run over after this one died
	// between the save and the result knows the step is in the state and does not step again.
	stepOp string
}

// noteGradients records a forward_backward whose gradients the adapter now holds. It runs on the
// replica, right after the engine accumulated them and before the result is stored.
func (s *Server) noteGradients(run *trainingRun, futureID string) {
	// Stored before it returns, and so before the result is: see gradientLedger.
	s.updateRun(run, func(run *trainingRun) {
		g := &run.grads
		if g.untracked || len(g.pending) >= maxTrackedForwardBackwards {
			if !g.untracked {
				s.log.Warn("too many forward_backwards since the last optim_step to detect their loss in a crash",
					"run", run.id, "limit", maxTrackedForwardBackwards)
			}
			g.untracked, g.pending, g.held = true, nil, nil
		} else {
			g.pending = append(g.pending, futureID)
			g.held = append(g.held, futureID)
		}
	})
}

// resetGradients forgets the ledger: optim_step consumed the gradients, or load_weights replaced
// the adapter.
func (s *Server) resetGradients(run *trainingRun) {
	s.updateRun(run, func(run *trainingRun) { run.grads = gradientLedger{} })
}

// lostGradients checks, before an optim_step, that the adapter holds the gradients of every
// acknowledged forward_backward since the last step; if not, the lost ones leave the ledger and
// the error names them.
func (s *Server) lostGradients(ctx context.Context, run *trainingRun) error {
	s.runs.mu.Lock()
	g := run.grads
	var missing []string
	for _, id := range g.pending {
		if !slices.Contains(g.held, id) {
			missing = append(missing, id)
		}
	}
	s.runs.mu.Unlock()
	if len(missing) == 0 || g.untracked {
		return nil
	}
	var lost []string
	for _, id := range missing {
		f, err := s.st.GetFuture(ctx, id)
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("checking the gradients of forward_backward %s: %w", id, err)
		}
		// A future swept from the store is counted as acknowledged: it cannot be told apart.
		if err != nil || f.State == store.FutureComplete {
			lost = append(lost, id)
		}
	}
	var kept int
	s.updateRun(run, func(run *trainingRun) {
		run.grads.pending = slices.DeleteFunc(run.grads.pending, func(id string) bool { return slices.Contains(missing, id) })
		kept = len(run.grads.held)
	})
	if len(lost) == 0 {
		return nil
	}
	s.log.Error("acknowledged gradients were lost", "run", run.id, "requests", lost)
	return fmt.Errorf("the gradients of %d acknowledged forward_backward request(s) since the last optim_step (%s) were lost "+
		"when the server restarted, the adapter moved, or a worker was lost during an optim_step before its state was saved; nothing was applied. Run those forward_backward requests again, "+
		"then optim_step (%d other forward_backward result(s) are still accumulated)", len(lost), strings.Join(lost, ", "), kept)
}
