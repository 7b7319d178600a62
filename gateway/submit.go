package gateway

// Sequenced submission of a training run's ops (seq_id order).

import (
	"errors"

	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
	"strconv"

	"github.com/skein-ai/skein/store"
)

// submitOrdered creates (or finds, on retry) the future of a model op and queues it in seq order.
// A request rejected as bad input still consumes its seq_id, so the model's later ops run.
func (s *Server) submitOrdered(r *http.Request, tenant string, run *trainingRun, seq *int, kind string, validate func() error, op replicaOp) (any, error) {
	return s.submitOrderedSized(r, tenant, run, seq, kind, 0, validate, op)
}

// submitOrderedSized is submitOrdered for a request that holds about cost bytes while queued.
// Every way a sequenced request can fail once its seq_id is known (invalid, a panic in validation,
// the future not created, a panic while it runs) consumes its seq_id or ends its future, so the
// run never stalls behind it. Only a full queue refuses it without consuming it: the client retries.
//
// Under a run lease (several gateways), the future keeps the request and the epoch it was taken
// under: an op whose gateway lost the run meanwhile does nothing here (its new holder runs it),
// and r's replay mark makes a request that runs an acknowledged op again adopt its future.
func (s *Server) submitOrderedSized(r *http.Request, tenant string, run *trainingRun, seq *int, kind string, cost int64, validate func() error, op replicaOp) (any, error) {
	n := 0
	if seq != nil {
		n = *seq
	}
	opKey := ""
	if n > 0 {
		opKey = run.id + "#" + strconv.Itoa(n)
	}
	q := s.queueOf(run)
	if err := q.reserve(n, cost); err != nil {
		return nil, errf(http.StatusTooManyRequests, "%v", err)
	}
	if err := validateRecovered(validate); err != nil {
		q.skip(n, cost)
		var bug panicError
		if errors.As(err, &bug) {
			return nil, errf(http.StatusInternalServerError, "internal error validating the request: %v", err)
		}
		return nil, asBadRequest(err)
	}
	var fence *store.Fence
	if s.leases.on {
		epoch, ok := s.leases.valid(run.id)
		if !ok {
			q.skip(n, cost)
			return nil, errf(http.StatusServiceUnavailable, "this gateway no longer sequences model %s; retry", run.id)
		}
		fence = &store.Fence{Run: run.id, Holder: s.self(), Epoch: epoch}
	}
	f, fresh, err := s.futures.createOp(tenant, kind, opKey, run.id, requestOf(r), fence, replayOf(r))
	if err != nil {
		q.skip(n, cost)
		return nil, err
	}
	if !fresh {
		q.release(cost)
		return futureResponse(f, run.id), nil // a retry: answer with the original request
	}
	err = q.submit(n, cost, func() {
		defer func() {
			if v := recover(); v != nil {
				s.log.Error("op panicked", "kind", kind, "run", run.id, "panic", v, "stack", string(debug.Stack()))
				s.finish(f, nil, fmt.Errorf("internal error running %s: %v", kind, v))
			}
		}()
		if fence != nil && !s.leases.holds(run.id, fence.Epoch) {
			// The run's lease moved: its new holder runs this op (its request is stored), and
			// this gateway must not run it too. Its waiters here wait for that result.
			s.log.Warn("not running an op of a run this gateway lost", "run", run.id, "request", f.id)
			s.futures.handOver(f)
			return
		}
		if !s.isLive(run) {
			s.futures.fail(f, "user", fmt.Sprintf("model %s was unloaded (or its session expired)", run.id))
			return
		}
		res, repID, err := s.onReplica(f, run, op)
		s.finishOn(f, repID, res, err)
	})
	if err != nil {
		s.futures.fail(f, "user", err.Error())
	}
	return futureResponse(f, run.id), nil
}

// validateRecovered runs a request's validation, turning a panic (a bug, e.g. in decoding) into
// an error so that the caller still consumes the request's seq_id.
func validateRecovered(validate func() error) (err error) {
	defer func() {
		if v := recover(); v != nil {
			slog.Error("request validation panicked", "panic", v, "stack", string(debug.Stack()))
			err = panicError{v}
		}
	}()
	return validate()
}

// panicError is a recovered panic: a bug of ours, not the caller's fault.
type panicError struct{ v any }

func (e panicError) Error() string { return fmt.Sprint(e.v) }
