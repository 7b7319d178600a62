package gateway

import (
	"fmt"
	"net/http"

	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/engine"
)

// Bounds on what one request or one training run may make the server hold or compute. Each is an
// Options field (and a `skein serve` flag); these are the defaults.
const (
	// DefaultMaxRunQueueOps is how many requests one training run may have queued (buffered
	// ahead of its next seq_id, or waiting their turn). The SDK sends one forward_backward as
	// chunks of ≤1024 datums or ~5 MB with consecutive seq_ids, several at once: this leaves
	// room for hundreds of them.
	DefaultMaxRunQueueOps = 1024
	// DefaultMaxRunQueueBytes bounds the request bodies one run's queued requests hold (their
	// decoded form takes a few times more).
	DefaultMaxRunQueueBytes = 128 << 20
)

// Per-request size bounds: one tenant's huge request holds a replica for everyone else while it
// runs, so its size is capped (the SDK never sends more than 1024 datums in one request: it
// splits bigger batches into chunks of consecutive seq_ids).
const (
	// DefaultMaxRequestDatums is the most datums of one forward or forward_backward request.
	DefaultMaxRequestDatums = 1024
	// DefaultMaxRequestTokens is the most tokens of one request: the model inputs of a
	// forward_backward, or samples × (prompt + max_tokens) of a sample.
	DefaultMaxRequestTokens = 512 << 10
)

// checkBatchSize refuses a forward/forward_backward batch over the per-request bounds. It counts
// without allocating, before the batch is decoded into engine form.
func (s *Server) checkBatchSize(data []api.Datum) error {
	if len(data) > s.opts.MaxRequestDatums {
		return fmt.Errorf("%d datums in one request: this server's limit is %d (max_request_datums); split the batch", len(data), s.opts.MaxRequestDatums)
	}
	tokens := 0
	for _, d := range data {
		for _, c := range d.ModelInput.Chunks {
			tokens += len(c.Tokens)
		}
	}
	if tokens > s.opts.MaxRequestTokens {
		return fmt.Errorf("%d tokens in one request: this server's limit is %d (max_request_tokens); split the batch", tokens, s.opts.MaxRequestTokens)
	}
	return nil
}

// checkSampleSize refuses a (validated, defaults filled) sampling request whose work is over the
// per-request token bound.
func (s *Server) checkSampleSize(r engine.SampleRequest) error {
	work := int64(r.NumSamples) * int64(len(r.Prompt)+r.Params.MaxTokens)
	if work > int64(s.opts.MaxRequestTokens) {
		return errf(http.StatusBadRequest, "num_samples × (prompt + max_tokens) = %d tokens: this server's limit is %d per request (max_request_tokens); ask for fewer samples or tokens", work, s.opts.MaxRequestTokens)
	}
	return nil
}
