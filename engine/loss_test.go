package engine

import (
	"context"
	"math"
	"testing"
)

func TestTokenLossGradients(t *testing.T) {
	for _, kind := range []string{lossCrossEntropy, lossImportance, lossPPO, lossDRO} {
		for _, q := range []float64{-2.5, -2, -1.5} {
			for _, adv := range []float64{-0.7, 0.9} {
				lp := -2.0
				_, g := tokenLossGrad(kind, lp, 0.8, q, adv, 0.8, 1.2, 0.3)
				const h = 1e-6
				up, _ := tokenLossGrad(kind, lp+h, 0.8, q, adv, 0.8, 1.2, 0.3)
				down, _ := tokenLossGrad(kind, lp-h, 0.8, q, adv, 0.8, 1.2, 0.3)
				if fd := (up - down) / (2 * h); math.Abs(fd-g) > 1e-6 {
					t.Fatalf("%s q=%v adv=%v: derivative %v, finite difference %v", kind, q, adv, g, fd)
				}
			}
		}
	}
	for _, q := range []float64{-2.5, -2, -1} {
		r := min(max(math.Exp(-2-q), 0.8), 1.2)
		if _, g := tokenLossGrad(lossCISPO, -2, 1, q, 0.9, 0.8, 1.2, 0); math.Abs(g+r*0.9) > 1e-12 {
			t.Fatalf("cispo q=%v: derivative %v, want %v", q, g, -r*0.9)
		}
	}
}

func TestFloat32GradientsMatchFloat64(t *testing.T) {
	for _, arch := range []Arch{ArchLlama, ArchQwen2, ArchQwen3, ArchQwen3_5, ArchQwen3MoE, ArchQwen3_5MoE} {
		var grads [2][][]float64
		var lps [2][]float64
		for k, f64 := range []bool{false, true} {
			e := loadTiny(t, arch, Options{Float64: f64})
			ids := e.Tokenizer.Encode("Sixteen lanes or one, the gradient is the same.")
			a := adapterWithB(t, e, "g", LoraConfig{Rank: 20, Seed: 3, TrainAttn: true, TrainMLP: true, TrainUnembed: true}, func(i, j int) float64 { return 0.03 * math.Sin(float64(5*j+i)) })
			r, err := e.ForwardBackward(context.Background(), "g", []Datum{textDatum(ids), textDatum(ids[2:])}, "cross_entropy", nil)
			if err != nil {
				t.Fatal(err)
			}
			lps[k] = r.Logprobs[0]
			for _, p := range a.params {
				grads[k] = append(grads[k], p.float64s('g'))
			}
		}
		for i, v := range lps[1] {
			if math.Abs(lps[0][i]-v) > 1e-4 {
				t.Fatalf("%s: logprob %d float32 %v, float64 %v", arch, i, lps[0][i], v)
			}
		}
		for i := range grads[1] {
			var scale float64
			for _, v := range grads[1][i] {
				scale = math.Max(scale, math.Abs(v))
			}
			for j, v := range grads[1][i] {
				if math.Abs(grads[0][i][j]-v) > 1e-3*scale+1e-7 {
					t.Fatalf("%s: gradient %d[%d] float32 %v, float64 %v (largest %v)", arch, i, j, grads[0][i][j], v, scale)
				}
			}
		}
	}
}

// cookbookRLDatum is an RL datum as the tinker-cookbook builds it: the first prompt positions
// padded with target promptTarget, sampling logprob 0 and advantage 0, the rest sampled.
func cookbookRLDatum(ids []int, prompt int, promptTarget float64) Datum {
	d := rlDatum(ids, -6.0, 0.4)
	tg := append([]float64(nil), d.Inputs["target_tokens"].Data...)
	lp := d.Inputs["logprobs"].Data
	adv := d.Inputs["advantages"].Data
	for t := range prompt {
		tg[t], lp[t], adv[t] = promptTarget, 0, 0
	}
	d.Inputs["target_tokens"] = TensorInput{DType: "int64", Data: tg}
	return d
}

// dro trains only the sampled positions: prompt padding (sampling logprob 0, advantage 0) adds
// no loss and no gradient, so what the padding's targets are changes nothing.
func TestDROIgnoresPromptPadding(t *testing.T) {
	e := loadTiny(t, ArchQwen3, Options{Float64: true})
	ids := e.Tokenizer.Encode("It's a fine day, isn't it?")
	const prompt = 4
	grads := func(promptTarget float64) ([][]float64, *ForwardResult) {
		id := "dro-pad"
		e.DeleteAdapter(context.Background(), id)
		a := adapterWithB(t, e, id, LoraConfig{Rank: 2, Seed: 3, TrainAttn: true, TrainMLP: true, TrainUnembed: true}, func(i, j int) float64 { return 0.05 * math.Sin(float64(7*j+i)) })
		res, err := e.ForwardBackward(context.Background(), id, []Datum{cookbookRLDatum(ids, prompt, promptTarget)}, "dro", map[string]float64{"beta": 0.3})
		if err != nil {
			t.Fatal(err)
		}
		var out [][]float64
		for _, p := range a.params {
			out = append(out, append([]float64(nil), p.float64s('g')...))
		}
		return out, res
	}
	g0, res := grads(0)
	for pos := range prompt {
		if res.Losses[0][pos] != 0 {
			t.Fatalf("prompt position %d has loss %v, want 0", pos, res.Losses[0][pos])
		}
	}
	if res.Losses[0][prompt] == 0 {
		t.Fatalf("sampled position %d has no loss", prompt)
	}
	g5, _ := grads(5)
	for i := range g0 {
		for j := range g0[i] {
			if g0[i][j] != g5[i][j] {
				t.Fatalf("param %d elem %d: gradient %v with prompt targets 0, %v with 5", i, j, g0[i][j], g5[i][j])
			}
		}
	}
}

// An explicit mask decides alone which positions dro trains: masking a sampled position drops
// its loss, and a mask of the wrong length is refused.
func TestDROMask(t *testing.T) {
	e := loadTiny(t, ArchQwen3, Options{Float64: true})
	ids := e.Tokenizer.Encode("It's a fine day")
	d := rlDatum(ids, -6.0, 0.4)
	n := len(d.Tokens)
	mask := make([]float64, n)
	mask[n-1] = 1
	d.Inputs["mask"] = TensorInput{DType: "float32", Data: mask}
	res, err := e.Forward(context.Background(), "", []Datum{d}, "dro", nil)
	if err != nil {
		t.Fatal(err)
	}
	for pos := range n - 1 {
		if res.Losses[0][pos] != 0 {
			t.Fatalf("masked position %d has loss %v", pos, res.Losses[0][pos])
		}
	}
	if res.Losses[0][n-1] == 0 {
		t.Fatal("the unmasked position has no loss")
	}
	d.Inputs["mask"] = TensorInput{DType: "float32", Data: mask[:n-1]}
	if _, err := e.Forward(context.Background(), "", []Datum{d}, "dro", nil); err == nil {
		t.Fatal("a mask of the wrong length was accepted")
	}
	d.Inputs["mask"] = TensorInput{DType: "float32", Data: append(mask[:n-1:n-1], 0.5)}
	if _, err := e.Forward(context.Background(), "", []Datum{d}, "dro", nil); err == nil {
		t.Fatal("a mask value other than 0 or 1 was accepted")
	}
}
