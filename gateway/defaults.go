package gateway

import "time"

// Defaults of the Options that `skein serve` also shows as flag defaults (stated once, here).
const (
	DefaultMaxBodyBytes = 64 << 20
	// DefaultLongPoll is how long retrieve_future holds a request before it answers try_again.
	DefaultLongPoll       = 30 * time.Second
	DefaultFutureTTL      = 24 * time.Hour
	DefaultSessionTimeout = 5 * time.Minute
	// DefaultMaxAdaptersPerTenant is how many live LoRA adapters (training runs) one tenant may
	// hold across all replicas; unrelated to a replica's LoRA slots.
	DefaultMaxAdaptersPerTenant = 30
	DefaultQueueTimeout         = 10 * time.Minute
	// DefaultMaxSessionsPerTenant is how many live sessions one tenant may hold: each keeps a
	// row, its samplers and runs; a client makes one per ServiceClient.
	DefaultMaxSessionsPerTenant = 64
)
