// Package held is a router scorer that spreads adapters: the fewer a replica holds (relative to
// its max_loras), the higher it scores. With uniform arrivals it keeps max − min held ≤ 1.
package held

import "github.com/skein-ai/skein/router"

// Scorer rates 1 − held/max_loras.
type Scorer struct{}

var _ router.Scorer = Scorer{}

func (Scorer) Name() string { return "adapters-held" }

func (Scorer) Score(_ router.Request, cands []router.Candidate, scores []float64) {
	for i, c := range cands {
		m := c.Endpoint.MaxLoras()
		if m <= 0 {
			scores[i] = 0
			continue
		}
		scores[i] = 1 - float64(min(max(c.Held, 0), m))/float64(m)
	}
}
