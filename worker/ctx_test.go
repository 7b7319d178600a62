package worker

import (
	"context"
	"errors"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"testing"

	"github.com/skein-ai/skein/engine"
)

// blockingEngine's forward_backward waits for its context to end and reports that it did.
type blockingEngine struct {
	fakeEngine
	started, sawCancel chan struct{}
}

func (b *blockingEngine) ForwardBatch(ctx context.Context, id string, _ *engine.Batch, _ bool) (*engine.ForwardResult, error) {
	close(b.started)
	<-ctx.Done()
	close(b.sawCancel)
	return nil, ctx.Err()
}

// Cancelling a client call aborts its HTTP request: the call returns the context's error (not
// "worker lost": the worker is fine), and the worker's engine sees its own context end, so
// the pass there stops too. The call counts as one that may have run.
func TestClientCancelAbortsTheCall(t *testing.T) {
	b := &blockingEngine{started: make(chan struct{}), sawCancel: make(chan struct{})}
	ts := httptest.NewServer(NewServer(b, "tok", t.TempDir()))
	defer ts.Close()
	c := NewClient(ts.URL, "tok", b.Info())
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-b.started
		cancel()
	}()
	_, err := c.ForwardBackward(ctx, "a", []engine.Datum{{Tokens: []int{1, 2}}}, "cross_entropy", nil)
	if !errors.Is(err, context.Canceled) || !errors.Is(err, engine.ErrCancelled) || errors.Is(err, ErrLost) {
		t.Fatalf("err = %v, want context.Canceled and engine.ErrCancelled, not ErrLost", err)
	}
	<-b.sawCancel // the worker's engine saw the request's context end (or this test hangs)
	if c.Effects() != 1 {
		t.Fatalf("effects = %d, want 1 (a cancelled forward_backward may have run)", c.Effects())
	}
}

// A worker's heartbeat counts as slot users the adapters the engine knows are training ones,
// whatever their ids look like: a sampler snapshot takes no slot even with ":train:" in its id,
// and a training adapter takes one without.
func TestStatusCountsTrainingAdaptersByKind(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tiny")
	if err := engine.InitTiny(dir, engine.ArchQwen2, "tiny", 1); err != nil {
		t.Fatal(err)
	}
	e, err := engine.Load(dir, engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	cfg := engine.LoraConfig{Rank: 2, TrainMLP: true}
	if err := e.CreateLora(ctx, "plain-name", cfg); err != nil {
		t.Fatal(err)
	}
	saved := filepath.Join(t.TempDir(), "saved")
	if err := e.SaveAdapter(ctx, "plain-name", saved, false); err != nil {
		t.Fatal(err)
	}
	if err := e.LoadSnapshot(ctx, "sess:train:0:snapshot", saved); err != nil {
		t.Fatal(err)
	}
	if err := e.LoadAdapter(ctx, "sess:train:1", saved, false); err != nil {
		t.Fatal(err)
	}
	hb := NewServer(e, "tok", t.TempDir()).Status(4)
	slices.Sort(hb.Adapters)
	if want := []string{"plain-name", "sess:train:1"}; !slices.Equal(hb.Adapters, want) || hb.FreeSlots != 2 {
		t.Fatalf("adapters %v, free slots %d; want %v and 2", hb.Adapters, hb.FreeSlots, want)
	}
}
