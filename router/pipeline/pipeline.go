// Package pipeline assembles the default router pipeline from the filter and scorer plugins.
package pipeline

import (
	"github.com/skein-ai/skein/router"
	"github.com/skein-ai/skein/router/filter/basemodel"
	"github.com/skein-ai/skein/router/filter/healthy"
	"github.com/skein-ai/skein/router/scorer/capacity"
	"github.com/skein-ai/skein/router/scorer/held"
	"github.com/skein-ai/skein/router/scorer/queuedepth"
)

// New builds a router with the healthy and base-model filters and the capacity, queue-depth and
// adapters-held scorers at the given weights (router.DefaultWeights for zero fields).
func New(w router.Weights, hooks router.Hooks) *router.Router {
	d := router.DefaultWeights
	if w.Capacity == 0 {
		w.Capacity = d.Capacity
	}
	if w.QueueDepth == 0 {
		w.QueueDepth = d.QueueDepth
	}
	if w.Held == 0 {
		w.Held = d.Held
	}
	return router.New(
		[]router.Filter{healthy.Filter{}, basemodel.Filter{}},
		[]router.WeightedScorer{{Scorer: capacity.Scorer{}, Weight: w.Capacity},
			{Scorer: queuedepth.Scorer{}, Weight: w.QueueDepth}, {Scorer: held.Scorer{}, Weight: w.Held}},
		hooks)
}
