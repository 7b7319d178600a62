package router_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/skein-ai/skein/router"
	"github.com/skein-ai/skein/router/picker/maxscore"
	"github.com/skein-ai/skein/router/pipeline"
)

// fakeReplica is an endpoint that records what it holds and fails the test if it ever holds
// more than max_loras.
type fakeReplica struct {
	id, base string
	max      int
	healthy  atomic.Bool
	queue    atomic.Int32

	mu       sync.Mutex
	resident map[string]bool
	peak     int
	loads    int
}

func (f *fakeReplica) ID() string        { return f.id }
func (f *fakeReplica) BaseModel() string { return f.base }
func (f *fakeReplica) MaxLoras() int     { return f.max }
func (f *fakeReplica) Healthy() bool     { return f.healthy.Load() }
func (f *fakeReplica) QueueDepth() int   { return int(f.queue.Load()) }

type fleet struct {
	t        testing.TB
	replicas map[string]*fakeReplica
	r        *router.Router
	loads    atomic.Int64
	waits    atomic.Int32
	evicted  []string
	mu       sync.Mutex
}

func newFleet(t testing.TB, n, maxLoras int, base string) *fleet {
	fl := &fleet{t: t, replicas: map[string]*fakeReplica{}}
	fl.r = pipeline.New(router.Weights{}, router.Hooks{
		Load: func(_ context.Context, a string, ep router.Endpoint) error {
			f := fl.replicas[ep.ID()]
			f.mu.Lock()
			defer f.mu.Unlock()
			f.resident[a] = true
			f.loads++
			fl.loads.Add(1)
			if len(f.resident) > f.max {
				t.Errorf("%s holds %d adapters, max_loras %d", f.id, len(f.resident), f.max)
			}
			f.peak = max(f.peak, len(f.resident))
			return nil
		},
		Evict: func(_ context.Context, a string, ep router.Endpoint) error {
			f := fl.replicas[ep.ID()]
			f.mu.Lock()
			if !f.resident[a] {
				t.Errorf("evicting %s from %s, which does not hold it", a, f.id)
			}
			delete(f.resident, a)
			f.mu.Unlock()
			fl.mu.Lock()
			fl.evicted = append(fl.evicted, a)
			fl.mu.Unlock()
			return nil
		},
		Waiting: func(_ context.Context, _ string, waiting bool, reason string) {
			if waiting && reason != "" {
				fl.waits.Add(1)
			}
		},
	})
	for i := range n {
		f := &fakeReplica{id: fmt.Sprintf("r%03d", i), base: base, max: maxLoras, resident: map[string]bool{}}
		f.healthy.Store(true)
		fl.replicas[f.id] = f
		fl.r.AddEndpoint(f)
	}
	return fl
}

func (fl *fleet) acquire(a string) *router.Lease {
	l, err := fl.r.Acquire(context.Background(), router.Request{Adapter: a, BaseModel: "m"})
	if err != nil {
		fl.t.Fatal(err)
	}
	return l
}

// 10,000 adapters on 100 replicas: each stays on its replica for every request, and uniform
// arrivals spread them evenly.
func TestStickyAndBalancedAtScale(t *testing.T) {
	fl := newFleet(t, 100, 100, "m")
	where := map[string]string{}
	for i := range 10000 {
		a := fmt.Sprint("adapter-", i)
		l := fl.acquire(a)
		where[a] = l.Endpoint.ID()
		l.Release()
	}
	for round := range 3 {
		for a, ep := range where {
			l := fl.acquire(a)
			if l.Endpoint.ID() != ep {
				t.Fatalf("round %d: %s went to %s, placed on %s", round, a, l.Endpoint.ID(), ep)
			}
			l.Release()
		}
	}
	var counts []int
	for _, u := range fl.r.Usage() {
		counts = append(counts, u.Held)
	}
	sort.Ints(counts)
	if counts[len(counts)-1]-counts[0] > 1 {
		t.Fatalf("held spread %d..%d", counts[0], counts[len(counts)-1])
	}
	if fl.loads.Load() != 10000 || len(fl.evicted) != 0 {
		t.Fatalf("%d loads, %d evictions for 10,000 adapters in 10,000 slots", fl.loads.Load(), len(fl.evicted))
	}
}

// Concurrent first requests for one adapter place and load it exactly once.
func TestSingleFlightPlacement(t *testing.T) {
	fl := newFleet(t, 10, 4, "m")
	var wg sync.WaitGroup
	eps := make(chan string, 64)
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l := fl.acquire("hot")
			eps <- l.Endpoint.ID()
			l.Release()
		}()
	}
	wg.Wait()
	close(eps)
	first := ""
	for e := range eps {
		if first == "" {
			first = e
		}
		if e != first {
			t.Fatalf("one adapter served from %s and %s", first, e)
		}
	}
	if fl.loads.Load() != 1 {
		t.Fatalf("loaded %d times", fl.loads.Load())
	}
}

// 1000 concurrent adapters compete for 200 slots: no replica ever holds more than max_loras
// (the fake fails the test the moment one does), everyone is served, and busy adapters are never
// evicted.
func TestCapacityUnderContention(t *testing.T) {
	fl := newFleet(t, 10, 20, "m")
	var busy sync.Map
	var wg sync.WaitGroup
	for i := range 1000 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a := fmt.Sprint("a", i)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			l, err := fl.r.Acquire(ctx, router.Request{Adapter: a, BaseModel: "m"})
			if err != nil {
				t.Error(err)
				return
			}
			busy.Store(a, true)
			time.Sleep(time.Millisecond)
			busy.Delete(a)
			l.Release()
		}()
	}
	wg.Wait()
	fl.mu.Lock()
	defer fl.mu.Unlock()
	for _, f := range fl.replicas {
		if f.peak > f.max {
			t.Fatalf("%s peaked at %d", f.id, f.peak)
		}
	}
	if len(fl.evicted) < 800 {
		t.Fatalf("only %d evictions for 1000 adapters in 200 slots", len(fl.evicted))
	}
}

// The least recently used idle adapter is the one evicted; adapters with work are never.
func TestEvictsLeastRecentlyUsedIdle(t *testing.T) {
	fl := newFleet(t, 1, 3, "m")
	busy := fl.acquire("busy") // keeps its lease
	for _, a := range []string{"old", "new"} {
		l := fl.acquire(a)
		time.Sleep(2 * time.Millisecond)
		l.Release()
	}
	l := fl.acquire("fourth")
	l.Release()
	if len(fl.evicted) != 1 || fl.evicted[0] != "old" {
		t.Fatalf("evicted %v, want [old]", fl.evicted)
	}
	if _, ok := fl.r.Where("busy"); !ok {
		t.Fatal("a busy adapter was evicted")
	}
	busy.Release()
	// "old" comes back on its next request (loaded again, evicting the LRU: "new").
	l = fl.acquire("old")
	l.Release()
	if fl.evicted[len(fl.evicted)-1] != "new" {
		t.Fatalf("evicted %v", fl.evicted)
	}
}

// When every slot holds an adapter with work, a new adapter waits (and is told so) until one
// frees; with no slot before its deadline it fails with ErrCapacity.
func TestWaitsForCapacity(t *testing.T) {
	fl := newFleet(t, 1, 1, "m")
	hold := fl.acquire("a")
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := fl.r.Acquire(ctx, router.Request{Adapter: "b", BaseModel: "m"}); !errors.Is(err, router.ErrCapacity) {
		t.Fatalf("full and busy: %v", err)
	}
	got := make(chan string)
	go func() {
		l := fl.acquire("c")
		got <- l.Endpoint.ID()
		l.Release()
	}()
	time.Sleep(20 * time.Millisecond)
	select {
	case <-got:
		t.Fatal("placed while every slot was busy")
	default:
	}
	hold.Release()
	if ep := <-got; ep != "r000" {
		t.Fatalf("placed on %s", ep)
	}
	if fl.waits.Load() != 2 {
		t.Fatalf("told of %d waits, want 2 (b and c)", fl.waits.Load())
	}
}

// An adapter whose replica dies is placed elsewhere on its next request.
func TestFailover(t *testing.T) {
	fl := newFleet(t, 3, 4, "m")
	l := fl.acquire("x")
	first := l.Endpoint.ID()
	l.Release()
	fl.replicas[first].healthy.Store(false)
	l = fl.acquire("x")
	defer l.Release()
	if l.Endpoint.ID() == first {
		t.Fatal("still routed to a dead replica")
	}
	fl.r.RemoveEndpoint(first)
	if _, err := fl.r.Acquire(context.Background(), router.Request{Adapter: "y", BaseModel: "other"}); !errors.Is(err, router.ErrNoEndpoint) {
		t.Fatalf("unknown base model: %v", err)
	}
}

// One routing decision at 10,000 adapters on 100 replicas: a sticky lookup and a new placement.
func BenchmarkRouting(b *testing.B) {
	fl := newFleet(b, 100, 200, "m")
	for i := range 10000 {
		l := fl.acquire(fmt.Sprint("adapter-", i))
		l.Release()
	}
	for _, kind := range []string{"sticky", "place"} {
		b.Run(kind, func(b *testing.B) {
			lat := make([]time.Duration, 0, b.N)
			for i := range b.N {
				a := fmt.Sprint("adapter-", i%10000)
				if kind == "place" {
					a = fmt.Sprint("new-", i)
				}
				start := time.Now()
				l, err := fl.r.Acquire(context.Background(), router.Request{Adapter: a, BaseModel: "m"})
				lat = append(lat, time.Since(start))
				if err != nil {
					b.Fatal(err)
				}
				l.Release()
				if kind == "place" {
					fl.r.Forget(a)
					f := fl.replicas[l.Endpoint.ID()]
					f.mu.Lock()
					delete(f.resident, a)
					f.mu.Unlock()
				}
			}
			sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
			b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/1000, "p50-µs")
			b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds())/1000, "p99-µs")
		})
	}
}

// The fault seen with two replicas of one slot each and busy training clients: an idle adapter
// held one replica while the active adapters, all hashing to the other, evicted each other there
// every step. Eviction takes the least recently used idle adapter across every full candidate, so
// the idle one goes first and the active ones use both replicas.
func TestIdleAdapterNeverMakesActiveOnesThrash(t *testing.T) {
	for _, active := range []int{2, 3} {
		t.Run(fmt.Sprint(active, " active"), func(t *testing.T) {
			fl := newFleet(t, 2, 1, "m")
			fl.acquire("idle").Release()
			idleOn, _ := fl.r.Where("idle")
			other := "r000"
			if idleOn.ID() == other {
				other = "r001"
			}
			// Active adapters whose rendezvous ties all go to the other replica: the worst case.
			var names []string
			for i := 0; len(names) < active; i++ {
				n := fmt.Sprint("active-", i)
				if router.Rendezvous(n, other) > router.Rendezvous(n, idleOn.ID()) {
					names = append(names, n)
				}
			}
			used := map[string]bool{}
			for range 10 { // training steps, each client's op in turn
				for _, n := range names {
					l := fl.acquire(n)
					used[l.Endpoint.ID()] = true
					l.Release()
				}
			}
			fl.mu.Lock()
			defer fl.mu.Unlock()
			if len(fl.evicted) == 0 || fl.evicted[0] != "idle" {
				t.Fatalf("evicted %v; the idle adapter should go first", fl.evicted)
			}
			if len(used) != 2 {
				t.Fatalf("active adapters ran on %v only", used)
			}
			if active == 2 && len(fl.evicted) != 1 {
				t.Fatalf("two active adapters in two slots still evicted each other: %v", fl.evicted)
			}
		})
	}
}

// Ops the gateway has routed to a replica count as its queue, even before the replica sees them
// (a fake replica's own queue stays 0 here): a new adapter goes to the replica with none waiting.
func TestQueueDepthCountsOpsRoutedByTheRouter(t *testing.T) {
	fl := newFleet(t, 2, 4, "m")
	var leases []*router.Lease
	for range 3 {
		leases = append(leases, fl.acquire("hot"))
	}
	hot, _ := fl.r.Where("hot")
	// One idle adapter on the other replica, so both hold one.
	for i := 0; ; i++ {
		n := fmt.Sprint("cold-", i)
		l := fl.acquire(n)
		l.Release()
		if l.Endpoint.ID() != hot.ID() {
			break
		}
		fl.r.Forget(n)
	}
	for _, u := range fl.r.Usage() {
		if want := map[bool]int{true: 3, false: 0}[u.Endpoint.ID() == hot.ID()]; u.Ops != want {
			t.Fatalf("%s: %d ops, want %d", u.Endpoint.ID(), u.Ops, want)
		}
	}
	var name string // would tie-break to the busy replica
	for i := 0; name == ""; i++ {
		if n := fmt.Sprint("new-", i); router.Rendezvous(n, hot.ID()) > router.Rendezvous(n, other(hot.ID())) {
			name = n
		}
	}
	l := fl.acquire(name)
	l.Release()
	if l.Endpoint.ID() == hot.ID() {
		t.Fatalf("%s placed on %s, which has 3 ops waiting, over an idle replica", name, hot.ID())
	}
	for _, l := range leases {
		l.Release()
	}
	for _, u := range fl.r.Usage() {
		if u.Ops != 0 {
			t.Fatalf("%s: %d ops after every release", u.Endpoint.ID(), u.Ops)
		}
	}
}

func other(id string) string {
	if id == "r000" {
		return "r001"
	}
	return "r000"
}

// The admin view lists each replica's adapters.
func TestAdaptersPerReplica(t *testing.T) {
	fl := newFleet(t, 3, 4, "m")
	want := map[string][]string{}
	for i := range 7 {
		l := fl.acquire(fmt.Sprint("a", i))
		want[l.Endpoint.ID()] = append(want[l.Endpoint.ID()], fmt.Sprint("a", i))
		l.Release()
	}
	got := fl.r.Adapters()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("adapters %v, want %v", got, want)
	}
}

// The sampling profile: the replica holding the weights first, then the session key's replica,
// then the shortest queue; never an unhealthy replica or another base model's.
func TestSamplingProfile(t *testing.T) {
	fl := newFleet(t, 3, 2, "m")
	fl.replicas["r002"].base = "other" // set before any read; not re-registered: the fake reads it live
	keyed := func(key string) string { // the key's rendezvous winner among r000 and r001
		if router.Rendezvous(key, "r000") > router.Rendezvous(key, "r001") {
			return "r000"
		}
		return "r001"
	}
	cases := []struct {
		name    string
		queues  [2]int32
		down    string
		req     router.Request
		want    string
		wantErr error
	}{
		{"holder beats a shorter queue", [2]int32{50, 0}, "", router.Request{Holders: []string{"r000"}}, "r000", nil},
		{"holder beats the key", [2]int32{0, 0}, "", router.Request{Holders: []string{other(keyed("s"))}, Key: "s"}, other(keyed("s")), nil},
		{"key beats a shorter queue", [2]int32{0, 0}, "", router.Request{Key: "s"}, keyed("s"), nil},
		{"key, its replica busy", [2]int32{50, 50}, "", router.Request{Key: "s"}, keyed("s"), nil},
		{"no key: shorter queue", [2]int32{5, 1}, "", router.Request{}, "r001", nil},
		{"no key: shorter queue, other way", [2]int32{1, 5}, "", router.Request{}, "r000", nil},
		{"holder down", [2]int32{0, 9}, "r000", router.Request{Holders: []string{"r000"}}, "r001", nil},
		{"another base model", [2]int32{0, 0}, "", router.Request{BaseModel: "nope"}, "", router.ErrNoEndpoint},
	}
	for _, c := range cases {
		for i, q := range c.queues {
			f := fl.replicas[fmt.Sprintf("r%03d", i)]
			f.queue.Store(q)
			f.healthy.Store(f.id != c.down)
		}
		if c.req.BaseModel == "" {
			c.req.BaseModel = "m"
		}
		// Sticky: the same answer every time.
		for range 3 {
			ep, err := fl.r.Pick(c.req)
			if !errors.Is(err, c.wantErr) || (err == nil && ep.ID() != c.want) {
				t.Fatalf("%s: %v %v, want %s %v", c.name, ep, err, c.want, c.wantErr)
			}
		}
	}
}

// Work batched outside the router (Request.Backlog) steers an unkeyed choice.
func TestSamplingBacklog(t *testing.T) {
	fl := newFleet(t, 2, 2, "m")
	backlog := map[string]int{"r000": 9}
	for range 3 {
		ep, err := fl.r.Pick(router.Request{BaseModel: "m", Backlog: func(id string) int { return backlog[id] }})
		if err != nil || ep.ID() != "r001" {
			t.Fatalf("picked %v %v, want r001", ep, err)
		}
		backlog = map[string]int{"r001": 9}
		if ep, _ = fl.r.Pick(router.Request{BaseModel: "m", Backlog: func(id string) int { return backlog[id] }}); ep.ID() != "r000" {
			t.Fatalf("picked %v, want r000", ep)
		}
		backlog = map[string]int{"r000": 9}
	}
}

type fixedScorer map[string]float64

func (fixedScorer) Name() string { return "fixed" }
func (s fixedScorer) Score(_ router.Request, cands []router.Candidate, scores []float64) {
	for i, c := range cands {
		scores[i] = s[c.Endpoint.ID()]
	}
}

// A plugin's score counts as if clamped to [0,1] (NaN as 0): a faulty scorer cannot outweigh
// the others by returning huge, negative or NaN values.
func TestScoresAreClamped(t *testing.T) {
	zero := 0.0
	nan, inf := zero/zero, 1/zero
	cases := []struct {
		name   string
		faulty fixedScorer
		want   string
	}{
		{"+Inf counts as 1", fixedScorer{"r000": inf}, "r001"},
		{"huge counts as 1", fixedScorer{"r000": 1e300}, "r001"},
		{"NaN counts as 0", fixedScorer{"r000": nan, "r001": 0}, "r001"},
		{"negative counts as 0", fixedScorer{"r000": 0, "r001": -1e300}, "r000"},
	}
	for _, c := range cases {
		// The fair scorer gives r001 1 and r000 0, with twice the faulty one's weight.
		fair := fixedScorer{"r000": 0, "r001": 1}
		if c.want == "r000" {
			fair = fixedScorer{"r000": 1, "r001": 0}
		}
		prof := router.Profile{Scorers: []router.WeightedScorer{{Scorer: c.faulty, Weight: 1}, {Scorer: fair, Weight: 2}}, Picker: maxscore.Picker{}}
		r := router.New(prof, prof, router.Hooks{})
		for _, id := range []string{"r000", "r001"} {
			f := &fakeReplica{id: id, base: "m", max: 1, resident: map[string]bool{}}
			f.healthy.Store(true)
			r.AddEndpoint(f)
		}
		if ep, err := r.Pick(router.Request{BaseModel: "m"}); err != nil || ep.ID() != c.want {
			t.Errorf("%s: picked %v %v, want %s", c.name, ep, err, c.want)
		}
	}
}
