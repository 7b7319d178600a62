package replica

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/skein-ai/skein/engine"
	"github.com/skein-ai/skein/storage"
)

// fakeCompute is a compute that keeps adapters as names and a step count, logs every call in
// order, and answers each sample with the request's first prompt token.
type fakeCompute struct {
	mu       sync.Mutex
	adapters map[string]int // id -> step
	snaps    map[string]bool
	calls    []string
	batches  [][]string // the weights of each request of each SampleBatch call
	effects  int64      // counted like a worker client's, when remote
	remote   bool
	fail     map[string]error // method -> the error it answers
}

func newFake() *fakeCompute {
	return &fakeCompute{adapters: map[string]int{}, snaps: map[string]bool{}, fail: map[string]error{}}
}

func (f *fakeCompute) log(call string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, call)
	method, _, _ := strings.Cut(call, " ")
	if f.remote && method != "has" {
		f.effects++
	}
	return f.fail[method]
}

func (f *fakeCompute) callLog() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

func (f *fakeCompute) Info() engine.ModelInfo {
	return engine.ModelInfo{Config: &engine.Config{VocabSize: 64, MaxPositionEmbeddings: 64}, MaxRank: 8}
}
func (f *fakeCompute) HasAdapter(_ context.Context, id string) bool {
	f.log("has " + id)
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.adapters[id]
	return ok || f.snaps[id]
}
func (f *fakeCompute) AdapterIDs(context.Context) []string { return nil }
func (f *fakeCompute) TrainingAdapterIDs(context.Context) []string {
	return nil
}
func (f *fakeCompute) CreateLora(_ context.Context, id string, _ engine.LoraConfig) error {
	if err := f.log("create " + id); err != nil {
		return err
	}
	f.mu.Lock()
	f.adapters[id] = 0
	f.mu.Unlock()
	return nil
}
func (f *fakeCompute) LoadAdapter(_ context.Context, id, dir string, _ bool) error {
	if err := f.log("load " + id + " " + dir); err != nil {
		return err
	}
	f.mu.Lock()
	f.adapters[id] = 7
	f.mu.Unlock()
	return nil
}
func (f *fakeCompute) LoadSnapshot(_ context.Context, id, dir string) error {
	if err := f.log("snapshot " + id); err != nil {
		return err
	}
	f.mu.Lock()
	f.snaps[id] = true
	f.mu.Unlock()
	return nil
}
func (f *fakeCompute) SaveAdapter(_ context.Context, id, dir string, _ bool) error {
	return f.log("save " + id + " " + dir)
}
func (f *fakeCompute) DeleteAdapter(_ context.Context, id string) bool {
	f.log("delete " + id)
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.adapters, id)
	delete(f.snaps, id)
	return true
}
func (f *fakeCompute) AdapterInfo(_ context.Context, id string) (engine.LoraConfig, int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return engine.LoraConfig{Rank: 2}, f.adapters[id], nil
}
func (f *fakeCompute) ForwardBatch(_ context.Context, id string, b *engine.Batch, backward bool) (*engine.ForwardResult, error) {
	if err := f.log(fmt.Sprintf("forward %s backward=%v", id, backward)); err != nil {
		return nil, err
	}
	return &engine.ForwardResult{}, nil
}
func (f *fakeCompute) OptimStep(_ context.Context, id string, _ engine.AdamParams) (map[string]float64, error) {
	if err := f.log("step " + id); err != nil {
		return nil, err
	}
	f.mu.Lock()
	f.adapters[id]++
	f.mu.Unlock()
	return map[string]float64{"loss": 1}, nil
}
func (f *fakeCompute) SampleBatch(_ context.Context, id string, reqs []engine.SampleRequest) ([]*engine.SampleResult, error) {
	if err := f.log("sample " + id); err != nil {
		return nil, err
	}
	f.mu.Lock()
	var call []string
	for _, r := range reqs {
		call = append(call, cmp.Or(r.Adapter, id))
	}
	f.batches = append(f.batches, call)
	f.mu.Unlock()
	out := make([]*engine.SampleResult, len(reqs))
	for i, r := range reqs {
		out[i] = &engine.SampleResult{Sequences: []engine.SampledSequence{{Tokens: r.Prompt[:1], StopReason: "length"}}}
	}
	return out, nil
}

// remoteFake is the fake seen as a worker's client: it counts effects.
type remoteFake struct{ *fakeCompute }

func (r remoteFake) Effects() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.effects
}

// keeper records what the replica tells an adapter's owner, in order, into the same log.
type keeper struct {
	f          *fakeCompute
	saved      string
	fence      string
	step       int
	beforeStep error
	saveErr    error
}

func (k *keeper) note(s string)          { k.f.mu.Lock(); k.f.calls = append(k.f.calls, s); k.f.mu.Unlock() }
func (k *keeper) Saved() (string, error) { return k.saved, nil }
func (k *keeper) Restored(dir string)    { k.note("restored " + dir) }
func (k *keeper) Fresh() error {
	k.note("fresh?")
	if k.step > 0 {
		return errors.New("it has stepped")
	}
	return nil
}
func (k *keeper) Claim(context.Context) (string, error) { return k.fence, nil }
func (k *keeper) Save(_ context.Context, fence string, fill func(string) error) (string, error) {
	k.note("keeper save")
	if k.saveErr != nil {
		return "", k.saveErr
	}
	if fence != k.fence {
		return "", &storage.StaleError{Key: "state/ptr", Expected: fence}
	}
	if err := fill("state/v2"); err != nil {
		return "", err
	}
	k.saved = "state/v2"
	k.fence += "+"
	return k.fence, nil
}
func (k *keeper) BeforeStep(context.Context) error { k.note("before step"); return k.beforeStep }
func (k *keeper) Stepped(step int)                 { k.note(fmt.Sprintf("stepped %d", step)); k.step = step }
func (k *keeper) Replaced(_ engine.LoraConfig, step int) {
	k.note(fmt.Sprintf("replaced %d", step))
	k.step = step
}

// withoutHas drops the residency checks from a call log: what is left is what changed.
func withoutHas(calls []string) []string {
	return slices.DeleteFunc(calls, func(c string) bool { return strings.HasPrefix(c, "has ") })
}

// Every op first makes its adapter resident the right way, and the replica tells the owner each
// change in the order it happened: a fresh adapter is created (asking first), a saved one is
// reloaded (then reported), a stepped one without saved state is refused and nothing runs; a
// step is checked, applied, reported and then saved; an eviction saves, then deletes.
func TestAdapterLifecycle(t *testing.T) {
	cases := []struct {
		name string
		k    keeper
		op   func(r *Replica, a Adapter) error
		want []string
		err  string
	}{
		{"fresh adapter is created", keeper{}, func(r *Replica, a Adapter) error { return r.Place(context.Background(), a) },
			[]string{"fresh?", "create a"}, ""},
		{"saved adapter is reloaded", keeper{saved: "state/v1"}, func(r *Replica, a Adapter) error {
			_, err := r.ForwardBackward(context.Background(), a, &engine.Batch{})
			return err
		}, []string{"load a state/v1", "restored state/v1", "forward a backward=true"}, ""},
		{"stepped adapter without state is refused", keeper{step: 3}, func(r *Replica, a Adapter) error {
			_, err := r.Forward(context.Background(), a, &engine.Batch{}, false)
			return err
		}, []string{"fresh?"}, "restoring the adapter: it has stepped"},
		{"step: check, apply, report, save", keeper{}, func(r *Replica, a Adapter) error {
			_, step, err := r.OptimStep(context.Background(), a, engine.DefaultAdamParams())
			if err == nil && step != 1 {
				return fmt.Errorf("step %d, want 1", step)
			}
			return err
		}, []string{"fresh?", "create a", "before step", "step a", "stepped 1", "keeper save", "save a state/v2"}, ""},
		// The copy in memory is ahead of its saved state: it goes, so that the next op reloads
		// the saved state and the owner's ledger (which still lists the consumed
		// forward_backwards) reports them lost, never a step on no gradients.
		{"a step whose save fails drops the copy in memory", keeper{saveErr: errors.New("disk full")}, func(r *Replica, a Adapter) error {
			_, _, err := r.OptimStep(context.Background(), a, engine.DefaultAdamParams())
			return err
		}, []string{"fresh?", "create a", "before step", "step a", "stepped 1", "keeper save", "delete a"}, "saving the adapter state: disk full"},
		{"lost gradients stop the step", keeper{beforeStep: errors.New("lost")}, func(r *Replica, a Adapter) error {
			_, _, err := r.OptimStep(context.Background(), a, engine.DefaultAdamParams())
			return err
		}, []string{"fresh?", "create a", "before step"}, "lost"},
		{"load replaces, reports, saves", keeper{}, func(r *Replica, a Adapter) error {
			_, step, err := r.LoadFrom(context.Background(), a, "ckpt", true)
			if err == nil && step != 7 {
				return fmt.Errorf("step %d, want 7", step)
			}
			return err
		}, []string{"fresh?", "create a", "load a ckpt", "replaced 7", "keeper save", "save a state/v2"}, ""},
		{"evict saves then deletes", keeper{saved: "state/v1"}, func(r *Replica, a Adapter) error {
			if err := r.Place(context.Background(), a); err != nil {
				return err
			}
			return r.Evict(context.Background(), a)
		}, []string{"load a state/v1", "restored state/v1", "keeper save", "save a state/v2", "delete a"}, ""},
		{"evicting an absent adapter saves nothing", keeper{}, func(r *Replica, a Adapter) error {
			return r.Evict(context.Background(), a)
		}, []string{"delete a"}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFake()
			r := New("r", "m", f, 2)
			defer r.Close()
			k := c.k
			k.f = f
			err := c.op(r, Adapter{ID: "a", Lane: "t", Lora: engine.LoraConfig{Rank: 2}, State: &k})
			if c.err == "" && err != nil || c.err != "" && (err == nil || err.Error() != c.err) {
				t.Fatalf("err = %v, want %q", err, c.err)
			}
			if got := withoutHas(f.callLog()); !slices.Equal(got, c.want) {
				t.Fatalf("calls\n %q\nwant\n %q", got, c.want)
			}
		})
	}
}

// A failed op says whether it reached a remote worker's compute with a call that may have
// changed training state: only such an op must not be run again elsewhere. An in-process
// compute's failure never did.
func TestMayHaveRun(t *testing.T) {
	lost := errors.New("connection reset")
	for _, c := range []struct {
		name     string
		remote   bool
		failAt   string
		mayHave  bool
		wantCall string
	}{
		{"remote, failed while reloading", true, "load", true, "load a state/v1"},
		{"remote, failed in forward_backward", true, "forward", true, "forward a backward=true"},
		{"in process, failed in forward_backward", false, "forward", false, "forward a backward=true"},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFake()
			f.fail[c.failAt] = lost
			var comp engine.Compute = f
			if c.remote {
				f.remote = true
				comp = remoteFake{f}
			}
			r := New("r", "m", comp, 2)
			defer r.Close()
			_, err := r.ForwardBackward(context.Background(), Adapter{ID: "a", State: &keeper{f: f, saved: "state/v1"}}, &engine.Batch{})
			if !errors.Is(err, lost) || MayHaveRun(err) != c.mayHave {
				t.Fatalf("err %v, MayHaveRun %v, want %v", err, MayHaveRun(err), c.mayHave)
			}
			if !slices.Contains(f.callLog(), c.wantCall) {
				t.Fatalf("calls %q lack %q", f.callLog(), c.wantCall)
			}
		})
	}
	// Only residency checks before the failure: nothing changed, so it may run elsewhere.
	f := newFake()
	f.remote = true
	r := New("r", "m", remoteFake{f}, 2)
	defer r.Close()
	k := &keeper{f: f, step: 2} // refused before any call that changes state
	if _, err := r.Forward(context.Background(), Adapter{ID: "a", State: k}, &engine.Batch{}, false); err == nil || MayHaveRun(err) {
		t.Fatalf("refused before any change: err %v, MayHaveRun %v", err, MayHaveRun(err))
	}
}

// Unload runs after the ops already queued in the adapter's lane, and saves before it deletes.
func TestUnloadRunsAfterQueuedOps(t *testing.T) {
	f := newFake()
	r := New("r", "m", f, 2)
	defer r.Close()
	k := &keeper{f: f}
	a := Adapter{ID: "a", Lane: "t", State: k}
	if err := r.Place(context.Background(), a); err != nil {
		t.Fatal(err)
	}
	block := make(chan struct{})
	_ = r.RunIn("t", func() { <-block })
	done := make(chan error, 1)
	go func() { _, err := r.ForwardBackward(context.Background(), a, &engine.Batch{}); done <- err }()
	for r.QueueDepth() < 2 { // the forward_backward is queued behind the blocker
		runtime.Gosched()
	}
	if err := r.Unload(a); err != nil {
		t.Fatal(err)
	}
	close(block)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := r.Do(context.Background(), func() {}); err != nil { // the unload ran before this
		t.Fatal(err)
	}
	want := []string{"fresh?", "create a", "forward a backward=true", "keeper save", "save a state/v2", "delete a"}
	if got := withoutHas(f.callLog()); !slices.Equal(got, want) {
		t.Fatalf("calls %q, want %q", got, want)
	}
}

// An eviction waits for one turn, not behind every op the adapter's tenant has queued: it runs
// in the placement lane, which takes its turn between the tenant's ops.
func TestEvictionDoesNotWaitBehindTheTenantsQueue(t *testing.T) {
	f := newFake()
	r := New("r", "m", f, 2)
	defer r.Close()
	k := &keeper{f: f}
	idle := Adapter{ID: "idle", Lane: "t", State: k}
	if err := r.Place(context.Background(), idle); err != nil {
		t.Fatal(err)
	}
	block := make(chan struct{})
	_ = r.RunIn("t", func() { <-block })
	for i := range 3 {
		_ = r.RunIn("t", func() { k.note(fmt.Sprintf("tenant op %d", i)) })
	}
	evicted := make(chan error, 1)
	go func() { evicted <- r.Evict(context.Background(), idle) }()
	for r.QueueDepth() < 5 { // the blocker, three ops, and the eviction
		runtime.Gosched()
	}
	close(block)
	if err := <-evicted; err != nil {
		t.Fatal(err)
	}
	if err := r.DoIn(context.Background(), "t", func() {}); err != nil {
		t.Fatal(err)
	}
	got := withoutHas(f.callLog())
	del, first := slices.Index(got, "delete idle"), slices.Index(got, "tenant op 1")
	if del < 0 || first < 0 || del > first {
		t.Fatalf("calls %q: the eviction waited behind the tenant's queue", got)
	}
}
