package engine

import (
	"context"
	"math"
	"testing"
)

// solidImage is the pixel_values of one image of grid g filled with colour rgb (0…1 per
// channel), normalised as the tiny model's processor does (mean 0.5, std 0.5), with a little
// deterministic noise.
func solidImage(c *Config, g [3]int, rgb [3]float64, seed int) []float64 {
	v := c.VisionConfig
	per := v.TemporalPatchSize * v.PatchSize * v.PatchSize
	n := g[0] * g[1] * g[2]
	out := make([]float64, n*v.patchDim())
	for i := range n {
		for ch := range v.InChannels {
			for k := range per {
				noise := 0.05 * math.Sin(float64(seed*7919+i*131+ch*17+k))
				out[(i*v.InChannels+ch)*per+k] = float64(float32((rgb[ch] + noise - 0.5) / 0.5))
			}
		}
	}
	return out
}

// The image matters: a LoRA adapter on the LM, trained a few dozen steps to answer one token
// for red images and another for blue ones, answers right for red and blue images of grid
// sizes it never saw (greedy sampling, the vision tower frozen).
func TestQwen3VLLearnsImageColour(t *testing.T) {
	e := loadTiny(t, ArchQwen3VL, Options{})
	c := e.Config
	vs, ve, pad := *c.VisionStartTokenID, *c.VisionEndTokenID, *c.ImageTokenID
	question := e.Tokenizer.Encode(" What colour is it?")
	answers := map[string]int{"red": e.Tokenizer.Encode(" red")[0], "blue": e.Tokenizer.Encode(" blue")[0]}
	colours := map[string][3]float64{"red": {1, 0, 0}, "blue": {0, 0, 1}}
	m := c.VisionConfig.SpatialMergeSize
	prompt := func(g [3]int) []int {
		p := []int{vs}
		for range g[1] / m * (g[2] / m) {
			p = append(p, pad)
		}
		return append(append(p, ve), question...)
	}
	var batch []Datum
	for k, g := range [][3]int{{1, 4, 4}, {1, 4, 6}, {1, 6, 2}} {
		for name, rgb := range colours {
			p := prompt(g)
			toks := append(append([]int(nil), p...), answers[name])
			n := len(toks)
			tg, w := make([]float64, n), make([]float64, n)
			tg[n-2], w[n-2] = float64(answers[name]), 1
			in := imageInputs(c, &Images{Grids: [][3]int{g}, PixelValues: solidImage(c, g, rgb, k)})
			in["target_tokens"] = TensorInput{DType: "int64", Data: tg}
			in["weights"] = TensorInput{DType: "float32", Data: w}
			batch = append(batch, Datum{Tokens: toks, Inputs: in})
		}
	}
	if _, err := e.CreateAdapter("colour", LoraConfig{Rank: 8, Seed: 2, TrainAttn: true, TrainMLP: true, TrainUnembed: true}); err != nil {
		t.Fatal(err)
	}
	p := DefaultAdamParams()
	p.LearningRate = 1e-2
	var loss float64
	for range 40 {
		r, err := e.ForwardBackward(context.Background(), "colour", batch, "cross_entropy", nil)
		if err != nil {
			t.Fatal(err)
		}
		loss = r.Loss / float64(len(batch))
		if _, err := e.OptimStep(context.Background(), "colour", p); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("final loss per datum %.4f, answers %v", loss, answers)
	for k, g := range [][3]int{{1, 2, 8}, {1, 6, 6}, {1, 8, 4}} {
		for name, rgb := range colours {
			im := &Images{Grids: [][3]int{g}, PixelValues: solidImage(c, g, rgb, 100+k)}
			res, err := e.Sample("colour", SampleRequest{Prompt: prompt(g), Images: im, Params: SampleParams{MaxTokens: 1}})
			if err != nil {
				t.Fatal(err)
			}
			if got := res.Sequences[0].Tokens[0]; got != answers[name] {
				t.Errorf("grid %v, %s image: answered token %d, want %d", g, name, got, answers[name])
			}
		}
	}
}
