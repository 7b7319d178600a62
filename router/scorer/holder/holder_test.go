package holder

import (
	"fmt"
	"testing"

	"github.com/skein-ai/skein/router"
	"github.com/skein-ai/skein/router/routertest"
)

func TestScore(t *testing.T) {
	cands := routertest.Candidates(routertest.Endpoint{Name: "a"}, routertest.Endpoint{Name: "b"}, routertest.Endpoint{Name: "c"})
	cases := []struct {
		holders []string
		want    []float64
	}{
		{nil, []float64{0, 0, 0}},
		{[]string{"b"}, []float64{0, 1, 0}},
		{[]string{"c", "a"}, []float64{1, 0, 1}},
		{[]string{"gone"}, []float64{0, 0, 0}},
	}
	for _, c := range cases {
		got := routertest.Score(Scorer{}, router.Request{Holders: c.holders}, cands...)
		if fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("holders %v: %v, want %v", c.holders, got, c.want)
		}
	}
}
