package engine

// kvStore is where a layer's keys and values go and where its attention reads them from.
type kvStore[E float] interface {
	// begin returns layer l's attention operands over S slots: keys transposed [B·KVH, hd, S]
	// (so scores are a plain product) and values [B·KVH, S, hd].
	begin(l int) (keysT, values mat[E])
	// slot is token t of row b's position: its rotary angle, where its key and value go, and
	// the last slot it attends to.
	slot(b, t int) int
	// put stores the key (after RoPE) and value of kv head kv of token t of row b in layer l.
	put(l, b, t, kv int, k, v []E)
	// deltaState is DeltaNet layer l's sampler state (nil: none, a training or forward pass);
	// cont: the pass continues it (a decode step), else it starts from zero and leaves each row's
	// state after that row's own last token, lens[b] (nil: T).
	deltaState(l int) (st *deltaState[E], cont bool, lens []int)
}

// passKV keeps keys and values of the pass's own tokens at positions 0…T-1: training,
// forward passes and a prefill (which also writes them to the sampler's cache). A training
// pass also keeps K and Vᵀ for its backward pass.
type passKV[E float] struct {
	s             *pass[E]
	cache         *kvCache[E] // nil: none to fill
	keysT, values mat[E]      // current layer: [B·KVH, hd, T], [B·KVH, T, hd]
	keys, valuesT mat[E]      // training: [B·KVH, T, hd], [B·KVH, hd, T]
	KVH, hd, T    int
}

func (p *passKV[E]) begin(l int) (mat[E], mat[E]) {
	s := p.s
	p.KVH, p.hd, p.T = s.c.NumKeyValueHeads, s.c.HeadDim, s.T
	BK := s.B * p.KVH
	p.keysT, p.values = s.ar.Alloc(BK, p.hd, p.T), s.ar.Alloc(BK, p.T, p.hd)
	p.keys, p.valuesT = mat[E]{}, mat[E]{}
	if s.saving() {
		p.keys, p.valuesT = s.ar.Alloc(BK, p.T, p.hd), s.ar.Alloc(BK, p.hd, p.T)
		la := &s.train.acts[l]
		la.kh, la.khT, la.vh, la.vhT = p.keys, p.keysT, p.values, p.valuesT
	}
	return p.keysT, p.values
}

func (p *passKV[E]) slot(_, t int) int { return t }

func (p *passKV[E]) deltaState(l int) (*deltaState[E], bool, []int) {
	if p.cache == nil {
		return nil, false, nil
	}
	return p.cache.dn[l], false, p.cache.lens
}

func (p *passKV[E]) put(l, b, t, kv int, k, v []E) {
	hd, T := p.hd, p.T
	head := b*p.KVH + kv
	base := head * hd * T
	for d, x := range k {
		p.keysT.V[base+d*T+t] = x
	}
	row := (head*T + t) * hd
	copy(p.values.V[row:row+hd], v)
	if p.keys.V != nil {
		copy(p.keys.V[row:row+hd], k)
		for d, x := range v {
			p.valuesT.V[base+d*T+t] = x
		}
	}
	if p.cache != nil {
		p.cache.put(l, b, kv, t, k, v)
	}
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
	dn   []*deltaState[E]
	lens []int
}

func (c *kvCache[E]) put(l, b, kv, slot int, k, v []E) {
	head := b*c.KVH + kv
	base := head * c.hd * c.S
	kt := c.keysT[l].V
	for d, x := range k {
		kt[base+d*c.S+slot] = x
	}
	row := (head*c.S + slot) * c.hd
	copy(c.values[l].V[row:row+c.hd], v)
}

// cacheKV is a decode step's store: tokens at their rows' positions, attending over the cache.
type cacheKV[E float] struct {
	cache *kvCache[E]
	pos   [][]int
}

func (c *cacheKV[E]) begin(l int) (mat[E], mat[E]) { return c.cache.keysT[l], c.cache.values[l] }

func (c *cacheKV[E]) slot(b, t int) int { return c.pos[b][t] }

func (c *cacheKV[E]) deltaState(l int) (*deltaState[E], bool, []int) { return c.cache.dn[l], true, nil }

func (c *cacheKV[E]) put(l, b, t, kv int, k, v []E) { c.cache.put(l, b, kv, c.pos[b][t], k, v) }
