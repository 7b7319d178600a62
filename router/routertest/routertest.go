// Package routertest has a fake router.Endpoint and helpers for the plugins' table-driven tests.
package routertest

import "github.com/skein-ai/skein/router"

// Endpoint is a fixed-value router.Endpoint.
type Endpoint struct {
	Name, Base string
	Max        int
	Down       bool
	Queue      int
}

var _ router.Endpoint = Endpoint{}

func (e Endpoint) ID() string        { return e.Name }
func (e Endpoint) BaseModel() string { return e.Base }
func (e Endpoint) MaxLoras() int     { return e.Max }
func (e Endpoint) Healthy() bool     { return !e.Down }
func (e Endpoint) QueueDepth() int   { return e.Queue }

// Score runs a scorer over cands and returns its scores, as the router calls it.
func Score(s router.Scorer, req router.Request, cands ...router.Candidate) []float64 {
	scores := make([]float64, len(cands))
	s.Score(req, cands, scores)
	return scores
}

// Candidates wraps endpoints as candidates with no router counts.
func Candidates(eps ...Endpoint) []router.Candidate {
	out := make([]router.Candidate, len(eps))
	for i, e := range eps {
		out[i] = router.Candidate{Endpoint: e}
	}
	return out
}
