package engine

import (
	"context"
	"math"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/skein-ai/skein/engine/internal/kernels"
	"github.com/skein-ai/skein/engine/internal/quant"
)

// A q8_0 engine holds its projections as Q8_0 blocks (about a quarter of float32's bytes), and
// computes from them what a float32 engine computes from the dequantized weights: training
// (many rows: dequantized for the GEMM) near the float32 engine's logprobs and gradients, and
// decode steps (few rows: the blocks read directly) equal to its own forward pass.
func TestQuantizedWeightsTrainAndSampleNearFloat32(t *testing.T) {
	for _, tc := range []struct {
		precision, preset string
		tol, cos          float64 // logprobs within tol of float32's; gradient cosine above cos
		smaller           int     // weights take at most 1/smaller of float32's bytes
	}{{PrecisionQ8_0, "tiny", 1e-1, 0.99, 2}, {PrecisionQ4_K, "tiny-quant", 2, 0.9, 4}} {
		for _, arch := range []Arch{ArchLlama, ArchQwen3} {
			t.Run(tc.precision+"/"+string(arch), func(t *testing.T) { quantizedCase(t, arch, tc.precision, tc.preset, tc.tol, tc.cos, tc.smaller) })
		}
	}
	// A mixture of experts: its experts and shared expert quantized, its routers kept in float32.
	// Wider bounds than a dense model's: a weight's rounding can move a token to another expert,
	// a jump rather than a drift (measured: one logprob of 40 moved 0.29 over Q8_0), and the
	// gradients of the experts it left and joined with it (cosine 0.979).
	for _, tc := range []struct {
		precision, preset string
		arch              Arch
		tol, cos          float64
		smaller           int
	}{{PrecisionQ8_0, "tiny-moe", ArchQwen3MoE, 1, 0.95, 2},
		{PrecisionQ4_K, "tiny-quant-moe", ArchQwen3MoE, 4, 0.8, 4}} {
		t.Run(tc.precision+"/"+string(tc.arch), func(t *testing.T) {
			quantizedCase(t, tc.arch, tc.precision, tc.preset, tc.tol, tc.cos, tc.smaller)
		})
	}
}

func quantizedCase(t *testing.T, arch Arch, precision, preset string, tol, minCos float64, smaller int) {
	dir := tinyModel(t, arch)
	if preset != "tiny" {
		dir = filepath.Join(t.TempDir(), "m")
		if err := InitTiny(dir, arch, preset, 1); err != nil {
			t.Fatal(err)
		}
	}
	var lp [2][][]float64
	var grads [2][]float64
	var engines [2]*Engine
	for k, prec := range []string{PrecisionF32, precision} {
		e, err := Load(dir, Options{Precision: prec})
		if err != nil {
			t.Fatal(err)
		}
		engines[k] = e
		ids := make([]int, 40)
		for i := range ids {
			ids[i] = (i*29+5)%400 + 3
		}
		a := adapterWithB(t, e, "w", LoraConfig{Rank: 4, Seed: 2, TrainAttn: true, TrainMLP: true, TrainUnembed: true},
			func(i, j int) float64 { return 0.03 * math.Cos(float64(i+2*j)) })
		r, err := e.ForwardBackward(context.Background(), a.ID, []Datum{textDatum(ids)}, "cross_entropy", nil)
		if err != nil {
			t.Fatal(err)
		}
		lp[k] = r.Logprobs
		for _, q := range a.params {
			grads[k] = append(grads[k], q.float64s('g')...)
		}
	}
	f32, q8 := engines[0], engines[1]
	if q8.WeightBytes() > f32.WeightBytes()/smaller+f32.WeightBytes()/8 { // the embedding stays float32
		t.Fatalf("%s weights take %d bytes, float32 %d", precision, q8.WeightBytes(), f32.WeightBytes())
	}
	if reflect.DeepEqual(lp[0], lp[1]) {
		t.Fatalf("the %s engine's logprobs are the float32 engine's bits: its weights were not quantized", precision)
	}
	// Logprobs near float32's: on average within tol/4, each within tol.
	var sumDiff float64
	var nDiff int
	for i := range lp[0] {
		for j, v := range lp[0][i] {
			d := math.Abs(v - lp[1][i][j])
			sumDiff, nDiff = sumDiff+d, nDiff+1
			if d > tol {
				t.Fatalf("logprob [%d][%d] %v in float32, %v over %s", i, j, v, lp[1][i][j], precision)
			}
		}
	}
	meanDiff := sumDiff / float64(nDiff)
	if meanDiff > tol/4 {
		t.Fatalf("logprobs over %s differ from float32's by %v on average", precision, meanDiff)
	}
	cos, _ := compareVectors(grads[0], grads[1])
	t.Logf("%s: weights %d bytes (float32 %d), mean |Δ logprob| %.4f, gradient cosine %.4f", precision, q8.WeightBytes(), f32.WeightBytes(), meanDiff, cos)
	if !(cos > minCos) {
		t.Fatalf("gradients over %s: cosine %v against float32", precision, cos)
	}
	// Decode steps read the blocks (few rows); the forward pass dequantizes them: the
	// sampler's logprobs of its tokens are the forward pass's (within bf16 rounding where
	// the forward runs through the bf16 GEMM).
	stol := 1e-4
	if kernels.HaveBF16GEMM() {
		stol = 3e-2
	}
	seed := int64(3)
	prompt := []int{5, 9, 14, 2}
	res, err := q8.Sample("w", SampleRequest{Prompt: prompt, NumSamples: 2, Params: SampleParams{MaxTokens: 6, Temperature: 1, TopK: -1, TopP: 1, Seed: &seed}})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range res.Sequences {
		full := append(append([]int{}, prompt...), s.Tokens...)
		fwd, err := q8.Forward(context.Background(), "w", []Datum{textDatum(full)}, "cross_entropy", nil)
		if err != nil {
			t.Fatal(err)
		}
		for j, l := range s.Logprobs {
			if d := math.Abs(l - fwd.Logprobs[0][len(prompt)-1+j]); d > stol {
				t.Fatalf("sampled token %d: logprob %v, forward %v", j, l, fwd.Logprobs[0][len(prompt)-1+j])
			}
		}
	}
}

// The few-row product over Q8_0 blocks equals the float32 product of the dequantized weight.
func TestQ8_0ProductMatchesDequantized(t *testing.T) {
	for _, sz := range [][3]int{{3, 96, 37}, {1, 32, 5}, {17, 64, 9}, {16, 512, 64}} {
		q8ProductCase(t, sz[0], sz[1], sz[2])
	}
}

func q8ProductCase(t *testing.T, R, K, N int) {
	w := make([]float32, N*K)
	x := make([]float32, R*K)
	for i := range w {
		w[i] = float32(math.Sin(float64(i)*0.37)) * 0.1
	}
	for i := range x {
		x[i] = float32(math.Cos(float64(i) * 0.11))
	}
	blocks, err := quant.QuantizeQ8_0(w, K)
	if err != nil {
		t.Fatal(err)
	}
	deq := make([]float32, N*K)
	quant.DequantizeQ8_0(deq, blocks)
	y := make([]float32, R*N)
	quant.Q8_0Product(y, x, blocks, R, K, N, kernels.ParallelRows)
	for r := range R {
		for o := range N {
			var want float64
			for k := range K {
				want += float64(x[r*K+k]) * float64(deq[o*K+k])
			}
			if d := math.Abs(float64(y[r*N+o]) - want); d > 1e-5*(1+math.Abs(want)) {
				t.Fatalf("%d×%d×%d: y[%d,%d] = %v, want %v", R, K, N, r, o, y[r*N+o], want)
			}
		}
	}
}
