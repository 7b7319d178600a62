package gateway

// Sequenced submission of a training run's ops (seq_id order).

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
	"strconv"
)

// submitOrdered creates (or finds, on retry) the future of a model op and queues it in seq order.
// A request rejected as bad input still consumes its seq_id, so the model's later ops run.
func (s *Server) submitOrdered(tenant string, run *trainingRun, seq *int, kind string, validate func() error, op replicaOp) (any, error) {
	return s.submitOrderedSized(tenant, run, seq, kind, 0, validate, op)
}

// submitOrderedSized is submitOrdered for a request that holds about cost bytes while queued.
// Every way a sequenced request can fail once its seq_id is known (invalid, a panic in validation,
// the future not created, a panic while it runs) consumes its seq_id or ends its future, so the
// run never stalls behind it. Only a full queue refuses it without consuming it: the client retries.
func (s *Server) submitOrderedSized(tenant string, run *trainingRun, seq *int, kind string, cost int64, validate func() error, op replicaOp) (any, error) {
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
	f, fresh, err := s.futures.create(tenant, kind, opKey)
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
