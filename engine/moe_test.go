package engine

import (
	"context"
	"math"
	"strings"
	"testing"
)

// isMoEArch reports the mixture-of-experts families (their tiny models use the tiny-moe preset).
func isMoEArch(a Arch) bool {
	return a == ArchQwen3MoE || a == ArchQwen3_5MoE || a == ArchQwen3_5MoEText
}

var moeArchs = []Arch{ArchQwen3MoE, ArchQwen3_5MoE}

// Every LoRA parameter of a mixture of experts — the experts' shared-outer factors (w1, w3, w2),
// the shared expert's, attention's — has the gradient finite differences give, in float64,
// through the router (frozen, but on the path to everything below it). Three tokens take 6
// expert slots of 8, so at least two experts see no token: their per-expert factors' gradients
// are exactly zero.
func TestMoEGradientsMatchFiniteDifferences(t *testing.T) {
	for _, arch := range moeArchs {
		t.Run(string(arch), func(t *testing.T) {
			e := loadTiny(t, arch, Options{Float64: true})
			checkMoEGradients(t, e, []int{5, 17, 300, 42})
		})
	}
}

func checkMoEGradients(t *testing.T, e *Engine, ids []int) {
	a := adapterWithB(t, e, "g", LoraConfig{Rank: 2, Seed: 5, TrainAttn: true, TrainMLP: true, TrainUnembed: true},
		func(i, j int) float64 { return 0.05 * math.Sin(float64(5*j+i)) })
	data := []Datum{textDatum(ids)}
	if _, err := e.ForwardBackward(context.Background(), "g", data, "cross_entropy", nil); err != nil {
		t.Fatal(err)
	}
	lossAt := func() float64 {
		r, err := e.Forward(context.Background(), "g", data, "cross_entropy", nil)
		if err != nil {
			t.Fatal(err)
		}
		return r.Loss
	}
	checked := map[string]int{}
	zeroExperts := 0
	for _, p := range a.params {
		if !strings.Contains(p.name, "layers.0.") && !strings.Contains(p.name, "layers.1.") && !strings.Contains(p.name, "lm_head") {
			continue
		}
		n := hostState(numbersOf[float64](p))
		js := []int{0, len(n.w) / 3, len(n.w) - 1}
		for _, j := range js {
			orig := n.w[j]
			const h = 1e-6
			n.w[j] = orig + h
			up := lossAt()
			n.w[j] = orig - h
			down := lossAt()
			n.w[j] = orig
			fd := (up - down) / (2 * h)
			if g := n.g[j]; math.Abs(fd-g) > 1e-6*(1+math.Abs(fd)) {
				t.Fatalf("%s elem %d: backward %.10g, finite difference %.10g", p.name, j, g, fd)
			}
		}
		checked[p.name]++
		if strings.Contains(p.name, "experts.w") && (strings.Contains(p.name, "w2.lora_A") || strings.Contains(p.name, "w1.lora_B")) {
			// Per-expert blocks of the gradient: an expert no token reached has a zero block.
			rows := len(n.g) / len(modelOf[float64](e.base).moes[0].experts)
			for b := 0; b < len(n.g); b += rows {
				zero := true
				for _, g := range n.g[b : b+rows] {
					zero = zero && g == 0
				}
				if zero {
					zeroExperts++
				}
			}
		}
	}
	for _, want := range []string{"experts.w1.lora_A", "experts.w1.lora_B", "experts.w3.lora_A", "experts.w3.lora_B",
		"experts.w2.lora_A", "experts.w2.lora_B", "q_proj.lora_A", "lm_head.lora_B", "mlp."} {
		found := false
		for name := range checked {
			found = found || strings.Contains(name, want)
		}
		if !found {
			t.Fatalf("no %s checked (%v)", want, checked)
		}
	}
	if zeroExperts < 2 {
		t.Fatalf("%d idle experts' gradient blocks are zero, want at least 2 (6 slots for 8 experts, two factors)", zeroExperts)
	}
}
