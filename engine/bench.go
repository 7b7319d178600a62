package engine

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/skein-ai/skein/engine/internal/backend"
	"github.com/skein-ai/skein/engine/internal/backend/cpu"
)

// MatmulGFLOPS measures an n×n×n float32 matmul on the engine's backend, through the same
// one-node executables the training pass uses (best of reps runs): the peak that training
// throughput is compared with.
func MatmulGFLOPS(n, reps int) (float64, error) {
	cb, err := cpu.New(0)
	if err != nil {
		return 0, err
	}
	ar := cpu.NewStep[float32](cb, backend.StepOptions{})
	defer ar.Free()
	a, b := ar.Alloc(n, n), ar.Alloc(n, n)
	for i := range a.V {
		a.V[i] = float32(i%7) * 0.1
		b.V[i] = float32(i%5) * 0.1
	}
	ar.ReleaseOne(ar.MatMul(a, b, 0, false)) // compiled (backend) or warmed up, untimed
	best := time.Duration(1 << 62)
	for range reps {
		start := time.Now()
		out := ar.MatMul(a, b, 0, false)
		if ar.Err() != nil {
			return 0, ar.Err()
		}
		best = min(best, time.Since(start))
		ar.ReleaseOne(out)
	}
	return 2 * float64(n) * float64(n) * float64(n) / best.Seconds() / 1e9, nil
}

// TrainFLOPs estimates the floating-point work of one forward_backward over `tokens` tokens in
// sequences of length seq: the forward pass plus the activation gradients (frozen base weights
// get no weight gradient), i.e. about twice the forward. LoRA's own small matmuls are left out.
func (c *Config) TrainFLOPs(tokens, seq int) float64 {
	D, F, hd := float64(c.HiddenSize), float64(c.IntermediateSize), float64(c.HeadDim)
	H, KV := float64(c.NumAttentionHeads), float64(c.NumKeyValueHeads)
	perTokenLinear := 2 * (D*H*hd + 2*D*KV*hd + H*hd*D + 3*D*F)
	attn := 2 * 2 * float64(seq) * H * hd // scores and weighted sum over seq keys
	fwd := float64(tokens) * (float64(c.NumHiddenLayers)*(perTokenLinear+attn) + 2*D*float64(c.VocabSize))
	return 2 * fwd
}

// maxBenchImageSide bounds BenchImage's side in pixels, so that a flag cannot ask for an
// allocation beyond any real image processor's output.
const maxBenchImageSide = 4096

// BenchImage is one synthetic image of about side×side pixels as the vision tower takes it: its
// grid (the side in patches, rounded down to whole merge blocks) and its pixel_values rows
// [patches, C·T·P·P], deterministic values in [-1, 1] like a normalised processor's output.
func BenchImage(v *VisionConfig, side int) (Images, error) {
	if v == nil {
		return Images{}, fmt.Errorf("engine: a bench image for a model without a vision tower")
	}
	unit := v.PatchSize * v.SpatialMergeSize
	if unit < 1 || side < unit || side > maxBenchImageSide {
		return Images{}, fmt.Errorf("engine: bench image side %d: want %d…%d pixels (one merge block of patches at least)", side, unit, maxBenchImageSide)
	}
	s := side / unit * v.SpatialMergeSize
	grid := [3]int{1, s, s}
	px := make([]float64, s*s*v.patchDim())
	for i := range px {
		px[i] = float64(float32(math.Sin(float64(i) * 0.37)))
	}
	return Images{PixelValues: px, Grids: [][3]int{grid}}, nil
}

// VisionImagesPerSecond times the vision tower alone, as a pass with images runs it (frozen,
// once per image): n copies of img, after one untimed run that compiles the tower's matmuls.
func (e *Engine) VisionImagesPerSecond(img Images, n int) (float64, error) {
	if n < 1 {
		return 0, fmt.Errorf("engine: %d images to time, want at least 1", n)
	}
	c := e.Config
	if c.VisionConfig == nil || c.ImageTokenID == nil {
		return 0, fmt.Errorf("engine: %s has no vision tower", c.Arch)
	}
	// The image is checked as a sequence of exactly its pad tokens would be, so the tower
	// never slices past its pixels.
	tokens := 0
	for _, g := range img.Grids {
		if g[0] < 1 || g[1] < 1 || g[2] < 1 || g[1] > maxBenchImageSide || g[2] > maxBenchImageSide {
			return 0, fmt.Errorf("engine: bench image grid %v", g)
		}
		tokens += g[0] * (g[1] / c.VisionConfig.SpatialMergeSize) * (g[2] / c.VisionConfig.SpatialMergeSize)
	}
	pads := slices.Repeat([]int{*c.ImageTokenID}, tokens)
	if err := checkImages(c, 0, pads, &img, ""); err != nil {
		return 0, err
	}
	if _, err := e.encodeImages([]*Images{&img}); err != nil {
		return 0, err
	}
	seqs := make([]*Images, n)
	for i := range seqs {
		seqs[i] = &img
	}
	start := time.Now()
	if _, err := e.encodeImages(seqs); err != nil {
		return 0, err
	}
	return float64(n) / time.Since(start).Seconds(), nil
}

// SyntheticStories is a small generated corpus of n short stories in the manner of TinyStories
// (the data of llama2.c's stories260K model): a few templates over small word lists, drawn from
// seed, so that a LoRA has regularities to learn (names recur within a story, places and deeds
// follow their characters). Deterministic for a seed.
func SyntheticStories(n int, seed uint64) string {
	rng := rand.New(rand.NewPCG(seed, 0x570))
	pick := func(w []string) string { return w[rng.IntN(len(w))] }
	names := []string{"Lily", "Tom", "Mia", "Ben", "Sue", "Max", "Anna", "Sam"}
	animals := []string{"cat", "dog", "bird", "frog", "bunny", "duck"}
	places := []string{"park", "garden", "forest", "house", "pond", "hill"}
	things := []string{"ball", "kite", "box", "hat", "cake", "book"}
	feel := []string{"happy", "sad", "tired", "brave", "kind"}
	var b strings.Builder
	for range max(0, n) {
		name, friend, animal := pick(names), pick(names), pick(animals)
		place, thing, mood := pick(places), pick(things), pick(feel)
		fmt.Fprintf(&b, "Once upon a time, there was a little %s named %s. %s liked to play in the %s. ", animal, name, name, place)
		fmt.Fprintf(&b, "One day, %s found a %s in the %s. %s was very %s. ", name, thing, place, name, mood)
		fmt.Fprintf(&b, "%s met %s and said, \"Look at my %s!\" %s smiled and they played with the %s all day. ", name, friend, thing, friend, thing)
		fmt.Fprintf(&b, "At night, %s went home and slept. The end.\n", name)
	}
	return b.String()
}

// maxCurveSteps bounds LossCurve's steps, batch and sequence length (its callers are tests and
// benchmarks; a flag or a caller's number never becomes an unbounded loop or allocation).
const maxCurveSteps = 10000

// LossCurve trains a fresh LoRA of cfg on ids for steps optim_steps of batch windows of seq+1
// tokens each (window i of step s starts at ((s·batch + i)·seq) mod (len(ids) − seq − 1), so
// every engine gets the same data in the same order), and returns each step's mean loss per
// token, measured by its forward_backward before the step, and the trained LoRA's mean loss per
// token over held (consecutive windows of seq+1, forward only; 0 when held is shorter than one):
// one batch's loss is noisy, a fixed held-out set's is what a comparison of bases wants. The
// adapter is deleted afterwards.
func (e *Engine) LossCurve(ids, held []int, cfg LoraConfig, adam AdamParams, batch, seq, steps int) ([]float64, float64, error) {
	switch {
	case steps < 1 || steps > maxCurveSteps || batch < 1 || batch > maxCurveSteps || seq < 1 || seq > maxCurveSteps:
		return nil, 0, fmt.Errorf("engine: loss curve of %d steps of %d × %d tokens: want each in 1…%d", steps, batch, seq, maxCurveSteps)
	case len(ids) < seq+2:
		return nil, 0, fmt.Errorf("engine: loss curve over %d tokens: want more than a window of %d", len(ids), seq+1)
	}
	id := fmt.Sprintf("loss-curve-%d", rand.Uint64())
	if _, err := e.CreateAdapter(id, cfg); err != nil {
		return nil, 0, err
	}
	defer e.DeleteAdapter(context.Background(), id)
	span := len(ids) - seq - 1
	curve := make([]float64, steps)
	for s := range steps {
		data := make([]Datum, batch)
		for i := range data {
			start := ((s*batch + i) * seq) % span
			data[i] = curveDatum(ids[start : start+seq+1])
		}
		r, err := e.ForwardBackward(context.Background(), id, data, "cross_entropy", nil)
		if err != nil {
			return nil, 0, err
		}
		curve[s] = r.Loss / float64(batch*seq)
		if _, err := e.OptimStep(context.Background(), id, adam); err != nil {
			return nil, 0, err
		}
	}
	var data []Datum
	for start := 0; start+seq+1 <= len(held) && len(data) < maxCurveSteps; start += seq + 1 {
		data = append(data, curveDatum(held[start:start+seq+1]))
	}
	if len(data) == 0 {
		return curve, 0, nil
	}
	var heldLoss float64
	for lo := 0; lo < len(data); lo += batch { // batches of the training's size
		r, err := e.Forward(context.Background(), id, data[lo:min(lo+batch, len(data))], "cross_entropy", nil)
		if err != nil {
			return nil, 0, err
		}
		heldLoss += r.Loss
	}
	return curve, heldLoss / float64(len(data)*seq), nil
}

// curveDatum is a window of seq+1 tokens as a datum: the first seq tokens in, each next one its
// target.
func curveDatum(w []int) Datum {
	tg := make([]float64, len(w)-1)
	for j := range tg {
		tg[j] = float64(w[j+1])
	}
	return Datum{Tokens: w[:len(w)-1], Inputs: map[string]TensorInput{"target_tokens": {DType: "int64", Data: tg}}}
}
