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
	for _, arch := range []Arch{ArchLlama, ArchQwen2, ArchQwen3} {
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
				grads[k] = append(grads[k], p.g)
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
