package gateway

import (
	"encoding/json"
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
	// DefaultMaxRunQueueBytes bounds the memory one run's queued requests hold, as heldBytes
	// estimates it from their decoded form.
	DefaultMaxRunQueueBytes = 128 << 20
	// DefaultMaxTenantQueueBytes bounds the same over all of one tenant's runs, and
	// DefaultMaxTotalQueueBytes over every tenant's: with many runs, or many tenants in open
	// mode, the per-run bound alone does not bound the server's memory.
	DefaultMaxTenantQueueBytes = 512 << 20
	DefaultMaxTotalQueueBytes  = 2 << 30
)

// What a queued forward/forward_backward holds in memory, per element (a token, a tensor value)
// and per datum: its decoded API form, the engine batch validated from it, and their slices and
// maps. Measured with runtime.MemStats on queued requests (docs/design-notes.md, issue 19): about
// 20-22 bytes per element and 2.1 KiB per datum; these round up.
const (
	heldBytesPerElement = 24
	heldBytesPerDatum   = 2 << 10
	// maxHeldElements caps one tensor's count (a sparse tensor is charged as dense, as the engine
	// holds it); bigger ones are refused by validation anyway.
	maxHeldElements = 1 << 23
)

// heldBytes estimates the memory a queued forward/forward_backward request holds: the body's own
// size counts little (it is dropped once decoded) and a short JSON number or a protobuf varint
// becomes 8+ bytes, so the decoded elements are what is counted; never less than the body.
func heldBytes(data []api.Datum, body int) int64 {
	n := int64(len(data)) * heldBytesPerDatum
	for _, d := range data {
		for _, c := range d.ModelInput.Chunks {
			n += int64(len(c.Tokens))*heldBytesPerElement + int64(len(c.Data))
		}
		for _, t := range d.LossFnInputs {
			elems := int64(len(t.Data) + len(t.SparseCrowIndices) + len(t.SparseColIndices))
			if t.SparseCrowIndices != nil || t.SparseColIndices != nil {
				dense := int64(1)
				for _, x := range t.Shape {
					if x < 0 || (x > 0 && dense > maxHeldElements/int64(x)) {
						dense = maxHeldElements
						break
					}
					dense *= int64(x)
				}
				elems += min(dense, maxHeldElements)
			}
			n += elems * heldBytesPerElement
		}
	}
	return max(n, int64(body))
}

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

// Bounds on user_metadata and tags (create_session, create_model): they are stored with the
// session or run and sent back in listings, so one tenant's megabytes of them would cost every
// write of its row and every reader's time. The SDK sends a few short entries.
const (
	MaxMetadataKeys     = 64       // keys of one user_metadata
	MaxMetadataKeyBytes = 256      // bytes of one key
	MaxMetadataBytes    = 16 << 10 // user_metadata as JSON, values included
	MaxTags             = 64       // tags of one session
	MaxTagBytes         = 256      // bytes of one tag
)

// checkMetadata refuses a user_metadata over the bounds (counting before encoding, so a huge one
// is refused without being encoded).
func checkMetadata[V any](md map[string]V) error {
	if len(md) > MaxMetadataKeys {
		return errf(http.StatusBadRequest, "user_metadata has %d keys: the limit is %d", len(md), MaxMetadataKeys)
	}
	for k := range md {
		if len(k) > MaxMetadataKeyBytes {
			return errf(http.StatusBadRequest, "a user_metadata key of %d bytes: the limit is %d", len(k), MaxMetadataKeyBytes)
		}
	}
	b, err := json.Marshal(md)
	if err != nil {
		return errf(http.StatusBadRequest, "user_metadata: %v", err)
	}
	if len(b) > MaxMetadataBytes {
		return errf(http.StatusBadRequest, "user_metadata of %d bytes as JSON: the limit is %d", len(b), MaxMetadataBytes)
	}
	return nil
}

// checkTags refuses a session's tags over the bounds.
func checkTags(tags []string) error {
	if len(tags) > MaxTags {
		return errf(http.StatusBadRequest, "%d tags: the limit is %d", len(tags), MaxTags)
	}
	for _, t := range tags {
		if len(t) > MaxTagBytes {
			return errf(http.StatusBadRequest, "a tag of %d bytes: the limit is %d", len(t), MaxTagBytes)
		}
	}
	return nil
}
