package gateway

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
