package replica

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/skein-ai/skein/engine"
)

// midway is a compute whose forward_backward stops in the middle, as between two layers: it
// gives a turn (engine.GiveTurn) and notes which sampling answers had come by then.
type midway struct {
	*fakeCompute
	started, resume chan struct{}
	answered        func() int
	seen            int
}

func (m *midway) ForwardBatch(ctx context.Context, id string, b *engine.Batch, backward bool) (*engine.ForwardResult, error) {
	if id != "long" {
		return m.fakeCompute.ForwardBatch(ctx, id, b, backward)
	}
	close(m.started)
	<-m.resume
	engine.GiveTurn(ctx)
	m.seen = m.answered()
	return m.fakeCompute.ForwardBatch(ctx, id, b, backward)
}

// While one tenant's long op runs, sampling requests queued meanwhile (any tenant, any weights)
// are served at its next turn, inside the op, as one batch; other ops (another tenant's
// forward_backward) still wait for the op to end. Without turns the samples would wait for all
// of it.
func TestSamplesRunInsideALongOp(t *testing.T) {
	f := newFake()
	got := make(answers, 8)
	m := &midway{fakeCompute: f, started: make(chan struct{}), resume: make(chan struct{}), answered: func() int { return len(got) }}
	r := New("r", "m", m, 4)
	defer r.Close()
	long := Adapter{ID: "long", Lane: "a", State: &keeper{f: f}}
	other := Adapter{ID: "other", Lane: "c", State: &keeper{f: f}}
	if err := r.Place(context.Background(), other); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 2)
	go func() {
		_, err := r.ForwardBackward(context.Background(), long, &engine.Batch{})
		done <- err
	}()
	<-m.started
	// Queued while the op runs: another tenant's forward_backward, then three samples.
	otherDone := make(chan error, 1)
	go func() {
		_, err := r.ForwardBackward(context.Background(), other, &engine.Batch{})
		otherDone <- err
	}()
	for r.QueueDepth() < 2 {
		runtime.Gosched()
	}
	for i, w := range []Weights{{Lane: "b"}, {ID: "s1", Dir: "d/s1", Lane: "b"}, {Lane: "d"}} {
		if err := r.Sample(w, got.job(i, 20+i)); err != nil {
			t.Fatal(err)
		}
	}
	close(m.resume)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if m.seen != 3 {
		t.Fatalf("%d of 3 samples were answered inside the long op", m.seen)
	}
	if err := <-otherDone; err != nil {
		t.Fatal(err)
	}
	calls := withoutHas(f.callLog())
	iLong, iOther := slices.Index(calls, "forward long backward=true"), slices.Index(calls, "forward other backward=true")
	iSample := slices.Index(calls, "sample ")
	if iLong < 0 || iOther < 0 || iSample < 0 || !(iSample < iLong && iLong < iOther) {
		t.Fatalf("calls %v: want the samples inside the long op, the other op after it", calls)
	}
	f.mu.Lock()
	batches := f.batches
	f.mu.Unlock()
	if len(batches) != 1 || len(batches[0]) != 3 {
		t.Fatalf("sampling batches %v, want the three requests in one", batches)
	}
}

// A batch takes requests in turn by lane, up to engine.MaxSampleRows samples and SamplerCopies
// distinct sampler copies; the rest go in the next batch.
func TestSamplingBatchesAreBounded(t *testing.T) {
	cases := []struct {
		name    string
		weights func(i int) Weights
		samples int
		n       int
		first   int // requests in the first batch
		copies  int // SetSamplerCopies (0: the default)
	}{
		{"rows", func(i int) Weights { return Weights{Lane: fmt.Sprint(i % 2)} }, 16, 6, engine.MaxSampleRows / 16, 0},
		{"copies", func(i int) Weights { return Weights{ID: fmt.Sprint("c", i), Dir: "d", Lane: "t"} }, 1, SamplerCopies + 3, SamplerCopies, 0},
		{"one big request alone", func(int) Weights { return Weights{Lane: "t"} }, engine.MaxSampleRows, 2, 1, 0},
		{"copies set lower", func(i int) Weights { return Weights{ID: fmt.Sprint("c", i), Dir: "d", Lane: "t"} }, 1, 5, 3, 3},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFake()
			r := New("r", "m", f, 2)
			defer r.Close()
			r.SetSamplerCopies(c.copies)
			block := make(chan struct{})
			_ = r.Run(func() { <-block })
			got := make(answers, c.n)
			for i := range c.n {
				j := got.job(i, 1)
				j.Req.NumSamples = c.samples
				if err := r.Sample(c.weights(i), j); err != nil {
					t.Fatal(err)
				}
			}
			close(block)
			for range c.n {
				if a := <-got; a.o.Err != nil {
					t.Fatal(a.o.Err)
				}
			}
			f.mu.Lock()
			defer f.mu.Unlock()
			total := 0
			for _, b := range f.batches {
				total += len(b)
			}
			if len(f.batches) < 2 || len(f.batches[0]) != c.first || total != c.n {
				t.Fatalf("batches %v: want %d requests first, %d in all", f.batches, c.first, c.n)
			}
		})
	}
}

// bigSampler's first SampleBatch (the big one) gives a turn in the middle, as the engine does
// between the layers of a decode step, and notes whether the small request was answered by then.
type bigSampler struct {
	*fakeCompute
	calls          int
	inside, resume chan struct{}
	answeredInside bool
	answered       func() bool
}

func (b *bigSampler) SampleBatch(ctx context.Context, id string, reqs []engine.SampleRequest) ([]*engine.SampleResult, error) {
	b.calls++
	if b.calls == 1 {
		close(b.inside)
		<-b.resume
		engine.GiveTurn(ctx)
		b.answeredInside = b.answered()
	}
	return b.fakeCompute.SampleBatch(ctx, id, reqs)
}

// One tenant's big sampling request (a long decode) does not hold another tenant's small one:
// the small one, queued while the big one decodes, is served at the big one's next turn.
func TestASmallSampleRunsInsideABigOne(t *testing.T) {
	got := make(answers, 2)
	b := &bigSampler{fakeCompute: newFake(), inside: make(chan struct{}), resume: make(chan struct{})}
	small := make(chan struct{})
	b.answered = func() bool {
		select {
		case <-small:
			return true
		default:
			return false
		}
	}
	r := New("r", "m", b, 2)
	defer r.Close()
	big := got.job(0, 1)
	big.Req.NumSamples = 64
	if err := r.Sample(Weights{Lane: "big"}, big); err != nil {
		t.Fatal(err)
	}
	<-b.inside
	j := got.job(1, 2)
	done := j.Done
	j.Done = func(o SampleOutcome) { close(small); done(o) }
	if err := r.Sample(Weights{Lane: "small"}, j); err != nil {
		t.Fatal(err)
	}
	close(b.resume)
	for range 2 {
		if a := <-got; a.o.Err != nil {
			t.Fatal(a.o.Err)
		}
	}
	if !b.answeredInside {
		t.Fatal("the small request waited for the whole big decode")
	}
}

// remoteLike is a compute whose long forward_backward runs no layers here, like a remote
// worker's: it waits for the replica's signal that a turn is wanted (engine.TurnWanted) and
// gives it then, until the samples queued during the op were answered (or a bound of signals).
type remoteLike struct {
	*fakeCompute
	started  chan struct{}
	answered func() int
	want     int
	seen     int
	signals  int
}

func (m *remoteLike) ForwardBatch(ctx context.Context, id string, b *engine.Batch, backward bool) (*engine.ForwardResult, error) {
	if id != "long" {
		return m.fakeCompute.ForwardBatch(ctx, id, b, backward)
	}
	wanted := engine.TurnWanted(ctx)
	if wanted == nil {
		return nil, fmt.Errorf("the replica's op context carries no turn signal")
	}
	close(m.started)
	for m.answered() < m.want && m.signals < 100 {
		select {
		case <-wanted:
		case <-time.After(10 * time.Second): // no signal: a liveness bound, not a speed check
			m.signals = 100
			continue
		}
		m.signals++
		engine.GiveTurn(ctx)
	}
	m.seen = m.answered()
	return m.fakeCompute.ForwardBatch(ctx, id, b, backward)
}

// A compute that runs no layers here (a remote worker's) is told when a sampling batch waits
// during its op, and the batch then runs inside the op: the samples queued while it runs are
// answered before it ends. Without the signal the op waits it out (10 s here) and the samples
// run after it.
func TestRemoteOpsAreToldWhenATurnIsWanted(t *testing.T) {
	f := newFake()
	got := make(answers, 8)
	m := &remoteLike{fakeCompute: f, started: make(chan struct{}), answered: func() int { return len(got) }, want: 2}
	r := New("r", "m", m, 4)
	defer r.Close()
	long := Adapter{ID: "long", Lane: "a", State: &keeper{f: f}}
	done := make(chan error, 1)
	go func() {
		_, err := r.ForwardBackward(context.Background(), long, &engine.Batch{})
		done <- err
	}()
	<-m.started
	for i, w := range []Weights{{Lane: "b"}, {ID: "s1", Dir: "d/s1", Lane: "c"}} {
		if err := r.Sample(w, got.job(i, 30+i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if m.seen != 2 {
		t.Fatalf("%d of 2 samples were answered inside the remote op (after %d signals)", m.seen, m.signals)
	}
	for range 2 {
		if a := <-got; a.o.Err != nil {
			t.Fatal(a.o.Err)
		}
	}
}
