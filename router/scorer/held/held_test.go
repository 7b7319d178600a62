package held

import (
	"testing"

	"github.com/skein-ai/skein/router"
	"github.com/skein-ai/skein/router/routertest"
)

func TestScore(t *testing.T) {
	cases := []struct {
		max, held int
		want      float64
	}{{4, 0, 1}, {4, 1, 0.75}, {4, 4, 0}, {4, 9, 0}, {0, 0, 0}}
	for _, c := range cases {
		got := routertest.Score(Scorer{}, router.Request{}, router.Candidate{Endpoint: routertest.Endpoint{Max: c.max}, Held: c.held})[0]
		if got != c.want {
			t.Errorf("max %d held %d: %v, want %v", c.max, c.held, got, c.want)
		}
	}
}
