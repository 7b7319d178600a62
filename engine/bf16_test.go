package engine

import (
	"math"
	"os"
	"path/filepath"
	"reflect"
	"testing"

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
			h := bf16Of(v)
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

// Keeping base weights in bf16 changes nothing but memory: widening is exact, so a bf16 engine
// trains, computes logprobs and samples bit for bit as a float32 engine over the same
// bf16-rounded weights (LoRA added at 16 rows, merged at 64), and its weights take at most
// 1.15× the bf16 file (a float32 engine's take twice).
func TestBF16WeightsComputeAsFloat32(t *testing.T) {
	for _, arch := range []Arch{ArchLlama, ArchQwen3} {
		dir, fileSize := bf16Model(t, arch)
		type outcome struct {
			lp    [][]float64
			grads [][]float64
			seqs  []SampledSequence
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
			a := adapterWithB(t, e, "w", LoraConfig{Rank: 4, Seed: 2, TrainAttn: true, TrainMLP: true, TrainUnembed: true},
				func(i, j int) float64 { return 0.03 * math.Cos(float64(i+2*j)) })
			for _, n := range []int{17, 65} {
				ids := make([]int, n)
				for i := range ids {
					ids[i] = (i*29+5)%400 + 3
				}
				r, err := e.ForwardBackward("w", []Datum{textDatum(ids)}, "cross_entropy", nil)
				if err != nil {
					t.Fatal(err)
				}
				got[k].lp = append(got[k].lp, r.Logprobs[0])
				seed := int64(3)
				s, err := e.Sample("w", SampleRequest{Prompt: ids[:n-1], NumSamples: 2, Params: SampleParams{MaxTokens: 5, Temperature: 1, Seed: &seed}})
				if err != nil {
					t.Fatal(err)
				}
				got[k].seqs = append(got[k].seqs, s.Sequences...)
			}
			for _, p := range a.params {
				got[k].grads = append(got[k].grads, p.g)
			}
		}
		if !reflect.DeepEqual(got[0], got[1]) {
			t.Fatalf("%s: a bf16 engine computes differently from a float32 one over the same weights", arch)
		}
	}
}

func TestUnknownPrecisionIsRejected(t *testing.T) {
	if _, err := Load(tinyModel(t, ArchQwen3), Options{Precision: "fp8"}); err == nil {
		t.Fatal("precision fp8 accepted")
	}
}

// Widening is exact on every bit pattern (the 8-lane kernel as the scalar loop, NaNs included),
// and rounding to bf16 is to nearest with ties to even.
func TestBF16Conversions(t *testing.T) {
	src := make([]uint16, 1<<16+5) // a tail the lanes do not cover
	for i := range src {
		src[i] = uint16(i)
	}
	fast, slow := make([]float32, len(src)), make([]float32, len(src))
	widenBF16(fast, src)
	widenBF16Scalar(slow, src)
	for i := range src {
		if math.Float32bits(fast[i]) != math.Float32bits(slow[i]) || math.Float32bits(slow[i]) != uint32(src[i])<<16 {
			t.Fatalf("bits %#04x widened to %#08x (scalar %#08x)", src[i], math.Float32bits(fast[i]), math.Float32bits(slow[i]))
		}
	}
	for _, c := range []struct {
		f    uint32
		want uint16
	}{
		{0x3f800000, 0x3f80}, // 1
		{0x3f808000, 0x3f80}, // halfway, even below
		{0x3f818000, 0x3f82}, // halfway, even above
		{0x3f808001, 0x3f81}, // above halfway
		{0x7f7fffff, 0x7f80}, // max float rounds to +Inf
		{0x7fc00001, 0x7fc0}, // NaN stays NaN
		{0xff810000, 0xffc1}, // signalling NaN stays NaN
	} {
		if got := bf16Of(math.Float32frombits(c.f)); got != c.want {
			t.Fatalf("bf16Of(%#08x) = %#04x, want %#04x", c.f, got, c.want)
		}
	}
}
