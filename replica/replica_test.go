package replica

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
)

// Work runs one item at a time in submission order, and the queue depth counts what is pending.
func TestWorkerRunsInOrderAndCountsDepth(t *testing.T) {
	r := New("r", "m", nil, 0)
	block := make(chan struct{})
	var mu sync.Mutex
	var got []int
	_ = r.Run(func() { <-block })
	for i := range 5 {
		_ = r.Run(func() { mu.Lock(); got = append(got, i); mu.Unlock() })
	}
	if d := r.QueueDepth(); d != 6 {
		t.Fatalf("queue depth %d, want 6", d)
	}
	close(block)
	if err := r.Do(context.Background(), func() {}); err != nil {
		t.Fatal(err)
	}
	// Do returns when its function has run, just before the loop counts it finished; Close
	// waits for the loop itself, so the depth is settled after it.
	r.Close()
	mu.Lock()
	defer mu.Unlock()
	for i, v := range got {
		if v != i {
			t.Fatalf("ran in order %v", got)
		}
	}
	if d := r.QueueDepth(); d != 0 {
		t.Fatalf("queue depth %d after draining", d)
	}
	if r.MaxLoras() != DefaultMaxLoras || !r.Healthy() || r.ID() != "r" || r.BaseModel() != "m" {
		t.Fatal("endpoint fields")
	}
	if err := r.Run(func() {}); !errors.Is(err, ErrClosed) {
		t.Fatalf("run after close: %v", err)
	}
}

// A panic in work on a replica (a compute bug, a worker's malformed answer) is that op's error:
// the replica goes on serving, and work queued with Run does not take the process down either.
func TestPanicIsAnErrorAndTheReplicaGoesOn(t *testing.T) {
	r := New("r", "m", nil, 0)
	defer r.Close()
	_ = r.Run(func() { panic("queued work broke") })
	var nilMap map[string]int
	err := r.Do(context.Background(), func() { nilMap["x"] = 1 })
	var pe *PanicError
	if !errors.As(err, &pe) || pe.Replica != "r" {
		t.Fatalf("Do of a panicking op returned %v, want a *PanicError", err)
	}
	ran := false
	if err := r.Do(context.Background(), func() { ran = true }); err != nil || !ran {
		t.Fatalf("replica after a panic: err %v, ran %v", err, ran)
	}
	r.Close() // Do returns just before the worker counts its op finished; Close waits for it
	if d := r.QueueDepth(); d != 0 {
		t.Fatalf("queue depth %d after everything finished", d)
	}
}

// Lanes take turns: while one lane's op runs and more of its ops queue up, the ops other lanes
// queue meanwhile run next (not after the whole queue), then the lanes alternate; within a lane
// ops keep their order.
func TestLanesTakeTurns(t *testing.T) {
	r := New("r", "m", nil, 0)
	defer r.Close()
	block := make(chan struct{})
	rec := &opRecorder{}
	record := rec.op
	started := make(chan struct{})
	_ = r.RunIn("a", func() { close(started); <-block })
	<-started
	for _, s := range []string{"a1", "a2", "a3", "a4"} {
		_ = r.RunIn("a", record(s))
	}
	_ = r.RunIn("b", record("b1"))
	_ = r.RunIn("b", record("b2"))
	_ = r.Run(record("shared"))
	close(block)
	got := rec.wait()
	want := []string{"b1", "shared", "a1", "b2", "a2", "a3", "a4"}
	if !slices.Equal(got, want) {
		t.Fatalf("ran %v, want %v", got, want)
	}
}

// A tenant's adapters share its turn: groups (tenants) take turns, and within a group its lanes
// (adapters) take the group's turns in rotation, each lane in order. A tenant with three runs
// gets no more turns than a tenant with one.
func TestATenantsAdaptersShareItsTurn(t *testing.T) {
	r := New("r", "m", nil, 0)
	defer r.Close()
	block := make(chan struct{})
	rec := &opRecorder{}
	record := rec.op
	started := make(chan struct{})
	_ = r.RunIn("blocker", func() { close(started); <-block })
	<-started
	for _, op := range []struct{ tenant, adapter, name string }{
		{"a", "x", "ax1"}, {"a", "x", "ax2"}, {"a", "y", "ay1"}, {"a", "z", "az1"}, {"a", "y", "ay2"},
		{"b", "w", "bw1"}, {"b", "w", "bw2"}, {"b", "w", "bw3"},
	} {
		_ = r.RunIn(AdapterLane(op.tenant, op.adapter), record(op.name))
	}
	close(block)
	got := rec.wait()
	want := []string{"ax1", "bw1", "ay1", "bw2", "az1", "bw3", "ax2", "ay2"}
	if !slices.Equal(got, want) {
		t.Fatalf("ran %v, want %v", got, want)
	}
}

// opRecorder makes ops that note their names in the order they run.
type opRecorder struct {
	mu  sync.Mutex
	got []string
	all sync.WaitGroup
}

func (r *opRecorder) op(name string) func() {
	r.all.Add(1)
	return func() { r.mu.Lock(); r.got = append(r.got, name); r.mu.Unlock(); r.all.Done() }
}

// wait waits for every op made so far and returns the order they ran in.
func (r *opRecorder) wait() []string {
	r.all.Wait()
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.got)
}
