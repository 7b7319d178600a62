package worker

import (
	"context"
	"math"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/skein-ai/skein/engine"
)

// turnProbe is a real engine whose forward_backward of "long" first waits for a call to be
// queued for a turn on the worker's gate (bounded: a liveness bound, not a speed check), then
// runs the real pass, which gives turns between its layers; it notes how many sampling calls the
// engine had answered by the pass's end.
type turnProbe struct {
	*engine.Engine
	gate      *turnGate
	started   chan struct{}
	samples   atomic.Int64
	seenAtEnd int64
}

func (p *turnProbe) SampleBatch(ctx context.Context, id string, reqs []engine.SampleRequest) ([]*engine.SampleResult, error) {
	res, err := p.Engine.SampleBatch(ctx, id, reqs)
	p.samples.Add(1)
	return res, err
}

func (p *turnProbe) ForwardBatch(ctx context.Context, id string, b *engine.Batch, backward bool) (*engine.ForwardResult, error) {
	if id != "long" {
		return p.Engine.ForwardBatch(ctx, id, b, backward)
	}
	close(p.started)
	for deadline := time.Now().Add(10 * time.Second); p.gate.queued() == 0 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	res, err := p.Engine.ForwardBatch(ctx, id, b, backward)
	p.seenAtEnd = p.samples.Load()
	return res, err
}

// loadTinyQwen3 loads dir, or (dir "") a tiny Qwen3 generated for the test.
func loadTinyQwen3(tb testing.TB, dir string) *engine.Engine {
	tb.Helper()
	if dir == "" {
		dir = filepath.Join(tb.TempDir(), "tiny")
		if err := engine.InitTiny(dir, engine.ArchQwen3, "tiny", 1); err != nil {
			tb.Fatal(err)
		}
	}
	e, err := engine.Load(dir, engine.Options{})
	if err != nil {
		tb.Fatal(err)
	}
	return e
}

// Turns across the worker protocol (issue 39 item 4): while a worker runs one gateway call's
// forward_backward, the gateway's replica gives its turn (its client waits on the turn signal),
// and the sampling call it sends then runs on the worker between the pass's layers, not after
// the pass. The sample equals the same request sampled alone, the pass's losses equal a twin
// adapter's without a turn; a sample of the training adapter itself is not run in a turn (its
// gradients are being written) and is answered after the pass.
func TestSamplesRunBetweenTheLayersOfAWorkersCall(t *testing.T) {
	e := loadTinyQwen3(t, "")
	ctx := context.Background()
	seed := int64(7)
	prompt := []int{5, 17, 29, 41, 53, 65, 77}
	datum := []engine.Datum{{Tokens: []int{3, 9, 27, 81, 243, 5, 15, 45}, Inputs: map[string]engine.TensorInput{
		"target_tokens": {DType: "int64", Data: []float64{9, 27, 81, 243, 5, 15, 45, 135}},
		"weights":       {DType: "float32", Data: []float64{1, 1, 1, 1, 1, 1, 1, 1}}}}}
	for _, c := range []struct {
		name    string
		adapter string // what the turn's sample reads
		inTurn  bool
	}{{"base model", "", true}, {"the training adapter", "long", false}} {
		t.Run(c.name, func(t *testing.T) {
			p := &turnProbe{Engine: e, started: make(chan struct{})}
			s := NewServer(p, "tok", t.TempDir())
			p.gate = s.gate
			ts := httptest.NewServer(s)
			defer ts.Close()
			cl := NewClient(ts.URL, "tok", e.Info())
			defer func() {
				cl.DeleteAdapter(ctx, "long")
				cl.DeleteAdapter(ctx, "twin")
			}()
			for _, id := range []string{"long", "twin"} {
				if err := cl.CreateLora(ctx, id, engine.LoraConfig{Rank: 4, Seed: 3, TrainMLP: true, TrainAttn: true}); err != nil {
					t.Fatal(err)
				}
			}
			req := []engine.SampleRequest{{Prompt: prompt, NumSamples: 2, Params: engine.SampleParams{MaxTokens: 6, Temperature: 1, Seed: &seed}}}
			var inTurn []*engine.SampleResult
			var turnErr error
			turns := 0
			give := func() {
				turns++
				inTurn, turnErr = cl.SampleBatch(ctx, c.adapter, req)
			}
			wanted := make(chan struct{}, 1)
			tctx := engine.WithTurnWanted(engine.WithTurns(ctx, give), wanted)
			type answer struct {
				res *engine.ForwardResult
				err error
			}
			done := make(chan answer, 1)
			go func() {
				res, err := cl.ForwardBackward(tctx, "long", datum, "cross_entropy", nil)
				done <- answer{res, err}
			}()
			<-p.started
			wanted <- struct{}{} // a sampling batch waits: the client gives the turn
			got := <-done
			if got.err != nil {
				t.Fatal(got.err)
			}
			if turns != 1 || turnErr != nil {
				t.Fatalf("turns given %d, the turn's sample: %v", turns, turnErr)
			}
			if want := int64(0); c.inTurn {
				if p.seenAtEnd != 1 {
					t.Fatalf("%d samples answered by the end of the pass, want the turn's", p.seenAtEnd)
				}
			} else if p.seenAtEnd != want {
				t.Fatalf("a sample of the training adapter ran inside its own pass (%d answered by its end)", p.seenAtEnd)
			}
			twin, err := cl.ForwardBackward(ctx, "twin", datum, "cross_entropy", nil)
			if err != nil {
				t.Fatal(err)
			}
			if got.res.Loss != twin.Loss || !slices.Equal(got.res.Losses[0], twin.Losses[0]) {
				t.Fatalf("the pass that gave a turn computed loss %v, its twin without one %v", got.res.Loss, twin.Loss)
			}
			alone, err := cl.SampleBatch(ctx, c.adapter, req)
			if err != nil {
				t.Fatal(err)
			}
			if len(inTurn) != 1 || len(alone) != 1 || len(inTurn[0].Sequences) != 2 {
				t.Fatalf("answers %d and %d", len(inTurn), len(alone))
			}
			for i, seq := range inTurn[0].Sequences {
				want := alone[0].Sequences[i]
				if !slices.Equal(seq.Tokens, want.Tokens) {
					t.Fatalf("sample %d in the turn %v, alone %v", i, seq.Tokens, want.Tokens)
				}
				for k := range seq.Logprobs {
					if math.Abs(seq.Logprobs[k]-want.Logprobs[k]) > 1e-4 {
						t.Fatalf("sample %d logprob %d: %v in the turn, %v alone", i, k, seq.Logprobs[k], want.Logprobs[k])
					}
				}
			}
		})
	}
}
