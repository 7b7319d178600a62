package router_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/skein-ai/skein/router"
)

// An adopted adapter's next op goes to its endpoint without a load; adoption refuses an adapter
// placed anywhere, an unknown endpoint and a full one; an adopted adapter is evictable like one
// the router loaded.
func TestAdoptPlacesWithoutLoading(t *testing.T) {
	fl := newFleet(t, 2, 2, "m")
	// Mark the fake replica as holding it, as the worker that kept it does.
	fl.replicas["r001"].resident["kept"] = true
	if err := fl.r.Adopt("kept", "r001"); err != nil {
		t.Fatal(err)
	}
	l := fl.acquire("kept")
	if l.Endpoint.ID() != "r001" || fl.loads.Load() != 0 {
		t.Fatalf("op went to %s after %d loads; want r001 and none", l.Endpoint.ID(), fl.loads.Load())
	}
	l.Release()
	cases := []struct {
		adapter, endpoint string
		want              error
	}{
		{"kept", "r000", router.ErrPlaced},
		{"other", "r999", router.ErrUnknownEndpoint},
	}
	for _, c := range cases {
		if err := fl.r.Adopt(c.adapter, c.endpoint); !errors.Is(err, c.want) {
			t.Errorf("Adopt(%s, %s) = %v, want %v", c.adapter, c.endpoint, err, c.want)
		}
	}
	fl.replicas["r001"].resident["kept2"] = true
	if err := fl.r.Adopt("kept2", "r001"); err != nil {
		t.Fatal(err)
	}
	if err := fl.r.Adopt("third", "r001"); !errors.Is(err, router.ErrNoSlot) {
		t.Fatalf("a third adapter on a 2-slot endpoint: %v, want ErrNoSlot", err)
	}
	// r000 holds nothing, so new adapters go there first; once it is full the least recently
	// used idle adapter of all (the adopted "kept") is evicted.
	for _, a := range []string{"n1", "n2"} {
		fl.acquire(a).Release()
	}
	fl.acquire("n3").Release()
	if len(fl.evicted) != 1 || fl.evicted[0] != "kept" {
		t.Fatalf("evicted %v, want [kept] (the adopted adapter, least recently used)", fl.evicted)
	}
}

// Drain evicts (saves and removes) every idle adapter of a leaving endpoint and leaves busy ones;
// the evicted ones are placed afresh elsewhere on their next request.
func TestDrainEvictsIdleAdaptersOnly(t *testing.T) {
	fl := newFleet(t, 2, 4, "m")
	var onR0 []string
	for _, a := range []string{"a", "b", "c", "d", "e", "f"} {
		l := fl.acquire(a)
		if l.Endpoint.ID() == "r000" {
			onR0 = append(onR0, a)
		}
		l.Release()
	}
	if len(onR0) < 2 {
		t.Fatalf("only %v on r000", onR0)
	}
	busy := fl.acquire(onR0[0]) // an op running there
	fl.replicas["r000"].healthy.Store(false)
	if n := fl.r.Drain(context.Background(), "r000"); n != len(onR0)-1 {
		t.Fatalf("drained %d, want %d (all idle ones on r000)", n, len(onR0)-1)
	}
	fl.mu.Lock()
	evicted := slices.Clone(fl.evicted)
	fl.mu.Unlock()
	slices.Sort(evicted)
	if want := slices.Sorted(slices.Values(onR0[1:])); !slices.Equal(evicted, want) {
		t.Fatalf("evicted %v, want %v", evicted, want)
	}
	if ep, ok := fl.r.Where(onR0[0]); !ok || ep.ID() != "r000" {
		t.Fatal("the busy adapter was taken from under its op")
	}
	busy.Release()
	l := fl.acquire(onR0[1])
	if l.Endpoint.ID() != "r001" {
		t.Fatalf("a drained adapter came back on %s", l.Endpoint.ID())
	}
	l.Release()
	if n := fl.r.Drain(context.Background(), "r999"); n != 0 {
		t.Fatalf("draining an unknown endpoint evicted %d", n)
	}
}
