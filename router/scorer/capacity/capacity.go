// Package capacity is a router scorer by LoRA capacity tier: a free slot beats an evictable idle
// adapter, which beats a full replica (as the inference gateway's LoRA-affinity scorer does).
package capacity

import "github.com/skein-ai/skein/router"

// Tier scores.
const (
	FreeSlot  = 1.0
	Evictable = 0.5
	Full      = 0.0
)

// Scorer rates a replica by capacity tier.
type Scorer struct{}

var _ router.Scorer = Scorer{}

func (Scorer) Name() string { return "lora-capacity" }

func (Scorer) Score(_ router.Request, cands []router.Candidate, scores []float64) {
	for i, c := range cands {
		switch {
		case c.Free() > 0:
			scores[i] = FreeSlot
		case c.Idle > 0:
			scores[i] = Evictable
		default:
			scores[i] = Full
		}
	}
}
