package gateway

// Futures as the API shows them: the submit answer, how an op's end is recorded, retrieve_future.

import (
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/engine"
)

// futureResponse is what every async submit returns.
func futureResponse(f *future, modelID string) api.FutureResponse {
	return api.FutureResponse{RequestID: f.id, ModelID: modelID}
}

// userFault maps engine errors to the future's category.
func categorize(err error) string {
	var ue userError
	if errors.As(err, &ue) {
		return "user"
	}
	if errors.Is(err, engine.ErrInvalidInput) || errors.Is(err, engine.ErrUnknownAdapter) || errors.Is(err, engine.ErrNoOptimizerState) {
		return "user"
	}
	// Non-finite logits come from the tenant's own adapter weights (their training choices).
	if errors.Is(err, engine.ErrNonFinite) {
		return "user"
	}
	return "server"
}

// finishOn ends a future with the replica that ran it (reported as X-Skein-Replica).
func (s *Server) finishOn(f *future, replicaID string, result any, err error) {
	s.futures.setReplica(f, replicaID)
	s.finish(f, result, err)
}

func (s *Server) finish(f *future, result any, err error) {
	s.metrics.opDone(f.kind, time.Since(f.created), resultTokens(result))
	if err != nil {
		cat := categorize(err)
		s.metrics.future(f.kind, cat+"_error")
		s.futures.fail(f, cat, err.Error())
		return
	}
	s.metrics.future(f.kind, "ok")
	s.futures.complete(f, result)
}

func (s *Server) retrieveFuture(w http.ResponseWriter, r *http.Request, tenant string) (any, error) {
	var req api.RetrieveFutureRequest
	if err := s.decodeJSON(r, &req); err != nil {
		return nil, err
	}
	noteFuture(r, req.RequestID)
	f, err := s.futures.get(tenant, req.RequestID)
	if err != nil {
		return nil, errf(http.StatusServiceUnavailable, "reading request %q: %v; retry", req.RequestID, err)
	}
	if f == nil {
		return nil, errf(http.StatusNotFound, "request %q not found", req.RequestID)
	}
	if !s.futures.wait(f, s.opts.LongPoll, r.Context().Done()) {
		if r.Context().Err() != nil {
			return nil, nil // the client went away
		}
		state, reason := s.futures.queueState(f)
		writeJSON(w, http.StatusRequestTimeout, api.TryAgain{Type: "try_again", RequestID: f.id, QueueState: state, QueueStateReason: reason})
		return nil, nil
	}
	if rep := s.futures.replicaOf(f); rep != "" {
		w.Header().Set("X-Skein-Replica", rep)
	}
	if f.errMsg != "" {
		return api.ErrorResult{Error: f.errMsg, Category: f.category}, nil
	}
	wantsProto := strings.Contains(r.Header.Get("Accept"), "application/x-protobuf")
	switch v := f.result.(type) {
	case *api.ForwardBackwardOutput:
		if wantsProto {
			writeProto(w, api.EncodeForwardBackwardOutput(v))
			return nil, nil
		}
	case *api.SampleResponse:
		if wantsProto {
			writeProto(w, api.EncodeSampleResponse(v))
			return nil, nil
		}
	}
	return f.result, nil
}

func writeProto(w http.ResponseWriter, b []byte) {
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(b)
}

// resultTokens is the tokens an op's result says it processed: a forward or forward_backward's
// num_tokens metric, a sample's generated tokens; 0 for other results.
func resultTokens(result any) int {
	switch r := result.(type) {
	case *api.ForwardBackwardOutput:
		if r != nil {
			return int(r.Metrics["num_tokens:sum"])
		}
	case *api.SampleResponse:
		if r != nil {
			n := 0
			for _, q := range r.Sequences {
				n += len(q.Tokens)
			}
			return n
		}
	}
	return 0
}
