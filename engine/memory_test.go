package engine

import (
	"context"
	"math"
	"reflect"
	"slices"
	"testing"
)

// A pass holds what stepElemsPerToken predicts, not more: the estimate that sizes chunks
// (with its margin) bounds the measured peak, and is not loose by more than a third. The peak
// includes reused buffers, so a pass that kept every layer's backward temporaries, or that
// freed nothing before the end, would exceed it.
func TestStepMemoryMatchesEstimate(t *testing.T) {
	for _, c := range []struct {
		arch Arch
		n    int // tokens of the longest sequence
	}{{ArchLlama, 300}, {ArchQwen3, 300}, {ArchQwen3, 1000}} {
		arch := c.arch
		e := loadTiny(t, arch, Options{})
		if _, err := e.CreateAdapter("m", LoraConfig{Rank: 4, TrainAttn: true, TrainMLP: true, TrainUnembed: true}); err != nil {
			t.Fatal(err)
		}
		ids := make([]int, c.n)
		for i := range ids {
			ids[i] = (i*37)%400 + 3
		}
		data := []Datum{textDatum(ids), textDatum(ids[:c.n-10]), textDatum(ids[:c.n-50])}
		if _, err := e.ForwardBackward(context.Background(), "m", data, "cross_entropy", nil); err != nil {
			t.Fatal(err)
		}
		cfg := e.Config
		T := padLen(c.n)
		perToken := cfg.stepElemsPerToken(T)
		estimate := 4 * (e.stepFixedElems() + 3*T*(perToken+perToken/10))
		got := e.PeakStepBytes()
		t.Logf("%s, 3×%d tokens (probabilities recomputed: %v): peak %d bytes, estimate %d", arch, T, cfg.recomputesProbs(T), got, estimate)
		if got > estimate || got < estimate*2/3 {
			t.Fatalf("%s: a pass of 3×%d tokens held %d bytes; the estimate is %d", arch, T, got, estimate)
		}
	}
}

// Recomputing attention probabilities in the backward pass gives the gradients that keeping
// them gives, and holds less memory; so does merging LoRA weights again rather than keeping the
// forward pass's.
func TestRecomputedAttentionMatchesKept(t *testing.T) {
	ids := make([]int, 200)
	for i := range ids {
		ids[i] = (i*53)%400 + 3
	}
	data := []Datum{textDatum(ids), textDatum(ids[:150])}
	var grads [2][][]float64
	var peaks [2]int
	var loss [2]float64
	for k, recompute := range []bool{false, true} {
		e := loadTiny(t, ArchQwen3, Options{Float64: true})
		e.recomputeProbs = func(int) bool { return recompute }
		keep := !recompute
		e.keepMerged = &keep
		a := adapterWithB(t, e, "r", LoraConfig{Rank: 2, Seed: 5, TrainAttn: true, TrainMLP: true, TrainUnembed: true}, func(i, j int) float64 { return 0.02 * math.Cos(float64(j+i)) })
		r, err := e.ForwardBackward(context.Background(), "r", data, "cross_entropy", nil)
		if err != nil {
			t.Fatal(err)
		}
		loss[k], peaks[k] = r.Loss, e.PeakStepBytes()
		for _, p := range a.params {
			grads[k] = append(grads[k], p.float64s('g'))
		}
	}
	if loss[0] != loss[1] {
		t.Fatalf("loss %v kept, %v recomputed", loss[0], loss[1])
	}
	for i := range grads[0] {
		for j, v := range grads[0][i] {
			if math.Abs(v-grads[1][i][j]) > 1e-12*(1+math.Abs(v)) {
				t.Fatalf("gradient %d[%d]: %v kept, %v recomputed", i, j, v, grads[1][i][j])
			}
		}
	}
	if peaks[1] >= peaks[0] {
		t.Fatalf("recomputing held %d bytes, keeping %d", peaks[1], peaks[0])
	}
	t.Logf("peak %d bytes keeping probabilities, %d recomputing", peaks[0], peaks[1])
}

// Recomputing every layer in the backward pass (keeping only layer inputs) gives the gradients
// and losses that keeping the activations gives, bit for bit (the same forward runs again), on
// every text architecture and both dtypes; it holds less, and what it holds is within the
// estimate that sizes its chunks.
func TestRecomputedLayersMatchKept(t *testing.T) {
	ids := make([]int, 300)
	for i := range ids {
		ids[i] = (i*53)%400 + 3
	}
	data := []Datum{textDatum(ids), textDatum(ids[:250])}
	for _, arch := range []Arch{ArchLlama, ArchQwen2, ArchQwen3} {
		for _, f64 := range []bool{false, true} {
			var grads [2][]float64
			var peaks [2]int
			var loss [2]float64
			var lp [2][][]float64
			for k, recompute := range []bool{false, true} {
				e := loadTiny(t, arch, Options{Float64: f64})
				e.recompute = &recompute
				a := adapterWithB(t, e, "r", LoraConfig{Rank: 2, Seed: 5, TrainAttn: true, TrainMLP: true, TrainUnembed: true}, func(i, j int) float64 { return 0.02 * math.Cos(float64(j+i)) })
				r, err := e.ForwardBackward(context.Background(), "r", data, "cross_entropy", nil)
				if err != nil {
					t.Fatal(err)
				}
				loss[k], peaks[k], lp[k] = r.Loss, e.PeakStepBytes(), r.Logprobs
				for _, p := range a.params {
					grads[k] = append(grads[k], p.float64s('g')...)
				}
				if recompute {
					T := padLen(len(ids))
					estimate := e.elemSize() * (e.stepFixedElems() + 2*T*withMargin(e.Config.recomputeElemsPerToken(T)))
					if peaks[k] > estimate {
						t.Fatalf("%s f64=%v: recomputing held %d bytes, over its estimate %d", arch, f64, peaks[k], estimate)
					}
				}
			}
			if loss[0] != loss[1] || !reflect.DeepEqual(lp[0], lp[1]) || !slices.Equal(grads[0], grads[1]) {
				t.Fatalf("%s f64=%v: recomputing changed the results (loss %v and %v)", arch, f64, loss[0], loss[1])
			}
			if peaks[1] >= peaks[0] {
				t.Fatalf("%s f64=%v: recomputing held %d bytes, keeping %d", arch, f64, peaks[1], peaks[0])
			}
			t.Logf("%s f64=%v: peak %d bytes keeping activations, %d recomputing", arch, f64, peaks[0], peaks[1])
		}
	}
}

// A sequence whose activations alone exceed the step budget is recomputed, and the plan then
// fits several such sequences in one chunk; a shorter one keeps its activations.
func TestRecomputeIsChosenWhenOneSequenceDoesNotFit(t *testing.T) {
	tiny := loadTiny(t, ArchQwen3, Options{})
	// The plan of a deep model (32 layers: the kept inputs are a small part of the activations).
	cfg := *tiny.Config
	cfg.NumHiddenLayers = 32
	e := &Engine{Config: &cfg, opts: tiny.opts}
	T := 1024
	full := e.elemSize() * (e.stepFixedElems() + T*withMargin(e.Config.stepElemsPerToken(T)))
	e.opts.MaxStepBytes = full * 5 / 6
	if !e.recomputesLayers(1, T) {
		t.Fatalf("one sequence of %d tokens needing %d bytes runs without recomputing in %d", T, full, e.opts.MaxStepBytes)
	}
	if e.recomputesLayers(1, 64) {
		t.Fatal("a short sequence that fits recomputes")
	}
	if n := e.chunkTokens(T); n < 2*T {
		t.Fatalf("recomputing, a chunk holds %d tokens of %d-token sequences; want several", n, T)
	}
}
