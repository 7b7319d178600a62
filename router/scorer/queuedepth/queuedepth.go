// Package queuedepth is a router scorer that prefers replicas with shorter queues.
package queuedepth

import "github.com/skein-ai/skein/router"

// Scorer rates 1/(1+depth/Scale): an idle replica scores 1, one with Scale queued ops 0.5.
type Scorer struct {
	Scale float64 // default 8
}

func (Scorer) Name() string { return "queue-depth" }

func (s Scorer) Score(_ router.Request, c router.Candidate) float64 {
	scale := s.Scale
	if scale <= 0 {
		scale = 8
	}
	return 1 / (1 + float64(max(0, c.Endpoint.QueueDepth()))/scale)
}
