// Package healthy is a router filter that keeps only replicas reporting themselves healthy.
package healthy

import "github.com/skein-ai/skein/router"

// Filter drops unhealthy replicas.
type Filter struct{}

var _ router.Filter = Filter{}

func (Filter) Name() string { return "healthy" }

func (Filter) Filter(_ router.Request, cands []router.Candidate) []router.Candidate {
	out := cands[:0] // filters in place: the router passes a scratch slice
	for _, c := range cands {
		if c.Endpoint.Healthy() {
			out = append(out, c)
		}
	}
	return out
}
