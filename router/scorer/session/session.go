// Package session is a router scorer for sticky sessions: when the request has a routing key
// (router.Request.Key, from the Serve-Multiplexed-Model-Id or X-Session-Id header), the one
// candidate with the highest rendezvous hash of key and replica scores 1 and every other 0. With
// a weight above the load scorers', a session stays on one replica however the queues move, and
// only moves when that replica leaves (rendezvous hashing then moves only its keys).
package session

import "github.com/skein-ai/skein/router"

// Scorer singles out the key's rendezvous winner among the candidates.
type Scorer struct{}

var _ router.Scorer = Scorer{}

func (Scorer) Name() string { return "session-affinity" }

func (Scorer) Score(req router.Request, cands []router.Candidate, scores []float64) {
	clear(scores)
	if req.Key == "" || len(cands) == 0 {
		return
	}
	best, bestHash := 0, router.Rendezvous(req.Key, cands[0].Endpoint.ID())
	for i := 1; i < len(cands); i++ {
		if h := router.Rendezvous(req.Key, cands[i].Endpoint.ID()); h > bestHash {
			best, bestHash = i, h
		}
	}
	scores[best] = 1
}
