// Package queuedepth is a router scorer that prefers replicas with less work waiting for them:
// router.Candidate.Load, which counts what the replica has accepted, the ops the gateway has
// routed to it (leased, or waiting for their adapter to load there), and the caller's backlog
// for it (sampling requests batched at the gateway).
package queuedepth

import "github.com/skein-ai/skein/router"

// Scorer rates 1/(1+depth/Scale): an idle replica scores 1, one with Scale queued ops 0.5.
type Scorer struct {
	Scale float64 // default 8
}

var _ router.Scorer = Scorer{}

func (Scorer) Name() string { return "queue-depth" }

func (s Scorer) Score(_ router.Request, cands []router.Candidate, scores []float64) {
	scale := s.Scale
	if !(scale > 0) { // also NaN
		scale = 8
	}
	for i, c := range cands {
		scores[i] = 1 / (1 + float64(c.Load())/scale)
	}
}
