package engine

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"testing"

	"github.com/skein-ai/skein/engine/internal/backend/cpu"
	"github.com/skein-ai/skein/engine/internal/kernels"
	"github.com/skein-ai/skein/engine/internal/quant"
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
		pairs[k] = e.base.cpu.PairsWords()
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

// The embedding of a quantized base is held in the base's blocks: the blocks of the file's rows
// quantized (byte for byte the format's quantizer over the whole tensor), each looked-up row
// their dequantized row, and a tied head multiplying by the very same blocks; the weights shrink
// by the embedding's bf16 bytes less its blocks.
func TestQuantizedEmbeddingIsBlocks(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "m")
	if err := InitTiny(dir, ArchQwen3, "tiny-quant", 1); err != nil { // tied embeddings
		t.Fatal(err)
	}
	e, err := Load(dir, Options{Precision: PrecisionQ4_K})
	if err != nil {
		t.Fatal(err)
	}
	m := modelOf[float32](e.base)
	c := e.Config
	host, _, err := loadWeights(dir, c, nil)
	if err != nil {
		t.Fatal(err)
	}
	f, err := host[c.lm()+"embed_tokens.weight"].Float32()
	if err != nil {
		t.Fatal(err)
	}
	want, err := quant.Q4_K.Quantize(f, c.HiddenSize)
	if err != nil {
		t.Fatal(err)
	}
	emb, head := cpu.Inspect(m.embed), cpu.Inspect(m.head.w)
	if emb.Format != quant.Q4_K || !bytes.Equal(emb.Blocks, want) || emb.BF16Rows != nil {
		t.Fatal("the embedding is not the Q4_K blocks of the file's rows")
	}
	if !c.TieWordEmbeddings || &head.Blocks[0] != &emb.Blocks[0] || head.Format != quant.Q4_K || m.head.in != c.HiddenSize || m.head.out != c.VocabSize {
		t.Fatal("the tied head does not multiply by the embedding's blocks")
	}
	deq := make([]float32, len(f))
	quant.Q4_K.Dequantize(deq, want)
	ar := newStep[float32](e)
	defer ar.Free()
	s := newPass(e, ar, 1, 16, passParts[float32]{})
	tokens := []int{7, 0, c.VocabSize - 1, 7}
	h := s.embed([][]int{tokens})
	D := c.HiddenSize
	for i, id := range tokens {
		if !slices.Equal(h.V[i*D:(i+1)*D], deq[id*D:(id+1)*D]) {
			t.Fatalf("token %d: looked-up row is not its dequantized row", id)
		}
	}
	embedBF16 := 2 * c.VocabSize * D
	t.Logf("q4_k weights %d bytes; the embedding %d bytes of blocks against %d in bf16", e.WeightBytes(), len(want), embedBF16)
	if len(want) > embedBF16/3 {
		t.Fatalf("the embedding's blocks take %d bytes, bf16 %d", len(want), embedBF16)
	}
}

// On a path without the bf16 GEMM, bf16 and quantized weights larger than widenChunkBytes are
// widened into float32 a chunk of outputs at a time for the float32 GEMM (widenedChunkProduct):
// the same loss, logprobs and gradients as widening each weight whole, with the step's peak
// smaller by about the head's float32 copy. Both layouts: Llama's untied head ([in, out] rows of
// bf16, widened by columns) and Qwen3's tied one ([out, in], by rows), and quantized blocks.
func TestWidenedChunksMatchWholeWeight(t *testing.T) {
	if kernels.HaveBF16GEMM() || !kernels.HaveGEMM() {
		t.Skip("weights are widened into float32 for the float32 GEMM only on a path with it and without the bf16 GEMM")
	}
	// A head (16 MB in float32) far larger than anything else a step holds, so its widening is
	// the step's peak.
	Presets["test-widen-vocab"] = Preset{Hidden: 256, Layers: 1, Heads: 4, KVHeads: 2, FFN: 512, Vocab: 16384, Context: 1024}
	defer delete(Presets, "test-widen-vocab")
	ids := make([]int, 96)
	for i := range ids {
		ids[i] = (i*53)%900 + 3
	}
	data := []Datum{textDatum(ids), textDatum(ids[:70])}
	for _, arch := range []Arch{ArchLlama, ArchQwen3} {
		dir := filepath.Join(t.TempDir(), string(arch))
		if err := InitTiny(dir, arch, "test-widen-vocab", 1); err != nil {
			t.Fatal(err)
		}
		for _, prec := range []string{PrecisionBF16, PrecisionQ4_K} {
			var lp [2][][]float64
			var loss [2]float64
			var grads [2][]float64
			var peaks [2]int
			for k, chunk := range []int{0, 48} { // 48: chunks of 48 outputs, a last one of fewer
				e, err := Load(dir, Options{Precision: prec})
				if err != nil {
					t.Fatal(err)
				}
				// Tiles of 96 rows: past the few-row kernels, which read bf16 bits unwidened.
				e.headTile, e.pairsChunk = 96, chunk
				cfg := LoraConfig{Rank: 4, Seed: 5, TrainAttn: true, TrainMLP: true, TrainUnembed: !e.Config.TieWordEmbeddings}
				a := adapterWithB(t, e, "m", cfg, func(i, j int) float64 { return 0.02 * math.Sin(float64(3*i+j)) })
				res, err := e.ForwardBackward(context.Background(), a.ID, data, "cross_entropy", nil)
				if err != nil {
					t.Fatal(err)
				}
				for _, p := range a.params {
					grads[k] = append(grads[k], p.float64s('g')...)
				}
				lp[k], loss[k], peaks[k] = res.Logprobs, res.Loss, e.PeakStepBytes()
			}
			name := fmt.Sprintf("%s %s", arch, prec)
			head := 4 * 256 * 16384 // the head in float32
			t.Logf("%s: loss %v / %v, step peak %d / %d bytes", name, loss[0], loss[1], peaks[0], peaks[1])
			if peaks[0]-peaks[1] < head/2 {
				t.Errorf("%s: the step's peak fell from %d to %d bytes in chunks; the head alone is %d in float32", name, peaks[0], peaks[1], head)
			}
			if math.Abs(loss[0]-loss[1]) > 1e-5*math.Abs(loss[0]) {
				t.Errorf("%s: loss %v over whole weights, %v in chunks", name, loss[0], loss[1])
			}
			for i := range lp[0] {
				for j := range lp[0][i] {
					if d := math.Abs(lp[0][i][j] - lp[1][i][j]); d > 1e-4 {
						t.Fatalf("%s: datum %d token %d: logprob %v over whole weights, %v in chunks", name, i, j, lp[0][i][j], lp[1][i][j])
					}
				}
			}
			if cos, _ := compareVectors(grads[0], grads[1]); !(cos > 1-1e-6) {
				t.Errorf("%s: gradients in chunks: cosine %v against whole weights", name, cos)
			}
		}
	}
}
