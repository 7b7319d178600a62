// Package router places LoRA adapters on replicas and keeps them there, and chooses where
// sampling runs. Its placement map is authoritative: a placed adapter's requests go to its
// replica every time, with no timeout fallback. Both choices run a profile in the style of the
// Kubernetes inference gateway's endpoint picker: filters → weighted scorers in [0,1], each seeing
// the whole candidate list → picker (router/picker/maxscore: highest score, rendezvous hash of the
// routing key and replica to break ties, so choices are stable).
//
// Placement: concurrent first requests for one adapter place it once; no replica ever holds more
// than its max_loras; when every slot of every candidate is taken, the least recently used idle
// adapter across all those candidates is evicted (its state saved first), so an idle adapter never
// keeps a replica to itself while active ones evict each other elsewhere; if none is idle the
// request waits for a slot.
package router

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
)

// Endpoint is what the router needs of a replica.
type Endpoint interface {
	ID() string
	BaseModel() string
	MaxLoras() int
	Healthy() bool
	QueueDepth() int
}

// Candidate is an endpoint as a profile sees it, with the router's own counts.
type Candidate struct {
	Endpoint Endpoint
	Held     int // adapters placed on it
	Idle     int // of those, adapters with no queued or running op (evictable)
	Ops      int // ops at the router holding or waiting for a lease on it
	Backlog  int // work waiting for it at the caller, outside the router (Request.Backlog)

	state *endpointState
}

// Free reports free LoRA slots.
func (c Candidate) Free() int { return c.Endpoint.MaxLoras() - c.Held }

// Load is the work waiting for the endpoint: what it has accepted or what the gateway has routed
// to it, whichever is more (a leased op sits in both), plus the caller's backlog for it.
func (c Candidate) Load() int { return max(c.Endpoint.QueueDepth(), c.Ops, 0) + max(c.Backlog, 0) }

// Request is a placement or sampling request.
type Request struct {
	Adapter   string
	BaseModel string
	// Key is the sticky routing key (a session header); empty: the adapter's id.
	Key string
	// Holders are the endpoints known to hold the weights already (sampling).
	Holders []string
	// Backlog, if set, reports work for an endpoint waiting outside the router (sampling
	// requests batched for it), for the queue-depth scorer.
	Backlog func(endpointID string) int
}

// RoutingKey is the key ties are broken by: Key, else the adapter.
func (r Request) RoutingKey() string {
	if r.Key != "" {
		return r.Key
	}
	return r.Adapter
}

// Filter drops candidates that cannot take the request: it returns a subset of cands, never
// candidates of its own making. It may filter in place (reusing the
// backing array of cands), so callers pass a slice they own.
type Filter interface {
	Name() string
	Filter(req Request, cands []Candidate) []Candidate
}

// Scorer rates every candidate at once (so it may compare them): it sets scores[i] in [0,1] for
// cands[i], higher better. scores has len(cands) and arrives zeroed. (The inference gateway's
// scorers return map[endpoint]float64; a slice parallel to cands allocates nothing per decision.)
type Scorer interface {
	Name() string
	Score(req Request, cands []Candidate, scores []float64)
}

// WeightedScorer is a scorer and its weight in the sum.
type WeightedScorer struct {
	Scorer
	Weight float64
}

// Picker chooses one candidate from the summed scores; -1 chooses none.
type Picker interface {
	Name() string
	Pick(req Request, cands []Candidate, scores []float64) int
}

// Profile is one routing decision's pipeline.
type Profile struct {
	Filters []Filter
	Scorers []WeightedScorer
	Picker  Picker
}

// Hooks are the side effects of placement, done by the owner of the replicas.
type Hooks struct {
	// Load makes the adapter resident on the endpoint (restore saved state or create it).
	Load func(ctx context.Context, adapter string, ep Endpoint) error
	// Evict saves the adapter's full state and removes it from the endpoint.
	Evict func(ctx context.Context, adapter string, ep Endpoint) error
	// Waiting is told when a request waits for capacity, and when it stops waiting.
	Waiting func(ctx context.Context, adapter string, waiting bool, reason string)
}

// Errors.
var (
	ErrNoEndpoint = errors.New("no healthy replica serves this base model")
	ErrCapacity   = errors.New("no LoRA slot became free before the queue timeout")
	ErrNoPicker   = errors.New("the routing profile has no picker")
)

type placement struct {
	ep       *endpointState
	active   int           // queued or running ops
	lastUsed uint64        // the router's use clock: larger is more recent
	loading  chan struct{} // closed when the initial load finished
	loadErr  error
}

// endpointState is one endpoint and the router's counts for it (one map lookup per candidate).
type endpointState struct {
	ep   Endpoint
	held int // adapters placed
	idle int // placed adapters with active == 0
	ops  int // sum of active over the adapters placed (or once placed) here
}

// Router is safe for concurrent use.
type Router struct {
	place, sample Profile
	hooks         Hooks

	mu        sync.Mutex
	endpoints map[string]*endpointState
	order     []*endpointState // the endpoints in the order added: iterated per decision (a slice, not the map)
	placed    map[string]*placement
	changed   chan struct{}            // closed and replaced whenever capacity may have freed
	evicting  map[string]chan struct{} // adapters being saved and evicted: requests wait for that
	clock     uint64                   // counts uses, for LRU (deterministic, unlike wall time)
	scratch   []Candidate              // reused under mu
	scores    []float64                // reused under mu: summed scores
	partial   []float64                // reused under mu: one scorer's scores
	full      map[string]bool          // reused under mu: endpoints that must evict to place
}

// New makes a router with a placement profile and a sampling profile.
func New(place, sample Profile, hooks Hooks) *Router {
	return &Router{place: place, sample: sample, hooks: hooks, endpoints: map[string]*endpointState{},
		placed: map[string]*placement{}, changed: make(chan struct{}), evicting: map[string]chan struct{}{},
		full: map[string]bool{}}
}

// AddEndpoint registers a replica (again: its counts restart).
func (r *Router) AddEndpoint(ep Endpoint) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if old := r.endpoints[ep.ID()]; old != nil {
		r.dropLocked(old)
		r.order = slices.DeleteFunc(r.order, func(x *endpointState) bool { return x == old })
	}
	es := &endpointState{ep: ep}
	r.endpoints[ep.ID()] = es
	r.order = append(r.order, es)
	r.broadcast()
}

// RemoveEndpoint forgets a replica (dead worker): its adapters are re-placed on their next request.
func (r *Router) RemoveEndpoint(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if es := r.endpoints[id]; es != nil {
		r.dropLocked(es)
		r.order = slices.DeleteFunc(r.order, func(x *endpointState) bool { return x == es })
	}
	delete(r.endpoints, id)
	r.broadcast()
}

func (r *Router) dropLocked(es *endpointState) {
	for a, p := range r.placed {
		if p.ep == es {
			delete(r.placed, a)
		}
	}
}

func (r *Router) broadcast() {
	close(r.changed)
	r.changed = make(chan struct{})
}

func (r *Router) tick() uint64 {
	r.clock++
	return r.clock
}

// Lease is a granted route: the op runs on Endpoint, then Release must be called.
type Lease struct {
	Endpoint Endpoint
	r        *Router
	adapter  string
	p        *placement
	once     sync.Once
}

// Release ends the op; the adapter becomes evictable when no other op holds it.
func (l *Lease) Release() {
	l.once.Do(func() {
		r := l.r
		r.mu.Lock()
		defer r.mu.Unlock()
		r.endOpLocked(l.adapter, l.p)
	})
}

// endOpLocked ends one op of p (released, or given up while waiting for the load).
func (r *Router) endOpLocked(adapter string, p *placement) {
	p.active--
	p.ep.ops--
	if r.placed[adapter] != p {
		return // unplaced meanwhile: its slot was already given back
	}
	p.lastUsed = r.tick()
	if p.active == 0 && p.loading == nil {
		p.ep.idle++
		r.broadcast()
	}
}

// Where reports an adapter's replica, if placed.
func (r *Router) Where(adapter string) (Endpoint, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.placed[adapter]
	if p == nil {
		return nil, false
	}
	return p.ep.ep, true
}

// Acquire routes one op of an adapter: to its replica if placed (and healthy), else it places it
// (loading it, evicting an idle adapter if every candidate is full, or waiting for a slot).
// The adapter is not evictable until the lease is released.
func (r *Router) Acquire(ctx context.Context, req Request) (*Lease, error) {
	waiting := false
	defer func() {
		if waiting && r.hooks.Waiting != nil {
			r.hooks.Waiting(ctx, req.Adapter, false, "")
		}
	}()
	for {
		r.mu.Lock()
		if ch := r.evicting[req.Adapter]; ch != nil { // its state is being saved: load it after that
			r.mu.Unlock()
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		if p := r.placed[req.Adapter]; p != nil && !p.ep.ep.Healthy() {
			r.unplaceLocked(req.Adapter, p)
		}
		if p := r.placed[req.Adapter]; p != nil {
			return r.joinLocked(ctx, req.Adapter, p)
		}
		es, victim, err := r.pickLocked(req)
		if err != nil {
			r.mu.Unlock()
			return nil, err
		}
		if es == nil { // everything is full and busy: wait for a release
			ch := r.changed
			r.mu.Unlock()
			if !waiting && r.hooks.Waiting != nil {
				waiting = true
				r.hooks.Waiting(ctx, req.Adapter, true, "every LoRA slot of "+req.BaseModel+" holds an adapter with work queued")
			}
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return nil, fmt.Errorf("%w: %v", ErrCapacity, ctx.Err())
			}
		}
		p, vp := r.reserveLocked(req.Adapter, es, victim)
		r.mu.Unlock()
		return r.evictAndLoad(ctx, req.Adapter, p, victim, vp)
	}
}

// joinLocked takes an op on an adapter already placed (on a healthy replica), waiting for its
// load if another request is placing it. It is called with r.mu held and unlocks it.
func (r *Router) joinLocked(ctx context.Context, adapter string, p *placement) (*Lease, error) {
	if p.active == 0 && p.loading == nil {
		p.ep.idle--
	}
	p.active++
	p.ep.ops++
	loading := p.loading
	r.mu.Unlock()
	if loading != nil { // another request is placing it: wait for that one load
		select {
		case <-loading:
		case <-ctx.Done():
			r.releaseFailed(adapter, p)
			return nil, ctx.Err()
		}
		if p.loadErr != nil {
			r.releaseFailed(adapter, p)
			return nil, p.loadErr
		}
	}
	return &Lease{Endpoint: p.ep.ep, r: r, adapter: adapter, p: p}, nil
}

// reserveLocked places adapter on es and takes the victim's slot out of the map (its requests
// now wait, then place it afresh), before r.mu is unlocked, so that concurrent placements count
// both. vp is the victim's placement (nil without one).
func (r *Router) reserveLocked(adapter string, es *endpointState, victim string) (p, vp *placement) {
	p = &placement{ep: es, active: 1, lastUsed: r.tick(), loading: make(chan struct{})}
	r.placed[adapter] = p
	es.held++
	es.ops++
	if victim != "" {
		vp = r.placed[victim]
		delete(r.placed, victim)
		r.evicting[victim] = make(chan struct{})
		vp.active++ // keep its slot counted until the eviction finishes
		es.ops++
		es.idle--
	}
	return p, vp
}

// evictAndLoad saves and unloads the victim (if any), then loads adapter into the slot
// reserveLocked took. A failed eviction leaves the victim where it was; a failed load gives the
// slot back.
func (r *Router) evictAndLoad(ctx context.Context, adapter string, p *placement, victim string, vp *placement) (*Lease, error) {
	es := p.ep
	ep := es.ep
	var err error
	if victim != "" && r.hooks.Evict != nil {
		err = r.hooks.Evict(ctx, victim, ep)
	}
	r.mu.Lock()
	if victim != "" {
		es.held--
		vp.active--
		es.ops--
		if err != nil && r.endpoints[ep.ID()] == es { // the victim stays where it was
			r.placed[victim] = vp
			es.held++
			es.idle++
		}
		close(r.evicting[victim])
		delete(r.evicting, victim)
	}
	r.mu.Unlock()
	if err == nil && r.hooks.Load != nil {
		err = r.hooks.Load(ctx, adapter, ep)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	p.loadErr = err
	close(p.loading)
	p.loading = nil
	if err != nil {
		r.unplaceLocked(adapter, p)
		p.active--
		es.ops--
		return nil, fmt.Errorf("placing %s on %s: %w", adapter, ep.ID(), err)
	}
	return &Lease{Endpoint: ep, r: r, adapter: adapter, p: p}, nil
}

func (r *Router) releaseFailed(adapter string, p *placement) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.endOpLocked(adapter, p)
	r.broadcast()
}

func (r *Router) unplaceLocked(adapter string, p *placement) {
	if r.placed[adapter] != p {
		return
	}
	delete(r.placed, adapter)
	p.ep.held--
	if p.active == 0 && p.loading == nil {
		p.ep.idle--
	}
	r.broadcast()
}

// Forget unplaces an adapter (unloaded, session expired); its slot frees at once.
func (r *Router) Forget(adapter string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if p := r.placed[adapter]; p != nil {
		r.unplaceLocked(adapter, p)
	}
}

// candidatesLocked lists the endpoints as candidates, through a profile's filters.
func (r *Router) candidatesLocked(prof *Profile, req Request) []Candidate {
	cands := r.scratch[:0]
	for _, es := range r.order {
		c := Candidate{Endpoint: es.ep, Held: es.held, Idle: es.idle, Ops: es.ops, state: es}
		if req.Backlog != nil {
			c.Backlog = req.Backlog(es.ep.ID())
		}
		cands = append(cands, c)
	}
	for _, f := range prof.Filters {
		cands = f.Filter(req, cands)
	}
	r.scratch = cands[:0]
	return cands
}

// scoreLocked sums the profile's weighted scores, each clamped to [0,1].
func (r *Router) scoreLocked(prof *Profile, req Request, cands []Candidate) []float64 {
	n := len(cands)
	if cap(r.scores) < n {
		r.scores, r.partial = make([]float64, n), make([]float64, n)
	}
	sum, part := r.scores[:n], r.partial[:n]
	clear(sum)
	for _, s := range prof.Scorers {
		clear(part)
		s.Score(req, cands, part)
		for i, v := range part {
			switch {
			case !(v > 0): // also NaN (the built-in max would keep it)
				v = 0
			case v > 1:
				v = 1
			}
			sum[i] += s.Weight * v
		}
	}
	return sum
}

// pickLocked runs the placement profile. It returns the endpoint and, if it is full, the idle
// adapter to evict from it; (nil, "", nil) means wait.
func (r *Router) pickLocked(req Request) (*endpointState, string, error) {
	cands := r.candidatesLocked(&r.place, req)
	if len(cands) == 0 {
		return nil, "", fmt.Errorf("%w (%s)", ErrNoEndpoint, req.BaseModel)
	}
	// Only a free slot or an idle adapter to evict can take a new adapter.
	open := cands[:0]
	for _, c := range cands {
		if c.Free() > 0 || c.Idle > 0 {
			open = append(open, c)
		}
	}
	if len(open) == 0 {
		return nil, "", nil
	}
	if r.place.Picker == nil {
		return nil, "", ErrNoPicker
	}
	i := r.place.Picker.Pick(req, open, r.scoreLocked(&r.place, req, open))
	if i < 0 || i >= len(open) {
		return nil, "", nil
	}
	if open[i].Free() > 0 {
		return open[i].state, "", nil
	}
	// Full: evict the least recently used idle adapter of every candidate that is full, not only
	// of the one picked, so that an idle adapter cannot keep a replica to itself while active
	// adapters evict each other on another. The adapter goes where its victim was.
	clear(r.full)
	for _, c := range open {
		if c.Free() <= 0 && c.Idle > 0 {
			r.full[c.Endpoint.ID()] = true
		}
	}
	var victim string
	var vp *placement
	for a, p := range r.placed {
		if p.active == 0 && p.loading == nil && r.full[p.ep.ep.ID()] && (vp == nil || p.lastUsed < vp.lastUsed) {
			victim, vp = a, p
		}
	}
	if vp == nil {
		return nil, "", nil
	}
	return vp.ep, victim, nil
}

// Pick chooses an endpoint for work that needs no slot (sampling: the weights are read-only)
// with the sampling profile: no lease, nothing placed.
func (r *Router) Pick(req Request) (Endpoint, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	cands := r.candidatesLocked(&r.sample, req)
	if len(cands) == 0 {
		return nil, fmt.Errorf("%w (%s)", ErrNoEndpoint, req.BaseModel)
	}
	if r.sample.Picker == nil {
		return nil, ErrNoPicker
	}
	i := r.sample.Picker.Pick(req, cands, r.scoreLocked(&r.sample, req, cands))
	if i < 0 || i >= len(cands) {
		return nil, fmt.Errorf("%w (%s)", ErrNoEndpoint, req.BaseModel)
	}
	return cands[i].Endpoint, nil
}

// Rendezvous is the highest-random-weight hash of (key, endpoint): FNV-1a over both strings
// (inline, so a routing decision allocates nothing), finished with a splitmix step.
func Rendezvous(adapter, endpoint string) uint64 {
	const prime = 1099511628211
	x := uint64(14695981039346656037)
	for i := 0; i < len(adapter); i++ {
		x = (x ^ uint64(adapter[i])) * prime
	}
	x = (x ^ 0xff) * prime
	for i := 0; i < len(endpoint); i++ {
		x = (x ^ uint64(endpoint[i])) * prime
	}
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// Usage is one endpoint's load, for the admin API.
type Usage struct {
	Endpoint Endpoint
	Held     int
	Idle     int
	Ops      int // ops at the router holding or waiting for a lease on it
}

// Usage reports every endpoint's load.
func (r *Router) Usage() []Usage {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Usage, 0, len(r.endpoints))
	for _, es := range r.endpoints {
		out = append(out, Usage{Endpoint: es.ep, Held: es.held, Idle: es.idle, Ops: es.ops})
	}
	return out
}

// Adapters lists the adapters placed on each endpoint, sorted (for the admin API; it walks every
// placement).
func (r *Router) Adapters() map[string][]string {
	r.mu.Lock()
	out := make(map[string][]string, len(r.endpoints))
	for a, p := range r.placed {
		id := p.ep.ep.ID()
		out[id] = append(out[id], a)
	}
	r.mu.Unlock()
	for _, as := range out {
		sort.Strings(as)
	}
	return out
}

// Errors of Adopt.
var (
	ErrPlaced          = errors.New("the adapter is placed already")
	ErrUnknownEndpoint = errors.New("no such endpoint")
	ErrNoSlot          = errors.New("the endpoint has no free LoRA slot")
)

// Adopt records that an endpoint already holds an adapter (a worker that kept it across a
// gateway restart), without loading it: its next op goes there. The adapter starts idle (it
// may be evicted like any other). It fails if the adapter is placed (anywhere), the endpoint is
// unknown, or the endpoint's slots are all taken.
func (r *Router) Adopt(adapter, endpointID string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.placed[adapter] != nil || r.evicting[adapter] != nil {
		return fmt.Errorf("adopting %s: %w", adapter, ErrPlaced)
	}
	es := r.endpoints[endpointID]
	if es == nil {
		return fmt.Errorf("adopting %s on %s: %w", adapter, endpointID, ErrUnknownEndpoint)
	}
	if es.held >= es.ep.MaxLoras() {
		return fmt.Errorf("adopting %s on %s: %w", adapter, endpointID, ErrNoSlot)
	}
	r.placed[adapter] = &placement{ep: es, lastUsed: r.tick()}
	es.held++
	es.idle++
	r.broadcast()
	return nil
}

// Drain saves and removes, through the Evict hook, every idle adapter placed on an endpoint that
// is leaving (unhealthy but still a member), so each moves with its full state, accumulated
// gradients included, rather than from its last step's state once the endpoint is gone. Adapters
// with ops running are left to finish; their next request moves them. It stops at the first
// failed eviction (that adapter stays placed) and reports how many it evicted.
func (r *Router) Drain(ctx context.Context, endpointID string) int {
	n := 0
	for ctx.Err() == nil {
		r.mu.Lock()
		es := r.endpoints[endpointID]
		victim, vp := "", (*placement)(nil)
		if es != nil {
			for a, p := range r.placed {
				if p.ep == es && p.active == 0 && p.loading == nil {
					victim, vp = a, p
					break
				}
			}
		}
		if victim == "" || r.hooks.Evict == nil {
			r.mu.Unlock()
			return n
		}
		// As an eviction to make room: requests for it wait, then place it afresh.
		delete(r.placed, victim)
		r.evicting[victim] = make(chan struct{})
		vp.active++
		es.ops++
		es.idle--
		r.mu.Unlock()
		err := r.hooks.Evict(ctx, victim, es.ep)
		r.mu.Lock()
		es.held--
		vp.active--
		es.ops--
		if err != nil && r.endpoints[endpointID] == es {
			r.placed[victim] = vp
			es.held++
			es.idle++
		}
		close(r.evicting[victim])
		delete(r.evicting, victim)
		r.broadcast()
		r.mu.Unlock()
		if err != nil {
			return n
		}
		n++
	}
	return n
}
