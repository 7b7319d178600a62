// Package router places LoRA adapters on replicas and keeps them there. Its placement map is
// authoritative: a placed adapter's requests go to its replica every time, with no timeout
// fallback. New (or evicted, or orphaned) adapters are placed by a pipeline in the style of the
// Kubernetes inference gateway's endpoint picker: filters → weighted scorers in [0,1] → picker
// (highest score, rendezvous hash of adapter and replica to break ties, so placement is stable).
// Concurrent first requests for one adapter place it once; no replica ever holds more than its
// max_loras; when every slot is taken the least recently used idle adapter is evicted (its state
// saved first), and if none is idle the request waits for a slot.
package router

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Endpoint is what the router needs of a replica.
type Endpoint interface {
	ID() string
	BaseModel() string
	MaxLoras() int
	Healthy() bool
	QueueDepth() int
}

// Candidate is an endpoint as the pipeline sees it, with the router's own counts.
type Candidate struct {
	Endpoint Endpoint
	Held     int // adapters placed on it
	Idle     int // of those, adapters with no queued or running op (evictable)
}

// Free reports free LoRA slots.
func (c Candidate) Free() int { return c.Endpoint.MaxLoras() - c.Held }

// Request is a placement request.
type Request struct {
	Adapter   string
	BaseModel string
}

// Filter drops candidates that cannot take the request. It may filter in place (reusing the
// backing array of cands), so callers pass a slice they own.
type Filter interface {
	Name() string
	Filter(req Request, cands []Candidate) []Candidate
}

// Scorer rates a candidate in [0,1]; higher is better.
type Scorer interface {
	Name() string
	Score(req Request, c Candidate) float64
}

// WeightedScorer is a scorer and its weight in the sum.
type WeightedScorer struct {
	Scorer
	Weight float64
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
)

type placement struct {
	ep       Endpoint
	active   int // queued or running ops
	lastUsed time.Time
	loading  chan struct{} // closed when the initial load finished
	loadErr  error
}

// Router is safe for concurrent use.
type Router struct {
	filters []Filter
	scorers []WeightedScorer
	hooks   Hooks

	mu        sync.Mutex
	endpoints map[string]Endpoint
	placed    map[string]*placement
	held      map[string]int           // endpoint id -> adapters placed
	idle      map[string]int           // endpoint id -> placed adapters with active == 0
	changed   chan struct{}            // closed and replaced whenever capacity may have freed
	evicting  map[string]chan struct{} // adapters being saved and evicted: requests wait for that
	now       func() time.Time
	scratch   []Candidate // reused by pickLocked (under mu)
}

// New makes a router with a pipeline.
func New(filters []Filter, scorers []WeightedScorer, hooks Hooks) *Router {
	return &Router{filters: filters, scorers: scorers, hooks: hooks, endpoints: map[string]Endpoint{},
		placed: map[string]*placement{}, held: map[string]int{}, idle: map[string]int{},
		changed: make(chan struct{}), evicting: map[string]chan struct{}{}, now: time.Now}
}

// AddEndpoint registers a replica.
func (r *Router) AddEndpoint(ep Endpoint) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.endpoints[ep.ID()] = ep
	r.broadcast()
}

// RemoveEndpoint forgets a replica (dead worker): its adapters are re-placed on their next request.
func (r *Router) RemoveEndpoint(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.endpoints, id)
	for a, p := range r.placed {
		if p.ep.ID() == id {
			delete(r.placed, a)
		}
	}
	delete(r.held, id)
	delete(r.idle, id)
	r.broadcast()
}

func (r *Router) broadcast() {
	close(r.changed)
	r.changed = make(chan struct{})
}

// Lease is a granted route: the op runs on Endpoint, then Release must be called.
type Lease struct {
	Endpoint Endpoint
	r        *Router
	adapter  string
	once     sync.Once
}

// Release ends the op; the adapter becomes evictable when no other op holds it.
func (l *Lease) Release() {
	l.once.Do(func() {
		r := l.r
		r.mu.Lock()
		defer r.mu.Unlock()
		if p := r.placed[l.adapter]; p != nil && p.ep.ID() == l.Endpoint.ID() {
			p.active--
			p.lastUsed = r.now()
			if p.active == 0 {
				r.idle[p.ep.ID()]++
				r.broadcast()
			}
		}
	})
}

// Where reports an adapter's replica, if placed.
func (r *Router) Where(adapter string) (Endpoint, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.placed[adapter]
	if p == nil {
		return nil, false
	}
	return p.ep, true
}

// Acquire routes one op of an adapter: to its replica if placed (and healthy), else it places it
// (loading it, evicting an idle adapter if the chosen replica is full, or waiting for a slot).
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
		if p := r.placed[req.Adapter]; p != nil {
			if !p.ep.Healthy() {
				r.unplaceLocked(req.Adapter, p)
			} else {
				if p.active == 0 && p.loading == nil {
					r.idle[p.ep.ID()]--
				}
				p.active++
				loading := p.loading
				r.mu.Unlock()
				if loading != nil { // another request is placing it: wait for that one load
					select {
					case <-loading:
					case <-ctx.Done():
						r.releaseFailed(req.Adapter, p)
						return nil, ctx.Err()
					}
					if p.loadErr != nil {
						r.releaseFailed(req.Adapter, p)
						return nil, p.loadErr
					}
				}
				return &Lease{Endpoint: p.ep, r: r, adapter: req.Adapter}, nil
			}
		}
		ep, victim, err := r.pickLocked(req)
		if err != nil {
			r.mu.Unlock()
			return nil, err
		}
		if ep == nil { // everything is full and busy: wait for a release
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
		// Reserve the slot (and the victim's) before unlocking, so concurrent placements count it.
		p := &placement{ep: ep, active: 1, lastUsed: r.now(), loading: make(chan struct{})}
		r.placed[req.Adapter] = p
		r.held[ep.ID()]++
		var vp *placement
		if victim != "" {
			vp = r.placed[victim]
			delete(r.placed, victim) // requests for it now wait, then place it afresh
			r.evicting[victim] = make(chan struct{})
			vp.active++ // keep its slot counted until the eviction finishes
			r.idle[ep.ID()]--
		}
		r.mu.Unlock()
		err = nil
		if victim != "" && r.hooks.Evict != nil {
			err = r.hooks.Evict(ctx, victim, ep)
		}
		r.mu.Lock()
		if victim != "" {
			r.held[ep.ID()]--
			if err != nil { // the victim stays where it was
				vp.active--
				r.placed[victim] = vp
				r.held[ep.ID()]++
				r.idle[ep.ID()]++
			}
			close(r.evicting[victim])
			delete(r.evicting, victim)
		}
		r.mu.Unlock()
		if err == nil && r.hooks.Load != nil {
			err = r.hooks.Load(ctx, req.Adapter, ep)
		}
		r.mu.Lock()
		p.loadErr = err
		close(p.loading)
		p.loading = nil
		if err != nil {
			r.unplaceLocked(req.Adapter, p)
			r.mu.Unlock()
			return nil, fmt.Errorf("placing %s on %s: %w", req.Adapter, ep.ID(), err)
		}
		r.mu.Unlock()
		return &Lease{Endpoint: ep, r: r, adapter: req.Adapter}, nil
	}
}

func (r *Router) releaseFailed(adapter string, p *placement) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p.active--
	if r.placed[adapter] == p && p.active == 0 && p.loading == nil {
		r.idle[p.ep.ID()]++
	}
	r.broadcast()
}

func (r *Router) unplaceLocked(adapter string, p *placement) {
	if r.placed[adapter] != p {
		return
	}
	delete(r.placed, adapter)
	r.held[p.ep.ID()]--
	if p.active == 0 && p.loading == nil {
		r.idle[p.ep.ID()]--
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

// pickLocked runs the pipeline. It returns the endpoint and, if that endpoint is full, the idle
// adapter to evict from it; (nil, "", nil) means wait.
func (r *Router) pickLocked(req Request) (Endpoint, string, error) {
	cands := r.scratch[:0]
	for _, ep := range r.endpoints {
		cands = append(cands, Candidate{Endpoint: ep, Held: r.held[ep.ID()], Idle: r.idle[ep.ID()]})
	}
	for _, f := range r.filters {
		cands = f.Filter(req, cands)
	}
	r.scratch = cands[:0]
	if len(cands) == 0 {
		return nil, "", fmt.Errorf("%w (%s)", ErrNoEndpoint, req.BaseModel)
	}
	var best *Candidate
	var bestScore float64
	var bestHash uint64
	for i := range cands {
		c := &cands[i]
		if c.Free() <= 0 && c.Idle <= 0 {
			continue // full and nothing evictable
		}
		score := 0.0
		for _, s := range r.scorers {
			score += s.Weight * s.Score(req, *c)
		}
		h := Rendezvous(req.Adapter, c.Endpoint.ID())
		if best == nil || score > bestScore || (score == bestScore && h > bestHash) {
			best, bestScore, bestHash = c, score, h
		}
	}
	if best == nil {
		return nil, "", nil
	}
	if best.Free() > 0 {
		return best.Endpoint, "", nil
	}
	// Full: evict the least recently used idle adapter there.
	var victim string
	var oldest time.Time
	for a, p := range r.placed {
		if p.ep.ID() == best.Endpoint.ID() && p.active == 0 && p.loading == nil && (victim == "" || p.lastUsed.Before(oldest)) {
			victim, oldest = a, p.lastUsed
		}
	}
	if victim == "" {
		return nil, "", nil
	}
	return best.Endpoint, victim, nil
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
}

// Usage reports every endpoint's load.
func (r *Router) Usage() []Usage {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Usage, 0, len(r.endpoints))
	for _, ep := range r.endpoints {
		out = append(out, Usage{Endpoint: ep, Held: r.held[ep.ID()], Idle: r.idle[ep.ID()]})
	}
	return out
}
