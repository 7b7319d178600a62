package router_test

import (
	"testing"

	"github.com/skein-ai/skein/router"
	"github.com/skein-ai/skein/router/filter/basemodel"
	"github.com/skein-ai/skein/router/filter/healthy"
	"github.com/skein-ai/skein/router/scorer/capacity"
	"github.com/skein-ai/skein/router/scorer/held"
	"github.com/skein-ai/skein/router/scorer/queuedepth"
)

func rep(id, base string, max int, ok bool, queue int32) *fakeReplica {
	f := &fakeReplica{id: id, base: base, max: max}
	f.healthy.Store(ok)
	f.queue.Store(queue)
	return f
}

func TestFilters(t *testing.T) {
	cands := []router.Candidate{{Endpoint: rep("a", "m", 4, true, 0)}, {Endpoint: rep("b", "m", 4, false, 0)},
		{Endpoint: rep("c", "n", 4, true, 0)}}
	cases := []struct {
		name   string
		filter router.Filter
		want   []string
	}{
		{"healthy", healthy.Filter{}, []string{"a", "c"}},
		{"base model", basemodel.Filter{}, []string{"a", "b"}},
	}
	for _, c := range cases {
		got := c.filter.Filter(router.Request{BaseModel: "m"}, append([]router.Candidate(nil), cands...))
		var ids []string
		for _, g := range got {
			ids = append(ids, g.Endpoint.ID())
		}
		if len(ids) != len(c.want) || ids[0] != c.want[0] || ids[1] != c.want[1] {
			t.Errorf("%s: %v, want %v", c.name, ids, c.want)
		}
	}
}

func TestScorers(t *testing.T) {
	cases := []struct {
		name   string
		scorer router.Scorer
		cand   router.Candidate
		want   float64
	}{
		{"capacity free slot", capacity.Scorer{}, router.Candidate{Endpoint: rep("a", "m", 4, true, 0), Held: 3}, capacity.FreeSlot},
		{"capacity evictable", capacity.Scorer{}, router.Candidate{Endpoint: rep("a", "m", 4, true, 0), Held: 4, Idle: 1}, capacity.Evictable},
		{"capacity full", capacity.Scorer{}, router.Candidate{Endpoint: rep("a", "m", 4, true, 0), Held: 4}, capacity.Full},
		{"queue idle", queuedepth.Scorer{}, router.Candidate{Endpoint: rep("a", "m", 4, true, 0)}, 1},
		{"queue at scale", queuedepth.Scorer{Scale: 4}, router.Candidate{Endpoint: rep("a", "m", 4, true, 4)}, 0.5},
		{"held empty", held.Scorer{}, router.Candidate{Endpoint: rep("a", "m", 4, true, 0)}, 1},
		{"held half", held.Scorer{}, router.Candidate{Endpoint: rep("a", "m", 4, true, 0), Held: 2}, 0.5},
		{"held full", held.Scorer{}, router.Candidate{Endpoint: rep("a", "m", 4, true, 0), Held: 4}, 0},
	}
	for _, c := range cases {
		if got := c.scorer.Score(router.Request{}, c.cand); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}
