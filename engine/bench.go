package engine

import (
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/skein-ai/skein/engine/internal/tensor"
)

// MatmulGFLOPS measures an n×n×n float32 matmul on the engine's backend, through the same
// one-node executables the training pass uses (best of reps runs): the peak that training
// throughput is compared with.
func MatmulGFLOPS(n, reps int) (float64, error) {
	mm, err := tensor.NewMatmuls(0)
	if err != nil {
		return 0, err
	}
	ar := tensor.NewArena[float32](mm)
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
		if ar.Err != nil {
			return 0, ar.Err
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
