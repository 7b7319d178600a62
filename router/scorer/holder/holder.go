// Package holder is a router scorer for read-only work (sampling): a replica that already holds
// the weights (router.Request.Holders) scores 1, any other 0, since elsewhere the weights must be
// loaded from disk first.
package holder

import "github.com/skein-ai/skein/router"

// Scorer rates 1 for a replica in req.Holders.
type Scorer struct{}

var _ router.Scorer = Scorer{}

func (Scorer) Name() string { return "weights-holder" }

func (Scorer) Score(req router.Request, cands []router.Candidate, scores []float64) {
	for i, c := range cands {
		scores[i] = 0
		for _, h := range req.Holders {
			if h == c.Endpoint.ID() {
				scores[i] = 1
				break
			}
		}
	}
}
