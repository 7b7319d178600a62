package gateway

import (
	"context"
	"strings"
)

// Every write of a checkpoint gets a new generation (random, so a checkpoint deleted and made
// again under the same name never reuses one). Sampler copies in replicas' memory are keyed by
// path and generation, so an overwritten checkpoint is loaded afresh instead of serving its old
// weights, and archive URLs name the generation they were made for.

// checkpointEngineID is the id of a checkpoint's read-only copy in a replica's engine.
func checkpointEngineID(m *ckptMeta) string { return "ckpt:" + m.Path + "#" + m.Generation }

// currentWeights resolves the weights a sampler over a checkpoint samples now: the current
// generation of its path, if the tenant may still read it (its own, or still published, not
// deleted nor expired). Other samplers are returned as they are.
func (s *Server) currentWeights(ctx context.Context, tenant string, smp *sampler) (*sampler, error) {
	if smp.modelPath == "" {
		return smp, nil
	}
	m, err := s.checkpointFor(ctx, tenant, smp.modelPath)
	if err != nil {
		return nil, err
	}
	s.ckpts.mu.Lock()
	id := checkpointEngineID(m)
	s.ckpts.mu.Unlock()
	cur := *smp
	cur.engineID, cur.dir = id, s.ckptDir(m)
	return &cur, nil
}

// dropSamplerCopies unloads the in-memory copies of every generation of a checkpoint path
// (deleted or overwritten), each on its replica's worker so no sample of it is cut short.
func (s *Server) dropSamplerCopies(path string) {
	prefix := "ckpt:" + path + "#"
	for _, rep := range s.allReplicas() {
		rep.DropCopies(func(id string) bool { return strings.HasPrefix(id, prefix) })
	}
}
