package engine

import (
	"context"
	"errors"
	"math"
	"path/filepath"
	"strings"
	"testing"
)

// Options.GGMLActivations touches only products of quantized base weights: over float32 and
// bf16 bases the logits and the loss and gradients of a step are the same bits with it and
// without it.
func TestGGMLActivationsLeaveFloatBasesAlone(t *testing.T) {
	ids := []int{5, 77, 301, 12, 9, 410, 33, 200}
	for _, prec := range []string{PrecisionF32, PrecisionBF16} {
		t.Run(prec, func(t *testing.T) {
			var logits [2][]float64
			var loss [2]float64
			var grads [2][]float64
			for k, on := range []bool{false, true} {
				e := loadTiny(t, ArchQwen3, Options{Precision: prec, GGMLActivations: on})
				a := adapterWithB(t, e, "a", LoraConfig{Rank: 4, Seed: 2, TrainAttn: true, TrainMLP: true, TrainUnembed: true},
					func(i, j int) float64 { return 0.05 * math.Sin(float64(3*j+i)) })
				logits[k] = logitsOf(t, e, "a", ids)
				r, err := e.ForwardBackward(context.Background(), a.ID, []Datum{textDatum(ids)}, "cross_entropy", nil)
				if err != nil {
					t.Fatal(err)
				}
				loss[k] = r.Loss
				for _, q := range a.params {
					grads[k] = append(grads[k], q.float64s('g')...)
				}
			}
			if d := maxAbsDiff(logits[0], logits[1]); d != 0 {
				t.Errorf("logits move by %g with the option", d)
			}
			if loss[0] != loss[1] || maxAbsDiff(grads[0], grads[1]) != 0 {
				t.Errorf("loss %v vs %v, gradients differ by %g", loss[0], loss[1], maxAbsDiff(grads[0], grads[1]))
			}
		})
	}
}

// Over quantized bases the option is in effect (logits move, by about what llama.cpp's
// activation rounding moves them) and training with it still trains: finite gradients, the loss
// halves in 30 steps.
func TestGGMLActivationsTrain(t *testing.T) {
	for _, tc := range []struct{ prec, preset string }{{PrecisionQ8_0, "tiny"}, {PrecisionQ4_K, "tiny-quant"}, {PrecisionQ4_K_M, "tiny-quant"}} {
		t.Run(tc.prec, func(t *testing.T) {
			dir := tinyModel(t, ArchLlama)
			if tc.preset != "tiny" {
				dir = filepath.Join(t.TempDir(), "m")
				if err := InitTiny(dir, ArchLlama, tc.preset, 1); err != nil {
					t.Fatal(err)
				}
			}
			ids := make([]int, 40)
			for i := range ids {
				ids[i] = (i*29+5)%400 + 3
			}
			off, err := Load(dir, Options{Precision: tc.prec})
			if err != nil {
				t.Fatal(err)
			}
			e, err := Load(dir, Options{Precision: tc.prec, GGMLActivations: true})
			if err != nil {
				t.Fatal(err)
			}
			if d := maxAbsDiff(logitsOf(t, off, "", ids[:12]), logitsOf(t, e, "", ids[:12])); d == 0 || d > 0.5 {
				t.Errorf("the option moves the logits by %g (want more than 0, less than 0.5)", d)
			}
			a, err := e.CreateAdapter("a", LoraConfig{Rank: 8, Seed: 3, TrainAttn: true, TrainMLP: true, TrainUnembed: true})
			if err != nil {
				t.Fatal(err)
			}
			p := DefaultAdamParams()
			p.LearningRate = 1e-2
			var first, last float64
			for step := range 30 {
				r, err := e.ForwardBackward(context.Background(), "a", []Datum{textDatum(ids)}, "cross_entropy", nil)
				if err != nil {
					t.Fatal(err)
				}
				if step == 0 {
					first = r.Loss
					for _, q := range a.params {
						for _, g := range q.float64s('g') {
							if math.IsNaN(g) || math.IsInf(g, 0) {
								t.Fatalf("gradient %v", g)
							}
						}
					}
				}
				last = r.Loss
				if _, err := e.OptimStep(context.Background(), "a", p); err != nil {
					t.Fatal(err)
				}
			}
			t.Logf("%s: loss %.3f -> %.3f", tc.prec, first, last)
			if !(last < first/2) {
				t.Fatalf("loss did not halve: %.4f -> %.4f", first, last)
			}
		})
	}
}

// Under llama.cpp's rounding of activations (quantized bases), non-finite activations fail the
// request as on every other path (issue 40 item 11): a NaN adapter's forward and samples, and a
// NaN in the activations, are ErrNonFinite, not the uniform logits that rows rounded to zero
// blocks would give (logprob −ln V).
func TestGGMLActivationsRefuseNonFiniteActivations(t *testing.T) {
	for _, prec := range []string{PrecisionQ8_0, PrecisionQ4_K} {
		t.Run(prec, func(t *testing.T) {
			dir := tinyModel(t, ArchLlama)
			if prec == PrecisionQ4_K {
				dir = filepath.Join(t.TempDir(), "m")
				if err := InitTiny(dir, ArchLlama, "tiny-quant", 1); err != nil {
					t.Fatal(err)
				}
			}
			e, err := Load(dir, Options{Precision: prec, GGMLActivations: true})
			if err != nil {
				t.Fatal(err)
			}
			adapterWithB(t, e, "nan", LoraConfig{Rank: 2, TrainAttn: true, TrainMLP: true}, func(int, int) float64 { return math.NaN() })
			ids := []int{5, 9, 14, 3, 7}
			if r, err := e.Forward(context.Background(), "nan", []Datum{textDatum(ids)}, "cross_entropy", nil); err == nil || !strings.Contains(err.Error(), ErrNonFinite.Error()) {
				t.Fatalf("forward over a NaN adapter: %v (logprobs %v), want ErrNonFinite", err, r)
			}
			if _, err := e.Sample("nan", SampleRequest{Prompt: ids, Params: SampleParams{MaxTokens: 2}}); !errors.Is(err, ErrNonFinite) {
				t.Fatalf("sample over a NaN adapter: %v, want ErrNonFinite", err)
			}
		})
	}
}
