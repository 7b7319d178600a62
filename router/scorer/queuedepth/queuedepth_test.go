package queuedepth

import (
	"testing"

	"github.com/skein-ai/skein/router"
	"github.com/skein-ai/skein/router/routertest"
)

func TestScore(t *testing.T) {
	cases := []struct {
		scale float64
		queue int
		want  float64
	}{{0, 0, 1}, {0, 8, 0.5}, {4, 4, 0.5}, {4, 12, 0.25}}
	for _, c := range cases {
		got := Scorer{Scale: c.scale}.Score(router.Request{}, router.Candidate{Endpoint: routertest.Endpoint{Queue: c.queue}})
		if got != c.want {
			t.Errorf("scale %v queue %d: %v, want %v", c.scale, c.queue, got, c.want)
		}
	}
}
