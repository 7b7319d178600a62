package basemodel

import (
	"testing"

	"github.com/skein-ai/skein/router"
	"github.com/skein-ai/skein/router/routertest"
)

func TestFilter(t *testing.T) {
	cands := func() []router.Candidate {
		return []router.Candidate{{Endpoint: routertest.Endpoint{Name: "a", Base: "m"}},
			{Endpoint: routertest.Endpoint{Name: "b", Base: "n"}}, {Endpoint: routertest.Endpoint{Name: "c", Base: "m"}}}
	}
	cases := []struct {
		base string
		want []string
	}{{"m", []string{"a", "c"}}, {"n", []string{"b"}}, {"other", nil}}
	for _, c := range cases {
		got := Filter{}.Filter(router.Request{BaseModel: c.base}, cands())
		var ids []string
		for _, g := range got {
			ids = append(ids, g.Endpoint.ID())
		}
		if len(ids) != len(c.want) || (len(ids) > 0 && (ids[0] != c.want[0] || ids[len(ids)-1] != c.want[len(c.want)-1])) {
			t.Errorf("base %s: %v, want %v", c.base, ids, c.want)
		}
	}
}
