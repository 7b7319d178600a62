package main

import (
	"testing"

	"github.com/skein-ai/skein/router"
)

func TestParseWeights(t *testing.T) {
	good := map[string]router.Weights{
		"":                          {},
		"capacity=4,queue=1,held=2": {Capacity: 4, QueueDepth: 1, Held: 2},
		"held=0.5":                  {Held: 0.5},
	}
	for in, want := range good {
		if got, err := parseWeights(in); err != nil || got != want {
			t.Errorf("parseWeights(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, bad := range []string{"capacity", "capacity=x", "capacity=-1", "speed=2", "held=0"} {
		if _, err := parseWeights(bad); err == nil {
			t.Errorf("parseWeights(%q) accepted", bad)
		}
	}
}
