package replica

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/skein-ai/skein/engine"
)

// answers collects sampling outcomes by request.
type answers chan struct {
	i int
	o SampleOutcome
}

func (a answers) job(i int, prompt ...int) SampleJob {
	return SampleJob{Req: engine.SampleRequest{Prompt: prompt, NumSamples: 1}, Done: func(o SampleOutcome) {
		a <- struct {
			i int
			o SampleOutcome
		}{i, o}
	}}
}

// Sampling requests that wait while their replica is busy go out together: one SampleBatch
// holding every request queued, whatever weights each reads (taken in turn by lane), each
// answered with its own result. The queue is bounded: full once the limit waits, free again once
// they ran.
func TestSamplerBatchesWaitingRequests(t *testing.T) {
	f := newFake()
	r := New("r", "m", f, 2)
	defer r.Close()
	r.SetSamplingLimit(5)
	block := make(chan struct{})
	_ = r.Run(func() { <-block }) // the replica is busy
	weights := map[string]Weights{"": {Lane: "base"}, "x": {ID: "sampler:x", Dir: "d", Lane: "t"}}
	plan := []string{"", "x", "", "", "x"}
	got := make(answers, len(plan))
	for i, which := range plan {
		if r.SamplingFull() {
			t.Fatalf("full with %d of 5 waiting", i)
		}
		if err := r.Sample(weights[which], got.job(i, 10+i, 1)); err != nil {
			t.Fatal(err)
		}
	}
	if !r.SamplingFull() || r.SamplingWaiting() != 5 {
		t.Fatalf("full %v, waiting %d with 5 of 5 queued", r.SamplingFull(), r.SamplingWaiting())
	}
	if err := r.Sample(weights[""], got.job(99, 1)); !errors.Is(err, ErrSamplingFull) {
		t.Fatalf("a sixth request: %v, want ErrSamplingFull", err)
	}
	close(block)
	for range plan {
		a := <-got
		if a.o.Err != nil || a.o.Result.Sequences[0].Tokens[0] != 10+a.i {
			t.Fatalf("request %d got %+v, want its own first prompt token", a.i, a.o)
		}
	}
	f.mu.Lock()
	batches := f.batches
	f.mu.Unlock()
	// Lanes base and t take turns: requests 0, 1, 2, 4, 3.
	if len(batches) != 1 || !slices.Equal(batches[0], []string{"", "sampler:x", "", "sampler:x", ""}) {
		t.Fatalf("batches %v, want one of all five, the lanes in turn", batches)
	}
	if r.SamplingFull() || r.SamplingWaiting() != 0 {
		t.Fatal("the queue stayed full after its requests ran")
	}
	if !r.HoldsCopy("sampler:x") || !slices.Contains(f.callLog(), "snapshot sampler:x") {
		t.Fatal("the sampler copy was not loaded and kept")
	}
}

// A batch that fails fails each of its requests; a panic in the compute does too, as a
// *PanicError, and the replica goes on sampling.
func TestSamplerFailuresAnswerEveryRequest(t *testing.T) {
	f := newFake()
	f.fail["sample"] = errors.New("decode broke")
	r := New("r", "m", f, 2)
	defer r.Close()
	block := make(chan struct{})
	_ = r.Run(func() { <-block })
	got := make(answers, 4)
	for i := range 2 {
		_ = r.Sample(Weights{}, got.job(i, 1))
	}
	close(block)
	for range 2 {
		if a := <-got; a.o.Err == nil || a.o.Err.Error() != "decode broke" {
			t.Fatalf("request %d: %v", a.i, a.o.Err)
		}
	}
	p := &panicky{fakeCompute: newFake()}
	r2 := New("r2", "m", p, 2)
	defer r2.Close()
	_ = r2.Sample(Weights{}, got.job(0, 1))
	var pe *PanicError
	if a := <-got; !errors.As(a.o.Err, &pe) {
		t.Fatalf("a panicking decode answered %v, want a *PanicError", a.o.Err)
	}
	p.fakeCompute.fail = map[string]error{}
	p.calm = true
	_ = r2.Sample(Weights{}, got.job(1, 5))
	if a := <-got; a.o.Err != nil || a.o.Result.Sequences[0].Tokens[0] != 5 {
		t.Fatalf("after a panic: %+v", a.o)
	}
}

type panicky struct {
	*fakeCompute
	calm bool
}

func (p *panicky) SampleBatch(ctx context.Context, id string, reqs []engine.SampleRequest) ([]*engine.SampleResult, error) {
	if !p.calm {
		var res []*engine.SampleResult
		return []*engine.SampleResult{res[3]}, nil // index out of range
	}
	return p.fakeCompute.SampleBatch(ctx, id, reqs)
}

// A replica keeps at most SamplerCopies read-only copies, dropping the least recently used, and
// DropCopies unloads the ones named (weights that were overwritten or deleted).
func TestSamplerCopiesAreBounded(t *testing.T) {
	f := newFake()
	r := New("r", "m", f, 2)
	defer r.Close()
	got := make(answers, 1)
	sample := func(id string) {
		if err := r.Sample(Weights{ID: id, Dir: "d/" + id}, got.job(0, 1)); err != nil {
			t.Fatal(err)
		}
		if a := <-got; a.o.Err != nil {
			t.Fatal(a.o.Err)
		}
	}
	for i := range SamplerCopies + 2 {
		sample(fmt.Sprintf("c%d", i))
	}
	sample("c2") // used again: now the most recent
	ids := r.SamplerCopyIDs()
	if len(ids) != SamplerCopies || slices.Contains(ids, "c0") || slices.Contains(ids, "c1") || ids[len(ids)-1] != "c2" {
		t.Fatalf("copies %v: want %d, without c0 and c1, c2 last", ids, SamplerCopies)
	}
	for _, gone := range []string{"c0", "c1"} {
		if f.HasAdapter(context.Background(), gone) {
			t.Fatalf("%s is still in the compute", gone)
		}
	}
	r.DropCopies(func(id string) bool { return id == "c2" || id == "c3" })
	if err := r.Do(context.Background(), func() {}); err != nil { // the drop ran before this
		t.Fatal(err)
	}
	if r.HoldsCopy("c2") || f.HasAdapter(context.Background(), "c3") || len(r.SamplerCopyIDs()) != SamplerCopies-2 {
		t.Fatalf("after DropCopies: %v", r.SamplerCopyIDs())
	}
}

// A sampling batch's context ends only once every request in it has a client that has gone; a
// request polled through a future (no client context) keeps the batch running.
func TestBatchContextEndsWhenEveryClientHasGone(t *testing.T) {
	cases := []struct {
		name    string
		clients []bool // per request: has a client context (false: a future)
		gone    []int  // the clients that go
		ended   bool
	}{
		{"one client gone", []bool{true}, []int{0}, true},
		{"one client stays", []bool{true}, nil, false},
		{"all of two gone", []bool{true, true}, []int{0, 1}, true},
		{"one of two gone", []bool{true, true}, []int{1}, false},
		{"a future keeps it", []bool{true, false}, []int{0}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			batch := make([]SampleJob, len(c.clients))
			cancels := make([]context.CancelFunc, len(c.clients))
			for i, has := range c.clients {
				if has {
					batch[i].Ctx, cancels[i] = context.WithCancel(context.Background())
					defer cancels[i]()
				}
			}
			ctx, stop := batchContext(batch)
			defer stop()
			for _, i := range c.gone {
				cancels[i]()
			}
			if c.ended {
				<-ctx.Done() // AfterFunc runs on its own goroutine: wait (the test hangs if it never ends)
				return
			}
			if ctx.Err() != nil {
				t.Fatal("the batch ended while a request still waits for it")
			}
		})
	}
}
