package capacity

import (
	"testing"

	"github.com/skein-ai/skein/router"
	"github.com/skein-ai/skein/router/routertest"
)

func TestScore(t *testing.T) {
	ep := routertest.Endpoint{Max: 4}
	cases := []struct {
		name       string
		held, idle int
		want       float64
	}{
		{"empty", 0, 0, FreeSlot},
		{"one free", 3, 3, FreeSlot},
		{"full, one idle", 4, 1, Evictable},
		{"full and busy", 4, 0, Full},
	}
	for _, c := range cases {
		if got := routertest.Score(Scorer{}, router.Request{}, router.Candidate{Endpoint: ep, Held: c.held, Idle: c.idle})[0]; got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}
