package engine

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/skein-ai/skein/engine/internal/backend/cpu"
	"github.com/skein-ai/skein/engine/internal/kernels"
	"github.com/skein-ai/skein/safetensors"
)

// bf16Model writes the tiny model of arch with every weight rounded to bfloat16 and stored as
// BF16, and returns its directory and the size of its weights file.
func bf16Model(t *testing.T, arch Arch) (string, int64) {
	t.Helper()
	src := tinyModel(t, arch)
	st, err := safetensors.ReadFile(filepath.Join(src, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]safetensors.Tensor{}
	for name, tn := range st.Tensors {
		f, _ := tn.Float32()
		b := make([]byte, 2*len(f))
		for i, v := range f {
			h := kernels.BF16Of(v)
			b[2*i], b[2*i+1] = byte(h), byte(h>>8)
		}
		out[name] = safetensors.Tensor{DType: "BF16", Shape: tn.Shape, Data: b}
	}
	dir := t.TempDir()
	for _, f := range []string{"config.json", "tokenizer.json"} {
		b, _ := os.ReadFile(filepath.Join(src, f))
		_ = os.WriteFile(filepath.Join(dir, f), b, 0o644)
	}
	path := filepath.Join(dir, "model.safetensors")
	if err := safetensors.WriteFile(path, out, nil); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return dir, fi.Size()
}

// Keeping base weights in bf16 changes memory and the summation order of few-row products, not
// the results. Products of more than kernels.FewRowsBF16() rows widen the weight exactly for the same
// backend matmul, so a bf16 engine trains and computes logprobs over those bit for bit as a
// float32 engine over the same bf16-rounded weights (LoRA merged: 65 tokens). Fewer rows read
// the bf16 bits directly and sum in another order: training over 12 tokens (few rows on every path) (LoRA added), its
// gradients and the sampler (prefill and decode steps) agree to 1e-5 relative, and the sampled
// tokens are the same. (Over the tiny model's short products they happen to match exactly: the
// backend sums those in the same order. On real shapes they differ in the last bits.) Its weights take at most 1.15× the bf16 file (a float32 engine's twice).
func TestBF16WeightsComputeAsFloat32(t *testing.T) {
	if kernels.HaveBF16GEMM() { // its products round the rows to bf16: TestBF16GEMMTrainsNearFloat32
		onPath(t, kernels.AVX512)
	}
	const tol = 1e-5
	near := func(a, b float64) bool { return math.Abs(a-b) <= tol*math.Max(1, math.Max(math.Abs(a), math.Abs(b))) }
	for _, arch := range []Arch{ArchLlama, ArchQwen3} {
		dir, fileSize := bf16Model(t, arch)
		type outcome struct {
			lp, grads [2][][]float64 // by sequence length: few rows, many rows
			seqs      []SampledSequence
		}
		var got [2]outcome
		for k, prec := range []string{PrecisionF32, PrecisionBF16} {
			e, err := Load(dir, Options{Precision: prec})
			if err != nil {
				t.Fatal(err)
			}
			wb := float64(e.WeightBytes())
			if prec == PrecisionBF16 && wb > 1.15*float64(fileSize) || prec == PrecisionF32 && wb < 1.9*float64(fileSize) {
				t.Fatalf("%s %s: weights take %.0f bytes, file %d", arch, prec, wb, fileSize)
			}
			for i, n := range []int{12, kernels.FewRowsBF16() + 1} {
				ids := make([]int, n+1)
				for i := range ids {
					ids[i] = (i*29+5)%400 + 3
				}
				// A fresh adapter per length, so that each length's gradients are its own.
				a := adapterWithB(t, e, fmt.Sprint("w", n), LoraConfig{Rank: 4, Seed: 2, TrainAttn: true, TrainMLP: true, TrainUnembed: true},
					func(i, j int) float64 { return 0.03 * math.Cos(float64(i+2*j)) })
				r, err := e.ForwardBackward(context.Background(), a.ID, []Datum{textDatum(ids)}, "cross_entropy", nil)
				if err != nil {
					t.Fatal(err)
				}
				got[k].lp[i] = r.Logprobs
				for _, p := range a.params {
					got[k].grads[i] = append(got[k].grads[i], p.float64s('g'))
				}
				seed := int64(3)
				s, err := e.Sample(a.ID, SampleRequest{Prompt: ids[:n-1], NumSamples: 2, Params: SampleParams{MaxTokens: 5, Temperature: 1, Seed: &seed}})
				if err != nil {
					t.Fatal(err)
				}
				got[k].seqs = append(got[k].seqs, s.Sequences...)
			}
		}
		f32, b16 := got[0], got[1]
		if !reflect.DeepEqual(f32.lp[1], b16.lp[1]) || !reflect.DeepEqual(f32.grads[1], b16.grads[1]) {
			t.Fatalf("%s: over %d rows a bf16 engine trains differently from a float32 one over the same weights", arch, kernels.FewRowsBF16()+1)
		}
		for _, vs := range [][2][][]float64{{f32.lp[0], b16.lp[0]}, {f32.grads[0], b16.grads[0]}} {
			for i := range vs[0] {
				for j, v := range vs[0][i] {
					if !near(v, vs[1][i][j]) {
						t.Fatalf("%s, 12 rows: %v in float32, %v in bf16 ([%d][%d])", arch, v, vs[1][i][j], i, j)
					}
				}
			}
		}
		for i, s := range f32.seqs {
			if !reflect.DeepEqual(s.Tokens, b16.seqs[i].Tokens) {
				t.Fatalf("%s: sample %d is %v in float32, %v in bf16", arch, i, s.Tokens, b16.seqs[i].Tokens)
			}
			for j, lp := range s.Logprobs {
				if !near(lp, b16.seqs[i].Logprobs[j]) {
					t.Fatalf("%s: sample %d token %d logprob %v in float32, %v in bf16", arch, i, j, lp, b16.seqs[i].Logprobs[j])
				}
			}
		}
	}
}

// A bf16 engine's sampling steps (a prefill of 3×16 tokens, decode steps of 3 rows) read the
// bf16 weights where they are: no step holds a widened copy of any weight, so the steps' peak
// is a float32 engine's.
func TestBF16FewRowStepsHoldNoWidenedWeight(t *testing.T) {
	if !kernels.FewRowKernels() {
		t.Skip("no direct bf16 kernel on this machine: every product widens")
	}
	dir, _ := bf16Model(t, ArchQwen3)
	var peaks [2]int
	for k, prec := range []string{PrecisionF32, PrecisionBF16} {
		e, err := Load(dir, Options{Precision: prec})
		if err != nil {
			t.Fatal(err)
		}
		prompt := make([]int, 16)
		for i := range prompt {
			prompt[i] = (i*31)%400 + 3
		}
		seed := int64(1)
		if _, err := e.Sample("", SampleRequest{Prompt: prompt, NumSamples: 3, Params: SampleParams{MaxTokens: 4, Temperature: 1, Seed: &seed}}); err != nil {
			t.Fatal(err)
		}
		peaks[k] = e.PeakStepBytes()
	}
	if peaks[1] != peaks[0] {
		t.Fatalf("sampling steps held %d bytes in bf16, %d in float32", peaks[1], peaks[0])
	}
}

func TestUnknownPrecisionIsRejected(t *testing.T) {
	if _, err := Load(tinyModel(t, ArchQwen3), Options{Precision: "fp8"}); err == nil {
		t.Fatal("precision fp8 accepted")
	}
}

// onPath runs the rest of the test with every kernel on path p, or skips it with "CPU lacks p".
// Tests that call it must not run in parallel.
func onPath(t testing.TB, p kernels.Path) {
	t.Helper()
	undo, err := kernels.Use(p)
	if err != nil {
		t.Skipf("CPU lacks %s", p)
	}
	t.Cleanup(undo)
}

// On a path with a bf16 GEMM, a bf16 engine's products over its bf16 weights round the rows to
// bf16 too (PyTorch's bf16 autocast), LoRA added in float32: over 65 rows its logprobs stay within
// 2e-2 of a float32 engine's over the same weights, and its LoRA gradients point the same way
// (cosine > 0.99, norms within 5%). Every path the CPU has is tried; those it lacks are skipped.
func TestBF16GEMMTrainsNearFloat32(t *testing.T) {
	for _, p := range []kernels.Path{kernels.AVX512BF16, kernels.AMX} {
		t.Run(p.String(), func(t *testing.T) {
			onPath(t, p)
			for _, arch := range []Arch{ArchLlama, ArchQwen3} {
				dir, _ := bf16Model(t, arch)
				var lp [2][][]float64
				var grads [2][]float64
				for k, prec := range []string{PrecisionF32, PrecisionBF16} {
					e, err := Load(dir, Options{Precision: prec})
					if err != nil {
						t.Fatal(err)
					}
					ids := make([]int, kernels.FewRowsBF16()+2)
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
				if reflect.DeepEqual(lp[0], lp[1]) {
					t.Fatalf("%s: the bf16 engine's logprobs are the float32 engine's bits: its products did not run in bf16", arch)
				}
				for i := range lp[0] {
					for j, v := range lp[0][i] {
						if d := math.Abs(v - lp[1][i][j]); d > 2e-2 {
							t.Fatalf("%s: logprob [%d][%d] %v in float32, %v through the bf16 GEMM", arch, i, j, v, lp[1][i][j])
						}
					}
				}
				cos, ratio := compareVectors(grads[0], grads[1])
				t.Logf("%s: gradient cosine %.5f, norm ratio %.4f", arch, cos, ratio)
				if !(cos > 0.99) || math.Abs(ratio-1) > 0.05 {
					t.Fatalf("%s: gradients through the bf16 GEMM: cosine %v, norm ratio %v against float32", arch, cos, ratio)
				}
			}
		})
	}
}

// A bf16 engine loaded on a path with the bf16 unit keeps its linear weights as pairs of rows
// (the same bytes as rows); on another path it computes from them exactly what an engine loaded
// there computes from rows: training over many rows and few, and sampling.
func TestBF16PairsLayoutGivesTheRowsResults(t *testing.T) {
	onPath(t, kernels.AVX512BF16)
	dir, fileSize := bf16Model(t, ArchQwen3)
	paired, err := Load(dir, Options{Precision: PrecisionBF16})
	if err != nil {
		t.Fatal(err)
	}
	if m := modelOf[float32](paired.base); cpu.Inspect(m.byPath["model.layers.0.self_attn.q_proj"].w).Pairs == nil || cpu.Inspect(m.byPath["model.layers.0.self_attn.q_proj"].w).BF16Rows != nil {
		t.Fatal("the engine loaded on the bf16 path did not keep its weights as pairs")
	}
	if wb := float64(paired.WeightBytes()); wb > 1.15*float64(fileSize) {
		t.Fatalf("pairs take %.0f bytes, file %d", wb, fileSize)
	}
	undo, err := kernels.Use(kernels.AVX512)
	if err != nil {
		t.Skip("CPU lacks avx512")
	}
	defer undo()
	rows, err := Load(dir, Options{Precision: PrecisionBF16})
	if err != nil {
		t.Fatal(err)
	}
	run := func(e *Engine) ([][]float64, []SampledSequence) {
		var lps [][]float64
		for _, n := range []int{9, 80} {
			ids := make([]int, n)
			for i := range ids {
				ids[i] = (i*13+7)%400 + 3
			}
			a := adapterWithB(t, e, fmt.Sprint("p", n), LoraConfig{Rank: 4, Seed: 2, TrainAttn: true, TrainMLP: true},
				func(i, j int) float64 { return 0.02 * math.Sin(float64(i+j)) })
			r, err := e.ForwardBackward(context.Background(), a.ID, []Datum{textDatum(ids)}, "cross_entropy", nil)
			if err != nil {
				t.Fatal(err)
			}
			lps = append(lps, r.Logprobs...)
			for _, q := range a.params {
				lps = append(lps, q.float64s('g'))
			}
		}
		seed := int64(5)
		s, err := e.Sample("p9", SampleRequest{Prompt: []int{3, 4, 5}, NumSamples: 2, Params: SampleParams{MaxTokens: 4, Temperature: 1, Seed: &seed}})
		if err != nil {
			t.Fatal(err)
		}
		return lps, s.Sequences
	}
	lpA, sA := run(paired)
	lpB, sB := run(rows)
	if !reflect.DeepEqual(lpA, lpB) || !reflect.DeepEqual(sA, sB) {
		t.Fatal("on the avx512 path, weights kept as pairs give other results than weights kept as rows")
	}
}

// compareVectors is the cosine between a and b and the ratio of b's norm to a's.
func compareVectors(a, b []float64) (cos, ratio float64) {
	var dot, na, nb float64
	for i := range a {
		dot += a[i] * b[i]
		na += a[i] * a[i]
		nb += b[i] * b[i]
	}
	return dot / math.Sqrt(na*nb), math.Sqrt(nb / na)
}
