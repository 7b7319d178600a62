package engine

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/skein-ai/skein/engine/internal/backend"
)

// tokensFrom is a prompt of n tokens, the same for the same seed (ids in the tiny vocabulary).
func tokensFrom(seed, n int) []int {
	p := make([]int, n)
	for i := range p {
		p[i] = (i*53+seed*29+7)%400 + 3
	}
	return p
}

// withoutCache runs f with the engine's prefix cache off (no lookups, nothing stored): the
// reference a cached answer must equal.
func withoutCache(e *Engine, f func()) {
	c := e.base.prefix
	c.mu.Lock()
	capBytes := c.capBytes
	c.capBytes = 0
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.capBytes = capBytes
		c.mu.Unlock()
	}()
	f()
}

// sameSamples fails unless got equals want: the same tokens, logprobs within tol (float32
// rounding, or float64's), prompt logprobs too.
func sameSamples(t *testing.T, what string, want, got *SampleResult, tol float64) {
	t.Helper()
	if want.Err != nil || got.Err != nil {
		t.Fatalf("%s: errors %v, %v", what, want.Err, got.Err)
	}
	if len(want.Sequences) != len(got.Sequences) {
		t.Fatalf("%s: %d sequences, want %d", what, len(got.Sequences), len(want.Sequences))
	}
	for s, w := range want.Sequences {
		g := got.Sequences[s]
		if !slices.Equal(w.Tokens, g.Tokens) {
			t.Fatalf("%s sample %d: tokens %v, want %v", what, s, g.Tokens, w.Tokens)
		}
		for k, lp := range w.Logprobs {
			if d := math.Abs(lp - g.Logprobs[k]); d > tol {
				t.Fatalf("%s sample %d token %d: logprob %v, want %v", what, s, k, g.Logprobs[k], lp)
			}
		}
	}
	for k, lp := range want.PromptLogprobs {
		if d := math.Abs(lp - got.PromptLogprobs[k]); d > tol && !math.IsNaN(lp) {
			t.Fatalf("%s prompt logprob %d: %v, want %v", what, k, got.PromptLogprobs[k], lp)
		}
	}
}

// checkBlocks verifies the cache's bookkeeping: every block's references are its children in
// the cache plus holds[b] (the holds the test knows of), none negative; the unreferenced blocks
// are exactly those on the LRU list; bytes are the blocks' sum and within the cap.
func checkBlocks(t *testing.T, c *prefixCache, holds map[*kvBlock]int) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	children := map[*kvBlock]int{}
	var bytes int64
	for k, b := range c.blocks {
		if b.key != k {
			t.Fatalf("block %d is stored under another key", b.id)
		}
		if b.parent != nil {
			if c.blocks[b.parent.key] != b.parent {
				t.Fatalf("block %d's parent %d is not in the cache", b.id, b.parent.id)
			}
			children[b.parent]++
		}
		if b.size != kvBytes(b.kv) && b.state == nil {
			t.Fatalf("block %d of %d bytes holds %d of keys and values and no state", b.id, b.size, kvBytes(b.kv))
		}
		bytes += b.size
	}
	onLRU := 0
	for b := c.lruHead; b != nil; b = b.next {
		onLRU++
		if b.refs != 0 || c.blocks[b.key] != b {
			t.Fatalf("block %d on the LRU list with %d references", b.id, b.refs)
		}
	}
	for _, b := range c.blocks {
		if b.refs < 0 || b.refs != children[b]+holds[b] {
			t.Fatalf("block %d has %d references, %d children and %d holds", b.id, b.refs, children[b], holds[b])
		}
		if (b.refs == 0) != b.onLRU {
			t.Fatalf("block %d: %d references, on the LRU list %v", b.id, b.refs, b.onLRU)
		}
	}
	unreferenced := 0
	for _, b := range c.blocks {
		if b.refs == 0 {
			unreferenced++
		}
	}
	if onLRU != unreferenced {
		t.Fatalf("%d blocks on the LRU list, %d unreferenced", onLRU, unreferenced)
	}
	if bytes != c.bytes || c.bytes > c.capBytes {
		t.Fatalf("cache holds %d bytes, counted %d, cap %d", bytes, c.bytes, c.capBytes)
	}
}

// Many random schedules of lookups, stores, releases and one weights' blocks forgotten, over
// prompts sharing prefixes, under a cap of a few blocks: after every operation the references are exactly the children and the
// live holds, the bytes stay under the cap; at the end, with every hold released and every
// block evicted, each block allocated was freed once and the cache is empty.
func TestPrefixCacheReferencesUnderRandomSchedules(t *testing.T) {
	const blockBytes = 2 * 4 * 2 * kvBlockTokens * 3 // two tensors of [2 heads, 3 dims, 16 slots] float32
	for seed := range 40 {
		rng := rand.New(rand.NewPCG(uint64(seed), 7))
		c := newPrefixCache(int64(blockBytes * (1 + rng.IntN(8))))
		allocated, freed := 0, map[int]int{}
		alloc := func() (any, func()) {
			if rng.IntN(20) == 0 {
				return nil, nil // a failed allocation stores nothing
			}
			allocated++
			id := allocated
			return backend.KV[float32]{KeysT: backend.Tensor[float32]{Dims: []int{2, 3, kvBlockTokens}}, Values: backend.Tensor[float32]{Dims: []int{2, kvBlockTokens, 3}}},
				func() { freed[id]++ }
		}
		fill := func(int, any) bool { return rng.IntN(25) != 0 } // a failed copy stores nothing
		// Prompts from a few stems, so they share leading blocks.
		prompt := func() []int {
			p := tokensFrom(rng.IntN(3), rng.IntN(6)*kvBlockTokens+rng.IntN(kvBlockTokens))
			if len(p) > kvBlockTokens && rng.IntN(2) == 0 {
				p[len(p)-1-rng.IntN(kvBlockTokens)] = 1 // a differing tail
			}
			return p
		}
		weights := []weightsKey{{}, {adapter: 1, version: 2}}
		holds := map[*kvBlock]int{}
		var live [][]*kvBlock
		for range 300 {
			switch op := rng.IntN(7); {
			case op == 6:
				// An adapter's weights dropped (an optimizer step, a delete): its unheld blocks go.
				c.forget(func(w weightsKey) bool { return w == weights[1] })
				c.mu.Lock()
				for _, b := range c.blocks {
					if b.key.weights == weights[1] && b.refs == 0 {
						t.Fatalf("block %d of forgotten weights left unreferenced", b.id)
					}
				}
				c.mu.Unlock()
			case op < 2:
				p := prompt()
				got, _ := c.lookup(weights[rng.IntN(2)], p, rng.IntN(8), false)
				for _, b := range got {
					holds[b]++
				}
				live = append(live, got)
			case op < 4:
				c.store(weights[rng.IntN(2)], prompt(), alloc, fill, nil)
			case len(live) > 0:
				i := rng.IntN(len(live))
				for _, b := range live[i] {
					holds[b]--
				}
				c.release(live[i])
				live = slices.Delete(live, i, i+1)
			}
			checkBlocks(t, c, holds)
		}
		for _, h := range live {
			for _, b := range h {
				holds[b]--
			}
			c.release(h)
		}
		checkBlocks(t, c, holds)
		c.mu.Lock()
		for c.lruHead != nil {
			c.evict(c.lruHead)
		}
		left := len(c.blocks)
		c.mu.Unlock()
		if left != 0 || c.bytes != 0 {
			t.Fatalf("seed %d: %d blocks and %d bytes left with nothing held", seed, left, c.bytes)
		}
		for id := 1; id <= allocated; id++ {
			if freed[id] != 1 {
				t.Fatalf("seed %d: block allocation %d freed %d times", seed, id, freed[id])
			}
		}
	}
}

// A later request whose prompt starts with cached blocks prefills only the rest, and samples
// what it samples with no cache: the same tokens, logprobs within float32 (float64) rounding.
// In one batch: a prompt extending a cached one (forked over samples), the cached prompt itself
// (all but its last position served), a request of one sample, one asking for prompt logprobs
// (computed whole: exact), and a new prompt (no hit), so rows start at different positions.
func TestPrefixCacheSamplesAsWithoutIt(t *testing.T) {
	for _, c := range []struct {
		arch Arch
		f64  bool
		tol  float64
	}{{ArchQwen3, false, 1e-4}, {ArchLlama, false, 1e-4}, {ArchQwen3, true, 1e-9}} {
		t.Run(fmt.Sprintf("%s/f64=%v", c.arch, c.f64), func(t *testing.T) {
			e := loadTiny(t, c.arch, Options{KVCacheMB: 16, Float64: c.f64})
			seed := int64(5)
			params := SampleParams{MaxTokens: 6, Temperature: 1, Seed: &seed}
			base := tokensFrom(1, 50)
			first := []SampleRequest{{Prompt: base, NumSamples: 2, Params: params}}
			if _, err := e.SampleBatch(context.Background(), "", first); err != nil {
				t.Fatal(err)
			}
			if st := e.SamplerStats(); st.CacheBlocks != 3 || st.CachedTokens != 0 {
				t.Fatalf("after the first prompt of 50 tokens: %+v, want its 3 whole blocks stored and nothing served", st)
			}
			longer := append(slices.Clone(base), tokensFrom(2, 30)...)
			reqs := []SampleRequest{
				{Prompt: longer, NumSamples: 3, Params: params},
				{Prompt: base, NumSamples: 2, Params: SampleParams{MaxTokens: 5, Temperature: 0.7, TopK: 20, Seed: &seed}},
				{Prompt: base[:40], NumSamples: 1, Params: params},
				{Prompt: base, NumSamples: 2, PromptLogprobs: true, Params: params},
				{Prompt: tokensFrom(3, 37), NumSamples: 2, Params: params},
			}
			for _, batch := range [][]SampleRequest{reqs, {reqs[0]}, {reqs[2]}} {
				before := e.SamplerStats()
				got, err := e.SampleBatch(context.Background(), "", batch)
				if err != nil {
					t.Fatal(err)
				}
				after := e.SamplerStats()
				cached := after.CachedTokens - before.CachedTokens
				if cached == 0 {
					t.Fatalf("no prompt position served from the cache: %+v", after)
				}
				if computed, asked := after.PrefillTokens-before.PrefillTokens, after.PromptTokens-before.PromptTokens; computed+cached > asked || computed == 0 {
					t.Fatalf("%d positions computed and %d served of %d requested", computed, cached, asked)
				}
				for i, r := range batch {
					var alone []*SampleResult
					withoutCache(e, func() { alone, err = e.SampleBatch(context.Background(), "", []SampleRequest{r}) })
					if err != nil {
						t.Fatal(err)
					}
					sameSamples(t, fmt.Sprintf("request %d of %d", i, len(batch)), alone[0], got[i], c.tol)
				}
			}
		})
	}
}

// A row with a long cached prefix beside a row with a long prompt left to compute: the padded
// span of the rest would run past the loop's slots from the cached row's start, so that row
// starts earlier (computing some cached positions again) and samples as without the cache.
func TestPrefixCacheStartFitsTheLoopsSlots(t *testing.T) {
	e := loadTiny(t, ArchQwen3, Options{KVCacheMB: 16})
	seed := int64(2)
	params := SampleParams{MaxTokens: 4, Temperature: 1, Seed: &seed}
	long := tokensFrom(4, 100)
	if _, err := e.SampleBatch(context.Background(), "", []SampleRequest{{Prompt: long, Params: params}}); err != nil {
		t.Fatal(err)
	}
	// S = 128 slots (104 positions, to a power of 2); 6 blocks (96 positions) of long are
	// cached; the other prompt leaves 90 positions, a span of 96 (to a multiple of 16), past the
	// slots from 96: so long starts at 128 - 96 = 32.
	reqs := []SampleRequest{{Prompt: long, Params: params}, {Prompt: tokensFrom(5, 90), Params: params}}
	before := e.SamplerStats()
	got, err := e.SampleBatch(context.Background(), "", reqs)
	if err != nil {
		t.Fatal(err)
	}
	if cached := e.SamplerStats().CachedTokens - before.CachedTokens; cached != 32 || got[0].CachedTokens != 32 || got[1].CachedTokens != 0 {
		t.Fatalf("%d positions served (%d and %d by request), want 32 to the first (the start held back to fit the slots)", cached, got[0].CachedTokens, got[1].CachedTokens)
	}
	for i, r := range reqs {
		var alone []*SampleResult
		withoutCache(e, func() { alone, err = e.SampleBatch(context.Background(), "", []SampleRequest{r}) })
		if err != nil {
			t.Fatal(err)
		}
		sameSamples(t, fmt.Sprintf("request %d", i), alone[0], got[i], 1e-4)
	}
}

// An adapter's prompts are cached under its identity and the version of its weights: the base
// model's blocks do not serve it, its own do until an optimizer step changes its weights (which
// drops them: no request can name those weights again, nor a deleted adapter's), and what it
// samples from a hit is what it samples without the cache (its weights trained away from the
// base's, so a wrong hit would show).
func TestPrefixCacheKeysByAdapterAndVersion(t *testing.T) {
	e := loadTiny(t, ArchQwen3, Options{KVCacheMB: 16})
	if _, err := e.CreateAdapter("a", LoraConfig{Rank: 4, Seed: 1, TrainAttn: true, TrainMLP: true}); err != nil {
		t.Fatal(err)
	}
	train := func() {
		t.Helper()
		if _, err := e.ForwardBackward(context.Background(), "a", []Datum{textDatum(tokensFrom(7, 40))}, "cross_entropy", nil); err != nil {
			t.Fatal(err)
		}
		if _, err := e.OptimStep(context.Background(), "a", AdamParams{LearningRate: 1e-2, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8}); err != nil {
			t.Fatal(err)
		}
	}
	train()
	seed := int64(4)
	req := SampleRequest{Prompt: tokensFrom(6, 45), NumSamples: 2, Params: SampleParams{MaxTokens: 5, Temperature: 1, Seed: &seed}}
	sample := func(id string) (*SampleResult, int64) {
		t.Helper()
		before := e.SamplerStats().CachedTokens
		res, err := e.SampleBatch(context.Background(), id, []SampleRequest{req})
		if err != nil {
			t.Fatal(err)
		}
		return res[0], e.SamplerStats().CachedTokens - before
	}
	if _, hit := sample(""); hit != 0 {
		t.Fatalf("the base model's first sample served %d positions from an empty cache", hit)
	}
	if _, hit := sample("a"); hit != 0 {
		t.Fatalf("the adapter's first sample was served %d positions of the base model's blocks", hit)
	}
	got, hit := sample("a")
	if hit != 32 || got.CachedTokens != 32 {
		t.Fatalf("the adapter's second sample served %d positions, want its 2 blocks (32)", hit)
	}
	var want []*SampleResult
	var err error
	withoutCache(e, func() { want, err = e.SampleBatch(context.Background(), "a", []SampleRequest{req}) })
	if err != nil {
		t.Fatal(err)
	}
	sameSamples(t, "adapter from its cached prefix", want[0], got, 1e-4)
	var baseRes []*SampleResult
	withoutCache(e, func() { baseRes, err = e.SampleBatch(context.Background(), "", []SampleRequest{req}) })
	if err != nil {
		t.Fatal(err)
	}
	if slices.Equal(baseRes[0].Sequences[0].Logprobs, want[0].Sequences[0].Logprobs) {
		t.Fatal("the trained adapter samples the base model's logprobs: the test cannot tell their blocks apart")
	}
	blocks := func() (base, adapter int) {
		c := e.base.prefix
		c.mu.Lock()
		defer c.mu.Unlock()
		for k := range c.blocks {
			if k.weights.adapter == 0 {
				base++
			} else {
				adapter++
			}
		}
		return base, adapter
	}
	if b, a := blocks(); b != 2 || a != 2 {
		t.Fatalf("%d base and %d adapter blocks cached, want 2 and 2", b, a)
	}
	train()
	if b, a := blocks(); b != 2 || a != 0 {
		t.Fatalf("after an optimizer step %d base and %d adapter blocks are cached, want the old weights' gone", b, a)
	}
	if _, hit := sample("a"); hit != 0 {
		t.Fatalf("after an optimizer step the adapter was served %d positions of its old weights' blocks", hit)
	}
	// A sampler's weights loaded again under the same name are other weights.
	dir := t.TempDir()
	if err := e.SaveAdapter(context.Background(), "a", dir, false); err != nil {
		t.Fatal(err)
	}
	for round := range 2 {
		if err := e.LoadSnapshot(context.Background(), "s", dir); err != nil {
			t.Fatal(err)
		}
		if b, a := blocks(); b != 2 || a != 2 {
			t.Fatalf("snapshot loaded (round %d): %d base and %d adapter blocks, want the replaced snapshot's gone", round, b, a)
		}
		if _, hit := sample("s"); hit != 0 {
			t.Fatalf("a freshly loaded snapshot was served %d positions", hit)
		}
	}
	if !e.DeleteAdapter(context.Background(), "s") {
		t.Fatal("snapshot s was not deleted")
	}
	if !e.DeleteAdapter(context.Background(), "a") {
		t.Fatal("adapter a was not deleted")
	}
	if b, a := blocks(); b != 2 || a != 0 {
		t.Fatalf("after deleting the adapter %d base and %d adapter blocks are cached, want its blocks gone", b, a)
	}
	checkBlocks(t, e.base.prefix, nil)
}

// The cache never holds more bytes than its cap: many different prompts through a cap of three
// blocks evict the least recently used, and what is left is within the cap with nothing held.
func TestPrefixCacheStaysUnderItsCap(t *testing.T) {
	e := loadTiny(t, ArchQwen3, Options{KVCacheMB: 1})
	c := e.base.prefix
	seed := int64(1)
	params := SampleParams{MaxTokens: 2, Temperature: 1, Seed: &seed}
	if _, err := e.SampleBatch(context.Background(), "", []SampleRequest{{Prompt: tokensFrom(0, 20), Params: params}}); err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	c.capBytes = 3 * c.blockBytes
	c.mu.Unlock()
	rng := rand.New(rand.NewPCG(1, 1))
	for i := range 12 {
		var reqs []SampleRequest
		for k := range 1 + rng.IntN(3) {
			reqs = append(reqs, SampleRequest{Prompt: tokensFrom(10*i+k, 17+rng.IntN(60)), NumSamples: 1 + rng.IntN(3), Params: params})
		}
		if _, err := e.SampleBatch(context.Background(), "", reqs); err != nil {
			t.Fatal(err)
		}
		checkBlocks(t, c, nil)
	}
	if st := e.SamplerStats(); st.EvictedBlocks == 0 || st.CacheBytes > st.CacheCapBytes || st.LoopKVBytes != 0 {
		t.Fatalf("%+v: want evictions, the bytes within the cap and no loop's keys and values left", st)
	}

}

// Forks of an engine (replicas of one model) share its prefix cache; sampling on several at once,
// prompts overlapping, leaves the blocks' references exactly their children's (no request holds
// one after it returns), and every answer is what the request samples without the cache.
func TestPrefixCacheSharedByForksSamplingAtOnce(t *testing.T) {
	e := loadTiny(t, ArchQwen3, Options{KVCacheMB: 16})
	forks := []*Engine{e, e.Fork(), e.Fork()}
	seed := int64(8)
	params := SampleParams{MaxTokens: 3, Temperature: 1, Seed: &seed}
	prompt := func(g, i int) []int { // a shared stem, then a part of its own
		return append(tokensFrom(9, 24+16*(i%3)), tokensFrom(g*10+i, 9)...)
	}
	type outcome struct {
		req SampleRequest
		got *SampleResult
	}
	results := make([][]outcome, len(forks))
	done := make(chan error, len(forks))
	for g, f := range forks {
		go func() {
			for i := range 6 {
				req := SampleRequest{Prompt: prompt(g, i), NumSamples: 1 + i%2, Params: params}
				res, err := f.SampleBatch(context.Background(), "", []SampleRequest{req})
				if err != nil {
					done <- err
					return
				}
				results[g] = append(results[g], outcome{req, res[0]})
			}
			done <- nil
		}()
	}
	for range forks {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	checkBlocks(t, e.base.prefix, nil)
	if st := e.SamplerStats(); st.CachedTokens == 0 || st.LoopKVBytes != 0 {
		t.Fatalf("%+v: want positions served across the forks, no loop left", st)
	}
	for g, rs := range results {
		for i, r := range rs {
			var alone []*SampleResult
			var err error
			withoutCache(e, func() { alone, err = e.SampleBatch(context.Background(), "", []SampleRequest{r.req}) })
			if err != nil {
				t.Fatal(err)
			}
			sameSamples(t, fmt.Sprintf("fork %d request %d", g, i), alone[0], r.got, 1e-4)
		}
	}
}

// A hybrid model's prompt served from the cache starts after a block kept with the DeltaNet
// states a row had there (the prefill stops each row at its last block boundary once to take
// them), and samples what it samples without the cache, in float32 and float64: prompts
// extending a cached one, the cached one itself, one of a single sample (no fork) and a new one
// in one batch; then a prompt extending the extension (its states kept at its own last block).
func TestPrefixCacheHybridKeepsDeltaNetStates(t *testing.T) {
	for _, c := range []struct {
		f64 bool
		tol float64
	}{{false, 1e-4}, {true, 1e-9}} {
		t.Run(fmt.Sprintf("f64=%v", c.f64), func(t *testing.T) {
			e := loadTiny(t, ArchQwen3_5, Options{KVCacheMB: 16, Float64: c.f64})
			seed := int64(6)
			params := SampleParams{MaxTokens: 6, Temperature: 1, Seed: &seed}
			base := tokensFrom(1, 50)
			if _, err := e.SampleBatch(context.Background(), "", []SampleRequest{{Prompt: base, NumSamples: 2, Params: params}}); err != nil {
				t.Fatal(err)
			}
			longer := append(slices.Clone(base), tokensFrom(2, 30)...)
			longest := append(slices.Clone(longer), tokensFrom(3, 5)...)
			for _, step := range []struct {
				reqs   []SampleRequest
				cached int64
			}{
				{[]SampleRequest{
					{Prompt: longer, NumSamples: 3, Params: params},
					{Prompt: base, NumSamples: 2, Params: SampleParams{MaxTokens: 5, Temperature: 0.7, TopK: 20, Seed: &seed}},
					{Prompt: tokensFrom(4, 37), NumSamples: 2, Params: params},
				}, 48 + 48},
				{[]SampleRequest{{Prompt: base, Params: params}}, 48},
				{[]SampleRequest{{Prompt: longest, NumSamples: 2, Params: params}}, 80},
			} {
				before := e.SamplerStats()
				got, err := e.SampleBatch(context.Background(), "", step.reqs)
				if err != nil {
					t.Fatal(err)
				}
				if cached := e.SamplerStats().CachedTokens - before.CachedTokens; cached != step.cached {
					t.Fatalf("%d positions served, want %d", cached, step.cached)
				}
				for i, r := range step.reqs {
					var alone []*SampleResult
					withoutCache(e, func() { alone, err = e.SampleBatch(context.Background(), "", []SampleRequest{r}) })
					if err != nil {
						t.Fatal(err)
					}
					sameSamples(t, fmt.Sprintf("request %d of %d", i, len(step.reqs)), alone[0], got[i], c.tol)
				}
			}
			checkBlocks(t, e.base.prefix, nil)
		})
	}
}

// Holding a hybrid row's start back to fit the loop's slots moves it to a block with DeltaNet
// states, which lengthens the longest rest and so holds other rows back in turn: a 120-position
// prompt with states kept at 112 beside a new 60-position one (a span of 64, so starts ≤ 64)
// goes back to 0, and with it the span to 128, so a 50-position prompt cached to 48 starts at
// 0 too, instead of running its padding past the 128 slots. All sample as without the cache.
func TestPrefixCacheHybridStartsFitTheSlots(t *testing.T) {
	e := loadTiny(t, ArchQwen3_5, Options{KVCacheMB: 16})
	seed := int64(3)
	params := SampleParams{MaxTokens: 4, Temperature: 1, Seed: &seed}
	long, short := tokensFrom(5, 120), tokensFrom(6, 50)
	for _, p := range [][]int{long, short} {
		if _, err := e.SampleBatch(context.Background(), "", []SampleRequest{{Prompt: p, Params: params}}); err != nil {
			t.Fatal(err)
		}
	}
	reqs := []SampleRequest{{Prompt: long, Params: params}, {Prompt: tokensFrom(7, 60), Params: params}, {Prompt: short, Params: params}}
	got, err := e.SampleBatch(context.Background(), "", reqs)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range reqs {
		if got[i].CachedTokens != 0 {
			t.Fatalf("request %d started at %d, want 0 (held back to fit the slots)", i, got[i].CachedTokens)
		}
		var alone []*SampleResult
		withoutCache(e, func() { alone, err = e.SampleBatch(context.Background(), "", []SampleRequest{r}) })
		if err != nil {
			t.Fatal(err)
		}
		sameSamples(t, fmt.Sprintf("request %d", i), alone[0], got[i], 1e-4)
	}
	// Alone, the short prompt is served to its block with states.
	res, err := e.SampleBatch(context.Background(), "", []SampleRequest{{Prompt: short, Params: params}})
	if err != nil || res[0].CachedTokens != 48 {
		t.Fatalf("alone: %v, %d positions served, want 48", err, res[0].CachedTokens)
	}
}

// A hybrid model's chat turns over a shared system prompt: the first turn keeps states only at
// its own last boundary, so the second finds the system prompt's blocks without states; its
// prefill stops there too (where its prompt leaves what is cached) and keeps the states, so the
// third turn is served the system prompt. Every turn samples as without the cache.
func TestPrefixCacheHybridKeepsStatesWherePromptsBranch(t *testing.T) {
	for _, c := range []struct {
		f64 bool
		tol float64
	}{{false, 1e-4}, {true, 1e-9}} {
		t.Run(fmt.Sprintf("f64=%v", c.f64), func(t *testing.T) {
			e := loadTiny(t, ArchQwen3_5, Options{KVCacheMB: 16, Float64: c.f64})
			seed := int64(12)
			params := SampleParams{MaxTokens: 5, Temperature: 1, Seed: &seed}
			system := tokensFrom(8, 64)
			for turn, want := range []int{0, 0, 64, 64} {
				req := SampleRequest{Prompt: append(slices.Clone(system), tokensFrom(20+turn, 20)...), NumSamples: 1 + turn%2, Params: params}
				got, err := e.SampleBatch(context.Background(), "", []SampleRequest{req})
				if err != nil {
					t.Fatal(err)
				}
				if got[0].CachedTokens != want {
					t.Fatalf("turn %d: %d positions served, want %d", turn, got[0].CachedTokens, want)
				}
				var alone []*SampleResult
				withoutCache(e, func() { alone, err = e.SampleBatch(context.Background(), "", []SampleRequest{req}) })
				if err != nil {
					t.Fatal(err)
				}
				sameSamples(t, fmt.Sprintf("turn %d", turn), alone[0], got[0], c.tol)
			}
			checkBlocks(t, e.base.prefix, nil)
		})
	}
}

// Stores of the same and overlapping prompts from many goroutines at once (their copies made
// outside the cache's lock, so two may copy one block): each block is stored once, a duplicate
// copy is freed, every copy is either in the cache or freed exactly once, and the references
// are exactly the children's when all are done.
func TestPrefixCacheConcurrentStoresShareBlocks(t *testing.T) {
	const blockBytes = 2 * 4 * 2 * kvBlockTokens * 3
	c := newPrefixCache(blockBytes * 40)
	var mu sync.Mutex
	allocated, freed := 0, map[int]int{}
	alloc := func() (any, func()) {
		mu.Lock()
		allocated++
		id := allocated
		mu.Unlock()
		return backend.KV[float32]{KeysT: backend.Tensor[float32]{Dims: []int{2, 3, kvBlockTokens}}, Values: backend.Tensor[float32]{Dims: []int{2, kvBlockTokens, 3}}},
			func() { mu.Lock(); freed[id]++; mu.Unlock() }
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 20 {
				p := tokensFrom(i%3, (1+(g+i)%4)*kvBlockTokens*5)
				c.store(weightsKey{}, p, alloc, func(int, any) bool { return true }, nil)
				held, _ := c.lookup(weightsKey{}, p, 100, false)
				c.release(held)
			}
		}()
	}
	wg.Wait()
	checkBlocks(t, c, nil)
	c.mu.Lock()
	inCache := map[*kvBlock]bool{}
	for _, b := range c.blocks {
		inCache[b] = true
	}
	c.mu.Unlock()
	mu.Lock()
	defer mu.Unlock()
	nFreed := 0
	for id, n := range freed {
		if n != 1 {
			t.Fatalf("copy %d freed %d times", id, n)
		}
		nFreed++
	}
	if nFreed+len(inCache) != allocated {
		t.Fatalf("%d copies made, %d freed and %d in the cache", allocated, nFreed, len(inCache))
	}
	if st := c.stats.stored.Load(); st != int64(len(inCache))+c.stats.evicted.Load() {
		t.Fatalf("%d blocks stored, %d in the cache and %d evicted", st, len(inCache), c.stats.evicted.Load())
	}
}
