package queuedepth

import (
	"testing"

	"github.com/skein-ai/skein/router"
	"github.com/skein-ai/skein/router/routertest"
)

func TestScore(t *testing.T) {
	cases := []struct {
		name                string
		scale               float64
		queue, ops, backlog int
		want                float64
	}{
		{"idle", 0, 0, 0, 0, 1},
		{"default scale", 0, 8, 0, 0, 0.5},
		{"own scale", 4, 4, 0, 0, 0.5},
		{"own scale, deeper", 4, 12, 0, 0, 0.25},
		// Ops the router has routed there count before the replica sees them.
		{"routed, not yet on the replica", 0, 0, 8, 0, 0.5},
		// A leased op is in both counts: the larger counts, not the sum.
		{"routed and on the replica", 0, 8, 8, 0, 0.5},
		{"replica has more (other work)", 0, 8, 2, 0, 0.5},
		// Work batched at the gateway for the replica adds.
		{"backlog at the gateway", 0, 4, 0, 4, 0.5},
		{"negative counts are nothing", 0, -3, -1, -9, 1},
		{"NaN scale is the default", nan(), 8, 0, 0, 0.5},
	}
	for _, c := range cases {
		cand := router.Candidate{Endpoint: routertest.Endpoint{Queue: c.queue}, Ops: c.ops, Backlog: c.backlog}
		if got := routertest.Score(Scorer{Scale: c.scale}, router.Request{}, cand)[0]; got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

func nan() float64 {
	zero := 0.0
	return zero / zero
}
