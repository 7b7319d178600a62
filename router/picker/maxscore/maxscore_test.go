package maxscore

import (
	"testing"

	"github.com/skein-ai/skein/router"
	"github.com/skein-ai/skein/router/routertest"
)

func TestPick(t *testing.T) {
	cands := routertest.Candidates(routertest.Endpoint{Name: "a"}, routertest.Endpoint{Name: "b"}, routertest.Endpoint{Name: "c"})
	// The rendezvous winner among the three for key "k", which ties must go to.
	tieWinner := 0
	for i := range cands {
		if router.Rendezvous("k", cands[i].Endpoint.ID()) > router.Rendezvous("k", cands[tieWinner].Endpoint.ID()) {
			tieWinner = i
		}
	}
	cases := []struct {
		name   string
		scores []float64
		want   int
	}{
		{"highest wins", []float64{0.1, 0.9, 0.5}, 1},
		{"highest wins, last", []float64{0.1, 0.2, 3}, 2},
		{"all tied: rendezvous", []float64{1, 1, 1}, tieWinner},
		{"no candidates", nil, -1},
	}
	for _, c := range cases {
		cs := cands[:len(c.scores)]
		if got := (Picker{}).Pick(router.Request{Key: "k"}, cs, c.scores); got != c.want {
			t.Errorf("%s: picked %d, want %d", c.name, got, c.want)
		}
	}
}

// Ties spread different keys over the replicas and keep one key on one replica.
func TestTiesSpreadAndStick(t *testing.T) {
	cands := routertest.Candidates(routertest.Endpoint{Name: "a"}, routertest.Endpoint{Name: "b"}, routertest.Endpoint{Name: "c"})
	scores := []float64{1, 1, 1}
	counts := make([]int, len(cands))
	for i := range 3000 {
		req := router.Request{Adapter: string(rune('A'+i%26)) + string(rune(i))}
		first := (Picker{}).Pick(req, cands, scores)
		if again := (Picker{}).Pick(req, cands, scores); again != first {
			t.Fatalf("key %q picked %d then %d", req.Adapter, first, again)
		}
		counts[first]++
	}
	for i, n := range counts {
		if n < 800 || n > 1200 {
			t.Fatalf("replica %d got %d of 3000 tied keys: %v", i, n, counts)
		}
	}
}
