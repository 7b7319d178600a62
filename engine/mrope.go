package engine

import (
	"math"

	"github.com/skein-ai/skein/engine/internal/backend"
)

// Multimodal RoPE (Qwen3-VL). Every token has three position ids (t, h, w). A text token's
// three are equal, its position in the sequence counting each image as only as long as its
// longest side (in merged tokens); an image token's are its frame and its row and column in
// the merged grid, offset by the text before it (HF's get_rope_index). The head's frequencies
// are shared between the three interleaved: frequency i turns with h when i%3 == 1 and
// i < 3·section[1], with w when i%3 == 2 and i < 3·section[2], else with t
// (apply_interleaved_mrope). With all three ids equal that is plain RoPE, so text-only passes
// need nothing of this file; text after an image is plain RoPE at its slot plus the row's
// delta (max position + 1 − length, ≤ 0).

// mropePositions are the (t, h, w) ids of tokens whose image pad tokens stand for images of
// grids (in patches; merge is the spatial merge size), and the row's delta. The caller has
// checked that the pad tokens match the grids (imageRuns).
func mropePositions(tokens []int, imageToken, merge int, grids [][3]int) (pos [][3]int, delta int) {
	pos = make([][3]int, len(tokens))
	next, img := 0, 0 // next: the position the following text token takes
	for i := 0; i < len(tokens); {
		if tokens[i] != imageToken || img >= len(grids) {
			pos[i] = [3]int{next, next, next}
			next++
			i++
			continue
		}
		g := grids[img]
		gt, gh, gw := g[0], g[1]/merge, g[2]/merge
		top := next
		for t := range gt {
			for h := range gh {
				for w := range gw {
					pos[i] = [3]int{next + t, next + h, next + w}
					top = max(top, next+t, next+h, next+w)
					i++
				}
			}
		}
		next = top + 1
		img++
	}
	return pos, next - len(tokens)
}

// mropeAxes says which of t, h, w each rotary frequency turns with.
func (c *Config) mropeAxes() []int {
	half := c.rotaryDim() / 2
	axes := make([]int, half)
	sec := c.RopeScaling.MropeSection
	for i := range half {
		switch {
		case i%3 == 1 && i < 3*sec[1]:
			axes[i] = 1
		case i%3 == 2 && i < 3*sec[2]:
			axes[i] = 2
		}
	}
	return axes
}

// ropeOverride replaces a pass's rotary angles by slot: per token (a pass over prompts with
// images) or by a per-row shift of the slot (decode steps after such a prompt).
type ropeOverride[E float] struct {
	cos, sin []E   // [B·T, hd/2]; nil: shifted slots
	shift    []int // per row
}

// rotation is the pass's RoPE: each token's row of the rotary tables, by its slot, or the pass's
// own per-token tables (mRoPE over images). Made once a pass, for every layer.
func (s *pass[E]) rotation() backend.Rotation[E] {
	if s.rot.Angle != nil {
		return s.rot
	}
	N := s.B * s.T
	r := backend.Rotation[E]{Cos: s.cos, Sin: s.sin, Half: s.c.rotaryDim() / 2, Angle: make([]int, N)}
	if o := s.rope; o != nil && o.cos != nil {
		r.Cos, r.Sin = o.cos, o.sin
		for n := range N {
			r.Angle[n] = n
		}
	} else {
		for n, ps := range s.slots() {
			if o != nil {
				// A row that is done is still stepped, fed at slot 0; with a negative delta (an
				// image takes fewer positions than tokens) that dummy slot would fall before the
				// table. Its output is never read, so any in-range angle serves.
				ps = max(ps+o.shift[n/s.T], 0)
			}
			r.Angle[n] = ps
		}
	}
	s.rot = r
	return r
}

// slots is each token's slot in the keys and values it attends over (its position in the
// sequence): the last it sees, and where its own key and value go. Made once a pass.
func (s *pass[E]) slots() []int {
	if s.slot == nil {
		s.slot = make([]int, s.B*s.T)
		for n := range s.slot {
			s.slot[n] = s.kv.slot(n/s.T, n%s.T)
		}
	}
	return s.slot
}

// heads is the pass's attention geometry.
func (s *pass[E]) heads() backend.Heads {
	c := s.c
	return backend.Heads{B: s.B, T: s.T, H: c.NumAttentionHeads, KVH: c.NumKeyValueHeads, HD: c.HeadDim}
}

// mropeTables is the per-token rotation of positions pos [B·T] (t, h, w).
func mropeTables[E float](c *Config, invFreq []float64, pos [][3]int) (cos, sin []E) {
	half := c.rotaryDim() / 2
	axes := c.mropeAxes()
	cos, sin = make([]E, len(pos)*half), make([]E, len(pos)*half)
	for n, p := range pos {
		for i, f := range invFreq {
			a := float64(p[axes[i]]) * f
			cos[n*half+i], sin[n*half+i] = E(math.Cos(a)), E(math.Sin(a))
		}
	}
	return cos, sin
}
