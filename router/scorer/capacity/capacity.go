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

func (Scorer) Name() string { return "lora-capacity" }

func (Scorer) Score(_ router.Request, c router.Candidate) float64 {
	switch {
	case c.Free() > 0:
		return FreeSlot
	case c.Idle > 0:
		return Evictable
	}
	return Full
}
