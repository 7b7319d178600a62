package engine

import (
	"slices"
	"sync"
	"sync/atomic"

	"github.com/skein-ai/skein/engine/internal/backend"
)

// The sampler's prefix cache across requests (issue 39): keys and values of prompts' leading
// blocks of kvBlockTokens positions, kept after a request's prefill so that a later request
// whose prompt starts with the same tokens, on the same weights, copies them into its rows and
// prefills only the rest. A block is every attention layer's keys and values of its positions,
// one pair of tensors (KV over L·KVH heads × kvBlockTokens slots) in a step of its own, freed
// when the block is evicted. Blocks form chains: a block's key is its parent block (the prompt
// before it), the weights' key and its own tokens, so one block stands for the whole prefix up
// to its end. A hybrid model's block may also keep the DeltaNet states a row had after it
// (prefillRows), without which no hybrid prompt can start there. This is a block-granular prefix
// cache copied into a row's contiguous cache at admission, not paged attention: rows still own
// contiguous caches (kv.go).
//
// References: a block is held by each of its children in the cache and by each request between
// its lookup and the end of its prefill (lookup, release). Only a block nobody holds can be
// evicted, least recently used first; so a parent outlives its children, and every chain in the
// cache is whole from its root. The bytes of every block together never pass the cap: a block
// that would pass it is not stored (its request is served all the same).

// kvBlockTokens is the positions of one block: the prefill's padding unit, so a prompt's hit
// leaves its remaining positions in whole 16-position chunks.
const kvBlockTokens = 16

// weightsKey names the weights a prefix was computed with: the base model (0, 0) or an
// adapter's identity and version (its weights change with every optimizer step, and an
// adapter's keys and values differ from the base's at every layer).
type weightsKey struct{ adapter, version uint64 }

// blockKey is a block's place: the block before it (0: the prompt's start), the weights and
// its tokens (kvBlockTokens int32s as a string: an exact key, no hash to collide).
type blockKey struct {
	parent  uint64
	weights weightsKey
	tokens  string
}

// kvBlock is one cached block.
type kvBlock struct {
	id     uint64
	key    blockKey
	parent *kvBlock
	refs   int // children in the cache + requests holding it
	kv     any // backend.KV[E] of the engine's dtype: [L·KVH, hd, kvBlockTokens], [L·KVH, kvBlockTokens, hd]
	free   func()
	// A hybrid model's DeltaNet states after the block's last position (nil: none kept; set
	// once, under the cache's lock, never changed after): a prefix ending at this block can
	// serve a hybrid model's prompt only with them.
	state     any
	stateFree func()
	size      int64 // the bytes of kv and state
	// The LRU list of unreferenced blocks (prev, next nil and not the head: not on it).
	prev, next *kvBlock
	onLRU      bool
}

// prefixCache is one base model's cache, shared by the engine's forks (each replica's adapters
// have identities of their own, so one cap bounds them all).
type prefixCache struct {
	mu         sync.Mutex
	capBytes   int64
	blockBytes int64 // one block's keys and values (0 until the first block is stored)
	bytes      int64
	blocks     map[blockKey]*kvBlock
	lruHead    *kvBlock // least recently used unreferenced block
	lruTail    *kvBlock
	nextID     uint64
	stats      sampleCounters
}

// sampleCounters are the sampler's counters (SamplerStats), kept whether or not a prefix cache
// is on, so a benchmark can compare.
type sampleCounters struct {
	promptTokens, prefillTokens, cachedTokens atomic.Int64
	lookups, hits, stored, evicted            atomic.Int64
	loopKVBytes                               atomic.Int64
}

func newPrefixCache(capBytes int64) *prefixCache {
	return &prefixCache{capBytes: capBytes, blocks: map[blockKey]*kvBlock{}}
}

// on reports whether the cache keeps anything.
func (c *prefixCache) on() bool { return c != nil && c.capBytes > 0 }

// tokensKey is a block's tokens as an exact map key.
func tokensKey(toks []int) string {
	b := make([]byte, 4*len(toks))
	for i, t := range toks {
		b[4*i], b[4*i+1], b[4*i+2], b[4*i+3] = byte(t), byte(t>>8), byte(t>>16), byte(t>>24)
	}
	return string(b)
}

// lookup returns the cached blocks that begin prompt, at most maxBlocks of them, each held for
// the caller (release them when done); withState: only as far as the last block with DeltaNet
// states (a hybrid model's prompt can start only there).
//
// matched is how many blocks of prompt are cached, states or not: for a hybrid model, where the
// prompt leaves what is cached, likely the end of a prefix it shares with others (a system
// prompt), where its prefill takes states for the next such prompt.
func (c *prefixCache) lookup(w weightsKey, prompt []int, maxBlocks int, withState bool) (held []*kvBlock, matched int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*kvBlock
	var parent uint64
	cut := 0
	for i := 0; i < maxBlocks && (i+1)*kvBlockTokens <= len(prompt); i++ {
		b := c.blocks[blockKey{parent: parent, weights: w, tokens: tokensKey(prompt[i*kvBlockTokens : (i+1)*kvBlockTokens])}]
		if b == nil {
			break
		}
		out = append(out, b)
		parent = b.id
		if !withState || b.state != nil {
			cut = len(out)
		}
	}
	for _, b := range out[:cut] {
		c.hold(b)
	}
	return out[:cut], len(out)
}

// statefulDepth is how many of blocks (a held chain, as lookup gave it) to use at most n of
// for a hybrid model: up to the last one with DeltaNet states.
func (c *prefixCache) statefulDepth(blocks []*kvBlock, n int) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	for n > 0 && blocks[n-1].state == nil {
		n--
	}
	return n
}

// blockState is a hybrid model's DeltaNet states taken from a row after a block, to be kept
// with block at (the block's index in its prompt), unless that block already has some.
type blockState struct {
	at    int
	st    any
	free  func()
	bytes int64
	taken bool // by the cache (which frees it on eviction)
}

// release gives back the caller's hold on blocks.
func (c *prefixCache) release(blocks []*kvBlock) {
	if len(blocks) == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, b := range blocks {
		c.drop(b)
	}
}

// hold takes a reference (c.mu held): a held block leaves the LRU list.
func (c *prefixCache) hold(b *kvBlock) {
	if b.onLRU {
		c.unlink(b)
	}
	b.refs++
}

// drop gives a reference back (c.mu held): a block nobody holds becomes the most recently used
// of the evictable ones.
func (c *prefixCache) drop(b *kvBlock) {
	b.refs--
	if b.refs < 0 {
		panic("engine: a prefix cache block's references went negative")
	}
	if b.refs == 0 {
		c.pushTail(b)
	}
}

// store stores prompt's whole blocks, each taken from the caller's row by fill (which copies
// keys and values into the new block's KV; false: it failed); alloc makes a block's tensors,
// returning them and the function that frees them. A block already cached is shared (and made
// the most recently used), not stored twice; storing stops at the first block that does not fit
// under the cap with every evictable block evicted (the blocks this call walks are held while
// it does, so it never evicts its own chain). The copies are made without the cache's lock, at
// most storeRound blocks between two holds of it (a long prompt's would hold up every other
// sampler's lookup), each placed under it; a block another request stored meanwhile is shared
// and the copy freed.
//
// With states (a hybrid model's), the block each was taken after keeps it, if that block is
// stored or cached without one and the state fits under the cap; store marks the states it
// took (the caller frees the others).
func (c *prefixCache) store(w weightsKey, prompt []int, alloc func() (kv any, free func()), fill func(i int, kv any) bool, states []*blockState) {
	n := len(prompt) / kvBlockTokens
	var chain []*kvBlock // the blocks this call holds: block i of the prompt is chain[i]
	defer func() {
		c.mu.Lock()
		for _, b := range chain {
			c.drop(b)
		}
		c.mu.Unlock()
	}()
	key := func(i int) blockKey {
		var parent uint64
		if i > 0 {
			parent = chain[i-1].id
		}
		return blockKey{parent: parent, weights: w, tokens: tokensKey(prompt[i*kvBlockTokens : (i+1)*kvBlockTokens])}
	}
	// place makes b the prompt's next block (c.mu held), giving it a state taken there.
	place := func(b *kvBlock) {
		i := len(chain)
		c.hold(b)
		chain = append(chain, b)
		for _, st := range states {
			if st.at == i && !st.taken && b.state == nil && c.makeRoom(st.bytes) {
				b.state, b.stateFree, st.taken = st.st, st.free, true
				b.size += st.bytes
				c.bytes += st.bytes
			}
		}
	}
	c.mu.Lock()
	for len(chain) < n {
		b := c.blocks[key(len(chain))]
		if b == nil {
			break
		}
		place(b)
	}
	c.mu.Unlock()
	for len(chain) < n {
		i0, want := len(chain), min(n-len(chain), storeRound)
		var kvs []any
		var frees []func()
		for i := i0; i < i0+want; i++ {
			kv, free := alloc()
			if kv == nil {
				break
			}
			if !fill(i, kv) {
				free()
				break
			}
			kvs, frees = append(kvs, kv), append(frees, free)
		}
		placed := 0
		c.mu.Lock()
		for j, kv := range kvs {
			k := key(i0 + j)
			b := c.blocks[k]
			if b != nil {
				frees[j]() // stored meanwhile by another request
			} else {
				size := kvBytes(kv)
				c.blockBytes = size
				if !c.makeRoom(size) {
					break
				}
				var parent *kvBlock
				if i0+j > 0 {
					parent = chain[i0+j-1]
					parent.refs++ // the child's hold on its parent
				}
				c.nextID++
				b = &kvBlock{id: c.nextID, key: k, parent: parent, kv: kv, free: frees[j], size: size}
				c.blocks[k] = b
				c.bytes += size
				c.stats.stored.Add(1)
			}
			place(b)
			placed++
		}
		c.mu.Unlock()
		for _, free := range frees[placed:] {
			free()
		}
		if placed < want {
			return // no room, or a copy failed
		}
	}
}

// storeRound is how many blocks store copies between two holds of the cache's lock: at most
// this many wait beyond the cap for their places.
const storeRound = 16

// forget evicts every unreferenced block of the weights stale names (an adapter deleted, or its
// weights before an optimizer step: no request can name them again), children before parents;
// a block in use goes when its last holder lets go, by LRU like any other.
func (c *prefixCache) forget(stale func(weightsKey) bool) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for evicted := true; evicted; {
		evicted = false
		for b := c.lruHead; b != nil; {
			next := b.next
			if stale(b.key.weights) {
				c.evict(b) // may put its parent at the head: the next round sees it
				evicted = true
			}
			b = next
		}
	}
}

// makeRoom evicts unreferenced blocks, least recently used first, until size more bytes fit
// under the cap (c.mu held); it reports whether they do.
func (c *prefixCache) makeRoom(size int64) bool {
	for c.bytes+size > c.capBytes {
		b := c.lruHead
		if b == nil {
			return false
		}
		c.evict(b)
	}
	return true
}

// evict removes an unreferenced block (c.mu held); its parent loses the child's hold and, if
// nobody else holds it, becomes the next to go (it was used no later than its child).
func (c *prefixCache) evict(b *kvBlock) {
	c.unlink(b)
	delete(c.blocks, b.key)
	c.bytes -= b.size
	b.free()
	if b.stateFree != nil {
		b.stateFree()
	}
	b.kv, b.free, b.state, b.stateFree = nil, nil, nil, nil
	c.stats.evicted.Add(1)
	if p := b.parent; p != nil {
		p.refs--
		if p.refs < 0 {
			panic("engine: a prefix cache block's references went negative")
		}
		if p.refs == 0 {
			c.pushHead(p)
		}
	}
}

func (c *prefixCache) unlink(b *kvBlock) {
	if b.prev != nil {
		b.prev.next = b.next
	} else {
		c.lruHead = b.next
	}
	if b.next != nil {
		b.next.prev = b.prev
	} else {
		c.lruTail = b.prev
	}
	b.prev, b.next, b.onLRU = nil, nil, false
}

func (c *prefixCache) pushTail(b *kvBlock) {
	b.prev, b.next, b.onLRU = c.lruTail, nil, true
	if c.lruTail != nil {
		c.lruTail.next = b
	} else {
		c.lruHead = b
	}
	c.lruTail = b
}

func (c *prefixCache) pushHead(b *kvBlock) {
	b.prev, b.next, b.onLRU = nil, c.lruHead, true
	if c.lruHead != nil {
		c.lruHead.prev = b
	} else {
		c.lruTail = b
	}
	c.lruHead = b
}

// kvBytes is a block's size: its tensors' elements times the element's bytes.
func kvBytes(kv any) int64 {
	switch k := kv.(type) {
	case backend.KV[float32]:
		return int64(4 * (elems(k.KeysT.Dims) + elems(k.Values.Dims)))
	case backend.KV[float64]:
		return int64(8 * (elems(k.KeysT.Dims) + elems(k.Values.Dims)))
	}
	return 0
}

func elems(dims []int) int {
	n := 1
	for _, d := range dims {
		n *= d
	}
	return n
}

// SamplerStats are the sampler's counters since the base model was loaded (every fork's
// sampling together), for a benchmark and the metrics endpoint.
type SamplerStats struct {
	// PromptTokens are the prompt positions requested: each sample's prompt, counted once per
	// sample (what prefilling every sample's row would compute).
	PromptTokens int64 `json:"prompt_tokens"`
	// PrefillTokens are the prompt positions the sampler computed (a prompt once for all its
	// samples, less the positions its cached prefix served).
	PrefillTokens int64 `json:"prefill_tokens"`
	// CachedTokens are the prompt positions copied from the prefix cache.
	CachedTokens int64 `json:"cached_tokens"`
	// Lookups are the prompts looked up in the prefix cache; Hits those that found a block.
	Lookups int64 `json:"lookups"`
	Hits    int64 `json:"hits"`
	// StoredBlocks and EvictedBlocks count the prefix cache's blocks stored and evicted.
	StoredBlocks  int64 `json:"stored_blocks"`
	EvictedBlocks int64 `json:"evicted_blocks"`
	// CacheBytes is the prefix cache's keys and values now, CacheCapBytes its cap (0: off),
	// CacheBlocks its blocks.
	CacheBytes    int64 `json:"cache_bytes"`
	CacheCapBytes int64 `json:"cache_cap_bytes"`
	CacheBlocks   int64 `json:"cache_blocks"`
	// LoopKVBytes are the keys and values of the decode loops running now (their rows' caches).
	LoopKVBytes int64 `json:"loop_kv_bytes"`
}

// Add is the sum of two processes' counters (a model served by several workers).
func (s SamplerStats) Add(o SamplerStats) SamplerStats {
	return SamplerStats{PromptTokens: s.PromptTokens + o.PromptTokens, PrefillTokens: s.PrefillTokens + o.PrefillTokens,
		CachedTokens: s.CachedTokens + o.CachedTokens, Lookups: s.Lookups + o.Lookups, Hits: s.Hits + o.Hits,
		StoredBlocks: s.StoredBlocks + o.StoredBlocks, EvictedBlocks: s.EvictedBlocks + o.EvictedBlocks,
		CacheBytes: s.CacheBytes + o.CacheBytes, CacheCapBytes: s.CacheCapBytes + o.CacheCapBytes,
		CacheBlocks: s.CacheBlocks + o.CacheBlocks, LoopKVBytes: s.LoopKVBytes + o.LoopKVBytes}
}

// Valid reports whether every counter is in [0, 2⁶²]: a worker's report, checked before the
// gateway shows it.
func (s SamplerStats) Valid() bool {
	for _, v := range []int64{s.PromptTokens, s.PrefillTokens, s.CachedTokens, s.Lookups, s.Hits, s.StoredBlocks,
		s.EvictedBlocks, s.CacheBytes, s.CacheCapBytes, s.CacheBlocks, s.LoopKVBytes} {
		if v < 0 || v > 1<<62 {
			return false
		}
	}
	return true
}

// SamplerStats reads the sampler's counters.
func (e *Engine) SamplerStats() SamplerStats {
	c := e.base.prefix
	s := SamplerStats{
		PromptTokens: c.stats.promptTokens.Load(), PrefillTokens: c.stats.prefillTokens.Load(),
		CachedTokens: c.stats.cachedTokens.Load(), Lookups: c.stats.lookups.Load(), Hits: c.stats.hits.Load(),
		StoredBlocks: c.stats.stored.Load(), EvictedBlocks: c.stats.evicted.Load(), LoopKVBytes: c.stats.loopKVBytes.Load(),
	}
	c.mu.Lock()
	s.CacheBytes, s.CacheCapBytes, s.CacheBlocks = c.bytes, c.capBytes, int64(len(c.blocks))
	c.mu.Unlock()
	return s
}

// prefixPlan is one decode loop's use of the prefix cache: per request, the weights' key, the
// blocks its lookup found (held until release) and whether it may use and feed the cache.
type prefixPlan struct {
	c        *prefixCache
	adapters []*Adapter
	reqs     []SampleRequest
	keys     []weightsKey
	ok       []bool
	held     [][]*kvBlock
	served   []int // per request: the positions its prefill took from the cache
	// hybrid: the model has DeltaNet layers, whose state at a block's end is kept with the block
	// (prefillRows stops rows at block boundaries to take it) and put back with its keys and
	// values.
	hybrid bool
	states [][]*blockState // per request: the DeltaNet states taken for store
	// branch: per request, the blocks of its prompt cached without states past those it was
	// served (a hybrid model's; 0: none): its prefill takes states there too.
	branch []int
}

// planPrefixes looks up each request's prompt in the prefix cache. Nothing is used or stored
// when the cache is off, for prompts with images (their keys and values depend on the pixels,
// not only on the tokens), or for weights an optimizer step is writing. A request asking for
// prompt logprobs is not served from the cache (the logits of cached positions are not kept;
// its prompt is computed whole, so they come out as without a cache) but feeds it. A lookup
// never covers a prompt's last position: its logits draw the first token. A hybrid model's
// prompt starts only after a block kept with its DeltaNet states.
func (e *Engine) planPrefixes(adapters []*Adapter, reqs []SampleRequest, images []*imageRow) *prefixPlan {
	p := &prefixPlan{c: e.base.prefix, adapters: adapters, reqs: reqs, keys: make([]weightsKey, len(reqs)),
		ok: make([]bool, len(reqs)), held: make([][]*kvBlock, len(reqs)), served: make([]int, len(reqs)),
		hybrid: e.Config.hasDeltaNet(), states: make([][]*blockState, len(reqs)), branch: make([]int, len(reqs))}
	if !p.c.on() || images != nil {
		return p
	}
	for ri, r := range reqs {
		p.keys[ri], p.ok[ri] = weightsKeyOf(adapters[ri])
		if !p.ok[ri] || r.PromptLogprobs || r.TopKPromptLogprobs > 0 {
			continue
		}
		var matched int
		p.held[ri], matched = p.c.lookup(p.keys[ri], r.Prompt, (len(r.Prompt)-1)/kvBlockTokens, p.hybrid)
		if p.hybrid && matched > len(p.held[ri]) {
			p.branch[ri] = matched
		}
		p.c.stats.lookups.Add(1)
		if len(p.held[ri]) > 0 {
			p.c.stats.hits.Add(1)
		}
	}
	return p
}

// feeds reports whether any request may feed the cache.
func (p *prefixPlan) feeds() bool {
	for _, ok := range p.ok {
		if ok {
			return true
		}
	}
	return false
}

// confirm drops what a request looked up when its adapter's weights changed since (after the
// loop copied them: the cached keys and values would not be of the weights it samples).
func (p *prefixPlan) confirm() {
	for ri, a := range p.adapters {
		if k, settled := weightsKeyOf(a); p.ok[ri] && (!settled || k != p.keys[ri]) {
			p.c.release(p.held[ri])
			p.held[ri], p.ok[ri], p.branch[ri] = nil, false, 0
		}
	}
}

// starts is where each prefill row's prompt computation starts (reqOf[b]: the row's request):
// after its cached blocks (for a hybrid model, after a block with DeltaNet states), but no later
// than S less the span of the positions left (the longest rest rounded up to a multiple of 16,
// as prefill pads it), so that every position of the prefill's passes (a row's padding too)
// lies in the loop's S slots. Holding a row back lengthens its rest, and so the span, and for a
// hybrid model may move it further back (to a block with states): the rule is applied until no
// start moves (each round only moves starts back, so it ends). nil: every row starts at 0.
func (p *prefixPlan) starts(reqOf []int, S int) []int {
	start := make([]int, len(reqOf))
	hit := false
	for b, ri := range reqOf {
		start[b] = len(p.held[ri]) * kvBlockTokens
		hit = hit || start[b] > 0
	}
	for moved := hit; moved; {
		span := 0
		for b, ri := range reqOf {
			span = max(span, len(p.reqs[ri].Prompt)-start[b])
		}
		limit := (S - padLen(span)) / kvBlockTokens * kvBlockTokens
		moved = false
		for b, ri := range reqOf {
			s := max(0, min(start[b], limit))
			if p.hybrid && s > 0 && s < start[b] {
				s = p.c.statefulDepth(p.held[ri], s/kvBlockTokens) * kvBlockTokens
			}
			moved = moved || s != start[b]
			start[b] = s
		}
	}
	if !slices.ContainsFunc(start, func(s int) bool { return s > 0 }) {
		return nil // as without a cache
	}
	return start
}

// load copies each prefill row's cached blocks before its start into the loop's cache (and a
// hybrid model's DeltaNet states kept with the last of them), and counts the positions
// computed and served.
func (p *prefixPlan) load(loop decodeLoop, reqOf, start []int) {
	for b, ri := range reqOf {
		s := 0
		if start != nil {
			s = start[b]
		}
		if s > 0 {
			blocks := p.held[ri][:s/kvBlockTokens]
			loop.loadPrefix(b, blocks)
			if p.hybrid {
				loop.loadState(b, blocks[len(blocks)-1].state)
			}
		}
		p.served[ri] = s
		p.c.stats.prefillTokens.Add(int64(len(p.reqs[ri].Prompt) - s))
		p.c.stats.cachedTokens.Add(int64(s))
	}
}

// prefillRows is prefill over loop's rows (reqOf[b]: row b's request; rowOf[ri]: request ri's
// first row) from start. A hybrid model feeding the cache prefills in parts, taking each row's
// DeltaNet states (states) where a part stops it at a block boundary: first where its prompt
// leaves what is cached without states (its branch: likely the end of a prefix it shares with
// others, so the next such prompt starts there), then its prompt's last boundary, then the rest
// (under 16 positions a row). A part in which no row moves is skipped. Logits are prefill's,
// positions of every part.
func (p *prefixPlan) prefillRows(e *Engine, loop decodeLoop, reqs []SampleRequest, rows []*sampleRow, first map[int]int, rowOf []int, maxPrompt int, sink rowSink, start []int) ([][]float64, int, error) {
	if !p.hybrid || !p.c.on() || !p.feeds() {
		return prefill(loop.step, reqs, rows, first, maxPrompt, e.prefillChunk(loop, len(rows), leftToPrefill(rows, start)), sink, start)
	}
	B := len(rows)
	at, branch, edge := make([]int, B), make([]int, B), make([]int, B)
	if start != nil {
		copy(at, start)
	}
	for b, r := range rows {
		edge[b] = max(at[b], len(r.prompt)/kvBlockTokens*kvBlockTokens)
		branch[b] = at[b]
		if k := p.branch[r.req] * kvBlockTokens; k > at[b] && k < edge[b] {
			branch[b] = k
		}
	}
	var logits [][]float64
	merge := func(part [][]float64) {
		if logits == nil {
			logits = part
			return
		}
		for i, l := range part {
			if l != nil { // each position is computed by one part
				logits[i] = l
			}
		}
	}
	for _, stop := range [][]int{branch, edge} {
		moves := false
		trunc := make([]*sampleRow, B)
		for b, r := range rows {
			t := *r
			t.prompt = r.prompt[:stop[b]]
			trunc[b] = &t
			moves = moves || stop[b] > at[b]
		}
		if !moves {
			continue
		}
		// at, not nil, even when all 0: every row's lens are given, so a row that does not move
		// keeps its state instead of taking one over padding.
		part, _, err := prefill(loop.step, reqs, trunc, first, maxPrompt, e.prefillChunk(loop, B, leftToPrefill(trunc, at)), sink, slices.Clone(at))
		if err != nil {
			return nil, 0, err
		}
		merge(part)
		for ri, b := range rowOf {
			// A row that does not move came with the states of the block it stands at.
			if p.ok[ri] && stop[b] > at[b] {
				if st, free, bytes := loop.takeState(b); st != nil {
					p.states[ri] = append(p.states[ri], &blockState{at: stop[b]/kvBlockTokens - 1, st: st, free: free, bytes: bytes})
				}
			}
		}
		copy(at, stop)
	}
	rest := at
	if !slices.ContainsFunc(rest, func(q int) bool { return q > 0 }) {
		rest = nil // no row has a whole block: the plain prefill from 0
	}
	part, T, err := prefill(loop.step, reqs, rows, first, maxPrompt, e.prefillChunk(loop, B, leftToPrefill(rows, rest)), sink, rest)
	if err != nil {
		return nil, 0, err
	}
	merge(part)
	return logits, T, nil
}

// store feeds the cache from a prefilled loop: each request's whole blocks, from row rowOf[ri]
// (its first prefill row), unless its weights changed during the prefill; and a hybrid model's
// states taken at block boundaries (freed here when the cache does not take them).
func (p *prefixPlan) store(loop decodeLoop, rowOf []int) {
	defer p.freeStates()
	if !p.c.on() {
		return
	}
	for ri, r := range p.reqs {
		if k, settled := weightsKeyOf(p.adapters[ri]); !p.ok[ri] || !settled || k != p.keys[ri] {
			continue
		}
		if p.hybrid && len(p.states[ri]) == 0 {
			continue // the keys and values alone could serve no hybrid prompt
		}
		b := rowOf[ri]
		p.c.store(p.keys[ri], r.Prompt, loop.newBlock, func(i int, kv any) bool { return loop.saveBlock(b, i, kv) }, p.states[ri])
	}
}

// freeStates frees the DeltaNet states the cache did not take.
func (p *prefixPlan) freeStates() {
	for ri, sts := range p.states {
		for _, st := range sts {
			if !st.taken {
				st.free()
			}
		}
		p.states[ri] = nil
	}
}

// release gives back every block the plan holds, and states not stored.
func (p *prefixPlan) release() {
	for ri := range p.held {
		p.c.release(p.held[ri])
		p.held[ri] = nil
	}
	p.freeStates()
}
