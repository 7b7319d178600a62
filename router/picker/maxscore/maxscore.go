// Package maxscore is a router picker: the candidate with the highest summed score wins, and ties
// go to the highest rendezvous hash of the request's routing key and the replica, so the same key
// lands on the same replica while the scores stay equal, and different keys spread evenly.
package maxscore

import "github.com/skein-ai/skein/router"

// Picker picks the highest score, breaking ties by rendezvous hash.
type Picker struct{}

var _ router.Picker = Picker{}

func (Picker) Name() string { return "max-score" }

func (Picker) Pick(req router.Request, cands []router.Candidate, scores []float64) int {
	key := req.RoutingKey()
	best := -1
	var bestHash uint64
	for i := range cands {
		if i >= len(scores) {
			break
		}
		h := router.Rendezvous(key, cands[i].Endpoint.ID())
		if best < 0 || scores[i] > scores[best] || (scores[i] == scores[best] && h > bestHash) {
			best, bestHash = i, h
		}
	}
	return best
}
