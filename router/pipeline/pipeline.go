// Package pipeline assembles the default router profiles from the filter, scorer and picker
// plugins.
package pipeline

import (
	"github.com/skein-ai/skein/router"
	"github.com/skein-ai/skein/router/filter/basemodel"
	"github.com/skein-ai/skein/router/filter/healthy"
	"github.com/skein-ai/skein/router/picker/maxscore"
	"github.com/skein-ai/skein/router/scorer/capacity"
	"github.com/skein-ai/skein/router/scorer/held"
	"github.com/skein-ai/skein/router/scorer/holder"
	"github.com/skein-ai/skein/router/scorer/queuedepth"
	"github.com/skein-ai/skein/router/scorer/session"
)

// Sampling weights. Each tier's weight exceeds the most all lower tiers can add (scores are in
// [0,1]), so the order is strict: the replica holding the weights, then the session's replica,
// then the shortest queue.
const (
	SamplingHolderWeight  = 4
	SamplingSessionWeight = 2
	SamplingQueueWeight   = 1
)

// New builds a router with two profiles. Placement: the healthy and base-model filters, the
// capacity, queue-depth and adapters-held scorers at the given weights (router.DefaultWeights for
// zero fields), the max-score picker. Sampling: the same filters, the weights-holder,
// session-affinity and queue-depth scorers, the max-score picker.
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
	filters := []router.Filter{healthy.Filter{}, basemodel.Filter{}}
	place := router.Profile{
		Filters: filters,
		Scorers: []router.WeightedScorer{{Scorer: capacity.Scorer{}, Weight: w.Capacity},
			{Scorer: queuedepth.Scorer{}, Weight: w.QueueDepth}, {Scorer: held.Scorer{}, Weight: w.Held}},
		Picker: maxscore.Picker{},
	}
	sample := router.Profile{
		Filters: filters,
		Scorers: []router.WeightedScorer{{Scorer: holder.Scorer{}, Weight: SamplingHolderWeight},
			{Scorer: session.Scorer{}, Weight: SamplingSessionWeight}, {Scorer: queuedepth.Scorer{}, Weight: SamplingQueueWeight}},
		Picker: maxscore.Picker{},
	}
	return router.New(place, sample, hooks)
}
