package engine

import (
	"context"
	"math"
	"path/filepath"
	"testing"

	"github.com/skein-ai/skein/engine/internal/kernels"
)

// A quantized weight too large to widen at once (pairsChunkOutputs) is multiplied a chunk of its
// outputs at a time, forward and for the input gradient: over a Q4_K base whose head tiles and
// projections are all chunked, training gives the unchunked pass's logprobs and loss (each
// output column is the same product) and its gradients to float32 rounding, while the pairs
// buffer, and the plan's account of it, hold one chunk rather than the head.
func TestQuantizedChunksMatchWholeWeight(t *testing.T) {
	if !kernels.HaveBF16GEMM() {
		t.Skip("quantized weights are widened into pairs only on a path with the bf16 GEMM")
	}
	Presets["test-quant-vocab"] = Preset{Hidden: 256, Layers: 1, Heads: 4, KVHeads: 2, FFN: 512, Vocab: 4096, Context: 1024}
	defer delete(Presets, "test-quant-vocab")
	dir := filepath.Join(t.TempDir(), "m")
	if err := InitTiny(dir, ArchLlama, "test-quant-vocab", 1); err != nil {
		t.Fatal(err)
	}
	ids := make([]int, 96)
	for i := range ids {
		ids[i] = (i*53)%900 + 3
	}
	data := []Datum{textDatum(ids), textDatum(ids[:70])}
	var lp [2][][]float64
	var loss [2]float64
	var grads [2][]float64
	var pairs [2]int
	var widened [2]int64
	for k, chunk := range []int{0, 48} { // 48: chunks of 48 outputs, a last one of fewer
		e, err := Load(dir, Options{Precision: PrecisionQ4_K})
		if err != nil {
			t.Fatal(err)
		}
		e.headTile, e.pairsChunk = 64, chunk
		cfg := LoraConfig{Rank: 4, Seed: 5, TrainAttn: true, TrainMLP: true, TrainUnembed: true}
		a := adapterWithB(t, e, "m", cfg, func(i, j int) float64 { return 0.02 * math.Sin(float64(3*i+j)) })
		res, err := e.ForwardBackward(context.Background(), a.ID, data, "cross_entropy", nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range a.params {
			grads[k] = append(grads[k], p.float64s('g')...)
		}
		lp[k], loss[k] = res.Logprobs, res.Loss
		pairs[k] = cap(e.base.pairs)
		widened[k] = e.PlanTraining(2, 96, cfg).Widened
	}
	D, F, V := 256, 512, 4096
	if pairs[0] != D/2*V || pairs[1] != F/2*48 { // the largest chunk: down_proj's 48 outputs of 512 inputs
		t.Fatalf("pairs buffer of %d and %d words; want the head's %d, then one chunk's %d", pairs[0], pairs[1], D/2*V, F/2*48)
	}
	if widened[0] != 4*int64(pairs[0]) || widened[1] != 4*int64(pairs[1]) {
		t.Fatalf("the plan counts %d and %d bytes of pairs; the passes held %d and %d words", widened[0], widened[1], pairs[0], pairs[1])
	}
	if math.Abs(loss[0]-loss[1]) > 1e-5*math.Abs(loss[0]) {
		t.Fatalf("loss %v over whole weights, %v in chunks", loss[0], loss[1])
	}
	for i := range lp[0] {
		for j := range lp[0][i] {
			if d := math.Abs(lp[0][i][j] - lp[1][i][j]); d > 1e-4 {
				t.Fatalf("datum %d token %d: logprob %v over whole weights, %v in chunks", i, j, lp[0][i][j], lp[1][i][j])
			}
		}
	}
	cos, _ := compareVectors(grads[0], grads[1])
	t.Logf("loss %v / %v, gradient cosine %v", loss[0], loss[1], cos)
	if !(cos > 1-1e-6) {
		t.Fatalf("gradients in chunks: cosine %v against whole weights", cos)
	}
}
