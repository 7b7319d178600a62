package gateway

import (
	"fmt"

	"github.com/skein-ai/skein/checkpoint"
)

// DefaultTenantCheckpointBytes is the checkpoint storage one tenant may hold (weights and sampler
// weights together) when none is configured.
const DefaultTenantCheckpointBytes = 50 << 30

// errQuota marks a save refused by the tenant's checkpoint storage quota (a user error).
var errQuota = fmt.Errorf("checkpoint storage quota exceeded")

// checkpointBytesLocked is what a tenant's checkpoints take, not counting the one at except (which a
// save would replace). Call with s.ckpts.mu held.
func (s *Server) checkpointBytesLocked(tenant, except string) int64 {
	var n int64
	for path, m := range s.ckpts.m {
		if m.Owner == tenant && path != except {
			n += m.Size
		}
	}
	return n
}

// checkQuota refuses a save of size bytes at p that would take the tenant past its quota; size 0
// checks only that the tenant is not already at it (before the save's size is known).
func (s *Server) checkQuota(tenant string, p checkpoint.Path, size int64) error {
	if s.opts.TenantCheckpointBytes < 0 {
		return nil
	}
	s.ckpts.mu.Lock()
	used := s.checkpointBytesLocked(tenant, p.String())
	s.ckpts.mu.Unlock()
	if used+size > s.opts.TenantCheckpointBytes || (size == 0 && used >= s.opts.TenantCheckpointBytes) {
		return userError{fmt.Errorf("%w: your checkpoints take %d bytes, this one %d, and the limit is %d bytes per tenant: delete checkpoints you no longer need (DELETE /api/v1/training_runs/{id}/checkpoints/{kind}/{name})",
			errQuota, used, size, s.opts.TenantCheckpointBytes)}
	}
	return nil
}
