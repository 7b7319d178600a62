package engine

import (
	"time"

	"github.com/gomlx/compute/dtypes"
)

// MatmulGFLOPS measures an n×n×n float32 matmul on the engine's backend, through the same
// one-node executables the training pass uses (best of reps runs): the peak that training
// throughput is compared with.
func MatmulGFLOPS(n, reps int) (float64, error) {
	backend, err := sharedBackend()
	if err != nil {
		return 0, err
	}
	ar := newArena[float32](newMatmuls(backend, 0))
	defer ar.free()
	a, b := ar.alloc(n, n), ar.alloc(n, n)
	for i := range a.v {
		a.v[i] = float32(i%7) * 0.1
		b.v[i] = float32(i%5) * 0.1
	}
	if _, err := ar.mm.exec(mmKey{dtype: dtypes.Float32, m: n, k: n, n: n}); err != nil {
		return 0, err
	}
	best := time.Duration(1 << 62)
	for range reps {
		start := time.Now()
		out := ar.matmul(a, b, 0, false)
		if ar.err != nil {
			return 0, ar.err
		}
		best = min(best, time.Since(start))
		ar.releaseOne(out)
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
