package engine

import (
	"time"

	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"
)

// MatmulGFLOPS measures an n×n×n float32 matmul on the engine's backend (best of reps runs),
// the peak that training throughput is compared with.
func MatmulGFLOPS(n, reps int) (float64, error) {
	backend, err := sharedBackend()
	if err != nil {
		return 0, err
	}
	x := graph.MustNewExec(backend, func(a, b *graph.Node) *graph.Node { return graph.MatMul(a, b) })
	v := make([]float32, n*n)
	for i := range v {
		v[i] = float32(i%7) * 0.1
	}
	a := tensors.FromFlatDataAndDimensions(v, n, n)
	b := tensors.FromFlatDataAndDimensions(append([]float32(nil), v...), n, n)
	best := time.Duration(1 << 62)
	for i := 0; i < reps+1; i++ {
		start := time.Now()
		out, err := x.Call(a, b)
		if err != nil {
			return 0, err
		}
		out[0].FinalizeAll()
		if d := time.Since(start); i > 0 && d < best { // the first run compiles
			best = d
		}
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
