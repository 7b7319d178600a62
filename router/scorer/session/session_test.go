package session

import (
	"testing"

	"github.com/skein-ai/skein/router"
	"github.com/skein-ai/skein/router/routertest"
)

func TestScore(t *testing.T) {
	eps := []routertest.Endpoint{{Name: "a"}, {Name: "b"}, {Name: "c"}}
	cases := []struct {
		name string
		key  string
		eps  []routertest.Endpoint
	}{
		{"no key", "", eps},
		{"key, three replicas", "session-1", eps},
		{"another key", "session-2", eps},
		{"key, one replica", "session-1", eps[:1]},
		{"key, no replica", "session-1", nil},
	}
	for _, c := range cases {
		scores := routertest.Score(Scorer{}, router.Request{Key: c.key}, routertest.Candidates(c.eps...)...)
		ones := 0
		for i, s := range scores {
			switch s {
			case 1:
				ones++
				// The winner is the key's rendezvous winner among these candidates.
				for _, e := range c.eps {
					if router.Rendezvous(c.key, e.Name) > router.Rendezvous(c.key, c.eps[i].Name) {
						t.Errorf("%s: scored %s, but %s wins the key", c.name, c.eps[i].Name, e.Name)
					}
				}
			case 0:
			default:
				t.Errorf("%s: score %v", c.name, s)
			}
		}
		if want := map[bool]int{true: 0, false: 1}[c.key == "" || len(c.eps) == 0]; ones != want {
			t.Errorf("%s: %d replicas scored 1, want %d", c.name, ones, want)
		}
	}
}

// Removing a replica other than the key's winner does not move the key.
func TestStableWhenAnotherReplicaLeaves(t *testing.T) {
	eps := []routertest.Endpoint{{Name: "a"}, {Name: "b"}, {Name: "c"}, {Name: "d"}}
	for _, key := range []string{"s1", "s2", "s3", "s4", "s5"} {
		scores := routertest.Score(Scorer{}, router.Request{Key: key}, routertest.Candidates(eps...)...)
		win := 0
		for i, s := range scores {
			if s == 1 {
				win = i
			}
		}
		drop := (win + 1) % len(eps)
		var rest []routertest.Endpoint
		for i, e := range eps {
			if i != drop {
				rest = append(rest, e)
			}
		}
		scores = routertest.Score(Scorer{}, router.Request{Key: key}, routertest.Candidates(rest...)...)
		for i, s := range scores {
			if s == 1 && rest[i].Name != eps[win].Name {
				t.Errorf("key %s moved from %s to %s when another replica left", key, eps[win].Name, rest[i].Name)
			}
		}
	}
}
