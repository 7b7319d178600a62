// Package basemodel is a router filter that keeps only replicas serving the request's base model.
package basemodel

import "github.com/skein-ai/skein/router"

// Filter drops replicas of other base models.
type Filter struct{}

var _ router.Filter = Filter{}

func (Filter) Name() string { return "base-model" }

func (Filter) Filter(req router.Request, cands []router.Candidate) []router.Candidate {
	out := cands[:0] // filters in place: the router passes a scratch slice
	for _, c := range cands {
		if c.Endpoint.BaseModel() == req.BaseModel {
			out = append(out, c)
		}
	}
	return out
}
