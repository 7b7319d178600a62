package engine

import (
	"context"
	"math"
	"path/filepath"
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
	}{{ArchLlama, 300}, {ArchQwen3, 300}, {ArchQwen3, 1000}, {ArchQwen3_5, 300}, {ArchQwen3_5, 1000}, {ArchQwen3MoE, 300}, {ArchQwen3_5MoE, 1000}} {
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
		a, _ := e.adapter("m")
		estimate := 4 * e.stepElems(3, T, false, a)
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
	for _, arch := range []Arch{ArchLlama, ArchQwen2, ArchQwen3, ArchQwen3_5, ArchQwen3MoE} {
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
					estimate := e.elemSize() * e.stepElems(2, T, true, a)
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
	full := e.elemSize() * e.stepElems(1, T, false, nil)
	e.opts.MaxStepBytes = full * 5 / 6
	if !e.recomputesLayers(1, T, nil) {
		t.Fatalf("one sequence of %d tokens needing %d bytes runs without recomputing in %d", T, full, e.opts.MaxStepBytes)
	}
	if e.recomputesLayers(1, 64, nil) {
		t.Fatal("a short sequence that fits recomputes")
	}
	if n := e.chunkTokens(T, nil); n < 2*T {
		t.Fatalf("recomputing, a chunk holds %d tokens of %d-token sequences; want several", n, T)
	}
}

// The head in tiles of rows (headRows) gives the logprobs, loss and gradients of the head in
// one product, and a pass holds one tile of logits, not all: on a model whose logits are most
// of a pass (vocab 8192 over hidden 64, one layer) the peak falls by most of the logits' bytes,
// and the plan's estimate, which counts one tile, bounds both peaks.
func TestHeadTilesMatchOneProductAndHoldOneTile(t *testing.T) {
	Presets["test-vocab"] = Preset{Hidden: 64, Layers: 1, Heads: 4, KVHeads: 2, FFN: 128, Vocab: 8192, Context: 1024}
	defer delete(Presets, "test-vocab")
	dir := filepath.Join(t.TempDir(), "m")
	if err := InitTiny(dir, ArchQwen3, "test-vocab", 1); err != nil {
		t.Fatal(err)
	}
	ids := make([]int, 64)
	for i := range ids {
		ids[i] = (i*53)%400 + 3
	}
	var data []Datum
	for range 8 {
		data = append(data, textDatum(ids))
	}
	T := padLen(63)
	N := 8 * T
	var lp [2][][]float64
	var loss [2]float64
	var grads [2][]float64
	var peaks, estimates [2]int
	var e *Engine
	for k, rows := range []int{0, 32} {
		var err error
		if e, err = Load(dir, Options{Float64: true}); err != nil {
			t.Fatal(err)
		}
		e.headTile = rows
		if _, err := e.CreateAdapter("m", LoraConfig{Rank: 4, Seed: 5, TrainAttn: true, TrainMLP: true, TrainUnembed: true}); err != nil {
			t.Fatal(err)
		}
		res, err := e.ForwardBackward(context.Background(), "m", data, "cross_entropy", nil)
		if err != nil {
			t.Fatal(err)
		}
		a, _ := e.adapter("m")
		for _, p := range a.params {
			grads[k] = append(grads[k], p.float64s('g')...)
		}
		lp[k], loss[k], peaks[k] = res.Logprobs, res.Loss, e.PeakStepBytes()
		estimates[k] = 8 * e.stepElems(8, T, false, a)
		if k == 0 && e.headTileRows() < N {
			t.Fatalf("the default tile (%d rows) must hold the whole pass of %d rows", e.headTileRows(), N)
		}
	}
	// One tile merges the head's LoRA (many rows), tiles of 32 add it: equal to rounding.
	if math.Abs(loss[0]-loss[1]) > 1e-12*math.Abs(loss[0]) {
		t.Fatalf("loss %v in one tile, %v in tiles", loss[0], loss[1])
	}
	for i := range lp[0] {
		for j := range lp[0][i] {
			if d := math.Abs(lp[0][i][j] - lp[1][i][j]); d > 1e-12 {
				t.Fatalf("datum %d token %d: logprob %v in one tile, %v in tiles", i, j, lp[0][i][j], lp[1][i][j])
			}
		}
	}
	var dot, n0, n1 float64
	for i := range grads[0] {
		dot += grads[0][i] * grads[1][i]
		n0 += grads[0][i] * grads[0][i]
		n1 += grads[1][i] * grads[1][i]
	}
	if cos := dot / math.Sqrt(n0*n1); n0 == 0 || cos < 1-1e-12 || math.Abs(n0-n1) > 1e-10*n0 {
		t.Fatalf("gradients: cosine %v, squared norms %v and %v", cos, n0, n1)
	}
	V := e.Config.VocabSize
	logits := 8 * N * V
	t.Logf("%d rows: peak %d bytes in one tile, %d in tiles of 32 (logits %d); estimates %d, %d", N, peaks[0], peaks[1], logits, estimates[0], estimates[1])
	if peaks[0]-peaks[1] < logits*3/4 {
		t.Fatalf("tiles of 32 rows held %d bytes, one tile %d: less than three quarters of the logits' %d saved", peaks[1], peaks[0], logits)
	}
	for k := range peaks {
		if peaks[k] > estimates[k] || peaks[k] < estimates[k]/2 {
			t.Fatalf("case %d: peak %d bytes, estimate %d", k, peaks[k], estimates[k])
		}
	}
	// The whole head's logits less a tile's (and the tile's rows of the norm), and the merged
	// head copy, which only the one-tile pass makes.
	D := e.Config.HiddenSize
	if want := 8 * ((N-32)*V - 32*D + V*D); estimates[0]-estimates[1] != want {
		t.Fatalf("the estimate counts %d bytes more for the whole head's logits than for a tile's, want %d", estimates[0]-estimates[1], want)
	}
}

// The feed-forward block's backward gives back its activations and temporaries before
// attention's backward runs: the same loss, logprobs and gradients bit for bit as keeping them to
// the layer's end, and a pass's peak lower by most of those [tokens, F] buffers (on an 8B shape
// at 1024 tokens 0.39 GB of a recomputed layer), recomputing layers or keeping them. Fails on
// the code that kept them (the peaks equal).
func TestFeedForwardBackwardGivesBackItsBuffers(t *testing.T) {
	ids := make([]int, 200)
	for i := range ids {
		ids[i] = (i*53)%400 + 3
	}
	data := []Datum{textDatum(ids), textDatum(ids[:150])}
	for _, arch := range []Arch{ArchLlama, ArchQwen3} {
		for _, recompute := range []bool{false, true} {
			var grads [2][]float64
			var peaks [2]int
			var loss [2]float64
			var lp [2][][]float64
			var e *Engine
			for k, keep := range []bool{true, false} {
				e = loadTiny(t, arch, Options{})
				e.recompute, e.keepFFNActs = &recompute, keep
				a := adapterWithB(t, e, "r", LoraConfig{Rank: 2, Seed: 5, TrainAttn: true, TrainMLP: true}, func(i, j int) float64 { return 0.02 * math.Cos(float64(j+i)) })
				r, err := e.ForwardBackward(context.Background(), "r", data, "cross_entropy", nil)
				if err != nil {
					t.Fatal(err)
				}
				loss[k], peaks[k], lp[k] = r.Loss, e.PeakStepBytes(), r.Logprobs
				for _, p := range a.params {
					grads[k] = append(grads[k], p.float64s('g')...)
				}
			}
			if loss[0] != loss[1] || !reflect.DeepEqual(lp[0], lp[1]) || !slices.Equal(grads[0], grads[1]) {
				t.Fatalf("%s recompute=%v: giving the buffers back changed the results (loss %v and %v)", arch, recompute, loss[0], loss[1])
			}
			// The block's [N, F] float32 buffers: at least its four activations no longer beside
			// attention's backward.
			block := 4 * 4 * 2 * padLen(len(ids)) * e.Config.IntermediateSize
			t.Logf("%s recompute=%v: peak %d bytes keeping the block's buffers, %d giving them back (%d)", arch, recompute, peaks[0], peaks[1], block)
			if peaks[0]-peaks[1] < block*3/4 {
				t.Fatalf("%s recompute=%v: peak %d keeping the block's buffers, %d giving them back: want %d less", arch, recompute, peaks[0], peaks[1], block*3/4)
			}
		}
	}
}
