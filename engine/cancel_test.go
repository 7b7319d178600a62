package engine

import (
	"context"
	"errors"
	"math"
	"slices"
	"testing"
)

// adapterState copies everything of an adapter a call could change.
type adapterState struct {
	w, g, m, v [][]float64
	step       int
	pending    bool
}

func stateOf(a *Adapter) adapterState {
	s := adapterState{step: a.Step, pending: a.pendingGrads}
	for _, p := range a.params {
		s.w = append(s.w, slices.Clone(p.float64s('w')))
		s.g = append(s.g, slices.Clone(p.float64s('g')))
		s.m = append(s.m, slices.Clone(p.float64s('m')))
		s.v = append(s.v, slices.Clone(p.float64s('v')))
	}
	return s
}

func equalBits(a, b [][]float64) bool {
	return slices.EqualFunc(a, b, func(x, y []float64) bool {
		return slices.EqualFunc(x, y, func(u, v float64) bool { return math.Float64bits(u) == math.Float64bits(v) })
	})
}

func (s adapterState) equal(o adapterState) bool {
	return s.step == o.step && s.pending == o.pending && equalBits(s.w, o.w) && equalBits(s.g, o.g) && equalBits(s.m, o.m) && equalBits(s.v, o.v)
}

// A forward_backward whose context ends mid-pass stops at the next layer (or chunk), returns the
// context's error, and leaves the adapter bit for bit as it was: its weights, its accumulated
// gradients (a previous forward_backward's included) and its optimizer state. With none pending
// (zero: right after an optim_step) the batch sums into the accumulator in place, so a cancel
// after the first chunk must zero what that chunk added.
func TestCancelledForwardBackwardStopsAndChangesNothing(t *testing.T) {
	ids := make([]int, 0, 200)
	for len(ids) < 200 {
		ids = append(ids, len(ids)%300+3)
	}
	data := []Datum{textDatum(ids), textDatum(ids[:150]), textDatum(ids[:120])}
	cases := []struct {
		name     string
		opts     Options
		cancelAt int  // cancel when this many layers (all chunks together) have begun
		zero     bool // no gradients pending when the call begins
	}{
		{"mid pass", Options{}, 1, false},
		{"second chunk", Options{MaxBatchTokens: 300}, -1, false}, // -1: once the first chunk's layers are done
		{"before any layer", Options{}, 0, false},
		{"mid pass, accumulator zero", Options{}, 1, true},
		{"second chunk, accumulator zero", Options{MaxBatchTokens: 300}, -1, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := loadTiny(t, ArchQwen2, c.opts)
			L := e.Config.NumHiddenLayers
			a := adapterWithB(t, e, "a", LoraConfig{Rank: 4, TrainAttn: true, TrainMLP: true}, func(i, j int) float64 { return 0.01 * float64((i+j)%7-3) })
			// Some state worth keeping: one step taken and gradients pending.
			if _, err := e.ForwardBackward(context.Background(), "a", data[:1], "cross_entropy", nil); err != nil {
				t.Fatal(err)
			}
			if _, err := e.OptimStep(context.Background(), "a", DefaultAdamParams()); err != nil {
				t.Fatal(err)
			}
			if !c.zero {
				if _, err := e.ForwardBackward(context.Background(), "a", data[1:2], "cross_entropy", nil); err != nil {
					t.Fatal(err)
				}
			}
			before := stateOf(a)

			if c.opts.MaxBatchTokens > 0 && len(e.chunks([]int{199, 149, 119}, a)) < 2 {
				t.Fatal("the batch should run in several chunks")
			}
			cancelAt := c.cancelAt
			if cancelAt < 0 {
				cancelAt = L // the first layer of the second chunk
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			ran := 0
			e.layerHook = func(int) {
				if ran == cancelAt {
					cancel()
				}
				ran++
			}
			if cancelAt == 0 {
				cancel()
				ran = 0
			}
			_, err := e.ForwardBackward(ctx, "a", data, "cross_entropy", nil)
			if !errors.Is(err, context.Canceled) || !errors.Is(err, ErrCancelled) {
				t.Fatalf("err = %v, want one wrapping context.Canceled and ErrCancelled", err)
			}
			// The hook runs before each layer; the layer whose hook cancelled does not run.
			full := L * len(e.chunks([]int{199, 149, 119}, a))
			want := cancelAt + 1
			if cancelAt == 0 {
				want = 0 // refused before the pass began
			}
			if ran != want || cancelAt >= full {
				t.Fatalf("hook called %d times with a cancel at layer %d, want %d (a full pass runs %d layers)", ran, cancelAt, want, full)
			}
			if !stateOf(a).equal(before) {
				t.Fatal("a cancelled forward_backward changed the adapter")
			}
			// And the adapter still trains: the same call with a live context succeeds.
			e.layerHook = nil
			if _, err := e.ForwardBackward(context.Background(), "a", data, "cross_entropy", nil); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// A forward pass stops between layers too.
func TestCancelledForwardStops(t *testing.T) {
	e := loadTiny(t, ArchQwen2, Options{})
	ctx, cancel := context.WithCancel(context.Background())
	ran := 0
	e.layerHook = func(int) {
		ran++
		cancel()
	}
	_, err := e.Forward(ctx, "", []Datum{textDatum([]int{3, 4, 5, 6, 7})}, "cross_entropy", nil)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if ran != 1 || e.Config.NumHiddenLayers < 2 { // the first hook cancelled: no layer ran
		t.Fatalf("hook called %d times, want 1 (of %d layers)", ran, e.Config.NumHiddenLayers)
	}
}

// Sampling whose context ends stops decoding: no more steps run once it is cancelled.
func TestCancelledSampleStopsDecoding(t *testing.T) {
	e := loadTiny(t, ArchQwen2, Options{})
	L := e.Config.NumHiddenLayers
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tokens := 0
	const maxTokens = 40
	// A fixed seed: an unseeded draw could end the sample (end of sequence) before its third token.
	seed := int64(1)
	req := SampleRequest{Prompt: []int{3, 4, 5}, NumSamples: 1, Params: SampleParams{MaxTokens: maxTokens, Temperature: 1, Seed: &seed}}
	req.OnToken = func(_, _ int, _ float64) bool {
		tokens++
		if tokens == 3 {
			cancel()
		}
		return true
	}
	layers := 0
	e.layerHook = func(int) { layers++ }
	_, err := e.SampleBatch(ctx, "", []SampleRequest{req})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	// The prefill and two decode steps ran (the third token came from the second step's logits);
	// no step began after the cancel.
	if tokens != 3 || layers != 3*L {
		t.Fatalf("%d tokens and %d layers after a cancel at token 3, want 3 and %d", tokens, layers, 3*L)
	}
}

// A sampler snapshot is read-only: forward_backward and optim_step refuse it, and it is not
// among the training adapters; sampling and forward passes read it as any adapter.
func TestSnapshotsAreReadOnly(t *testing.T) {
	e := loadTiny(t, ArchQwen2, Options{})
	ctx := context.Background()
	if err := e.CreateLora(ctx, "train", LoraConfig{Rank: 2, TrainMLP: true}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := e.SaveAdapter(ctx, "train", dir, false); err != nil {
		t.Fatal(err)
	}
	if err := e.LoadSnapshot(ctx, "snap", dir); err != nil {
		t.Fatal(err)
	}
	data := []Datum{textDatum([]int{3, 4, 5, 6})}
	if _, err := e.ForwardBackward(ctx, "snap", data, "cross_entropy", nil); !errors.Is(err, ErrSnapshot) {
		t.Fatalf("forward_backward on a snapshot: %v, want ErrSnapshot", err)
	}
	if _, err := e.OptimStep(ctx, "snap", DefaultAdamParams()); !errors.Is(err, ErrSnapshot) {
		t.Fatalf("optim_step on a snapshot: %v, want ErrSnapshot", err)
	}
	if _, err := e.Forward(ctx, "snap", data, "cross_entropy", nil); err != nil {
		t.Fatal(err)
	}
	if ids := e.TrainingAdapterIDs(ctx); !slices.Equal(ids, []string{"train"}) {
		t.Fatalf("training adapters %v, want [train]", ids)
	}
}
