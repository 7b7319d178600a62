package engine

import "github.com/skein-ai/skein/engine/internal/backend"

// kvStore is where a layer's keys and values go and where its attention reads them from.
type kvStore[E float] interface {
	// begin sets layer l's destinations in h: where HeadsIn puts keys and values and where
	// attention reads them, over S slots: keys transposed [B·KVH, hd, S] (so scores are a plain
	// product) and values [B·KVH, S, hd]; and the sampler's cache to fill on the way, if any.
	begin(l int, h *backend.HeadsIn[E])
	// slot is token t of row b's position: its rotary angle, where its key and value go, and
	// the last slot it attends to.
	slot(b, t int) int
	// deltaState is DeltaNet layer l's sampler state (nil: none, a training or forward pass);
	// cont: the pass continues it (a decode step, a later chunk of a prefill), else it starts
	// from zero; either way it leaves each row's state after that row's own last token in the
	// pass, lens[b] (nil: T).
	deltaState(l int) (st *backend.DeltaState[E], cont bool, lens []int)
}

// passKV keeps keys and values of the pass's own tokens at positions 0…T-1: training,
// forward passes and a prefill (which also writes them to the sampler's cache). A training
// pass also keeps K and Vᵀ for its backward pass.
type passKV[E float] struct {
	s     *pass[E]
	cache *kvCache[E] // nil: none to fill
}

func (p *passKV[E]) begin(l int, h *backend.HeadsIn[E]) {
	s := p.s
	KVH, hd, T := s.c.NumKeyValueHeads, s.c.HeadDim, s.T
	BK := s.B * KVH
	h.KeysT, h.Values = s.op.Alloc(BK, hd, T), s.op.Alloc(BK, T, hd)
	if s.saving() {
		h.Keys, h.ValuesT = s.op.Alloc(BK, T, hd), s.op.Alloc(BK, hd, T)
		la := &s.train.acts[l]
		la.kh, la.khT, la.vh, la.vhT = h.Keys, h.KeysT, h.Values, h.ValuesT
	}
	if p.cache != nil {
		h.CacheKeysT, h.CacheValues = p.cache.keysT[l], p.cache.values[l]
	}
}

func (p *passKV[E]) slot(_, t int) int { return t }

func (p *passKV[E]) deltaState(l int) (*backend.DeltaState[E], bool, []int) {
	if p.cache == nil {
		return nil, false, nil
	}
	return p.cache.dn[l], false, p.cache.lens
}

// kvCache is a sampling loop's keys and values, a pair of shared buffers per layer written in
// place at each row's positions and multiplied directly: values [B·KVH, S, hd], keys transposed
// [B·KVH, hd, S] (for a few query rows the backend multiplies q·Kᵀ with K untransposed at a
// third of the speed).
type kvCache[E float] struct {
	keysT, values []mat[E] // per layer (empty for DeltaNet layers)
	KVH, hd, S    int
	// A hybrid model's DeltaNet layers keep a fixed-size state per row instead (nil elsewhere),
	// and a prefill leaves it after each row's own prompt: lens (nil: the whole step).
	dn   []*backend.DeltaState[E]
	lens []int
}

// cacheKV is a decode step's store: tokens at their rows' positions, attending over the cache.
type cacheKV[E float] struct {
	cache *kvCache[E]
	pos   [][]int
}

func (c *cacheKV[E]) begin(l int, h *backend.HeadsIn[E]) {
	h.KeysT, h.Values = c.cache.keysT[l], c.cache.values[l]
}

func (c *cacheKV[E]) slot(b, t int) int { return c.pos[b][t] }

func (c *cacheKV[E]) deltaState(l int) (*backend.DeltaState[E], bool, []int) {
	return c.cache.dn[l], true, c.cache.lens // lens: a later chunk of a prefill (nil: a decode step)
}
