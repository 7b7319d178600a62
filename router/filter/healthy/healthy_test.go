package healthy

import (
	"testing"

	"github.com/skein-ai/skein/router"
	"github.com/skein-ai/skein/router/routertest"
)

func TestFilter(t *testing.T) {
	cases := []struct {
		name string
		in   []routertest.Endpoint
		want int
	}{
		{"all up", []routertest.Endpoint{{Name: "a"}, {Name: "b"}}, 2},
		{"one down", []routertest.Endpoint{{Name: "a", Down: true}, {Name: "b"}}, 1},
		{"all down", []routertest.Endpoint{{Name: "a", Down: true}}, 0},
	}
	for _, c := range cases {
		var cands []router.Candidate
		for _, e := range c.in {
			cands = append(cands, router.Candidate{Endpoint: e})
		}
		got := Filter{}.Filter(router.Request{}, cands)
		if len(got) != c.want {
			t.Errorf("%s: kept %d, want %d", c.name, len(got), c.want)
		}
		for _, g := range got {
			if !g.Endpoint.Healthy() {
				t.Errorf("%s: kept an unhealthy endpoint", c.name)
			}
		}
	}
}
