package engine

// mixer is a decoder layer's token mixer: what the layer runs on its input's norm before adding
// the residual (pass.layer), the one place where tokens see each other. Softmax attention
// (attentionLayer: GQA, RoPE or mRoPE, optional head norms and output gate) and Gated DeltaNet
// (deltaNetLayer: Qwen3.5's linear attention, a recurrent state per head) are its kinds; a layer
// holds one, chosen at load from the config (resolveModel), and the pass never asks which.
type mixer[E float] interface {
	// forward returns the mixer's output [N, D] for x [N, D], the normed input of layer l,
	// keeping in la what backward reads (la nil: a forward-only pass). Keys and values, or the
	// recurrent state, come from and go to the pass's store (pass.kv).
	forward(s *pass[E], l int, x mat[E], la *layerActs[E]) mat[E]
	// backward takes d loss/d(the mixer's output) and returns d loss/d x (nil when !needDX),
	// adding the LoRA gradients of its modules on the way.
	backward(s *pass[E], l int, dy mat[E], la *layerActs[E], needDX bool) *mat[E]
	// linears are the mixer's modules (those a LoRA can adapt).
	linears() []*linear[E]
}

var (
	_ mixer[float32] = (*attentionLayer[float32])(nil)
	_ mixer[float64] = (*deltaNetLayer[float64])(nil)
)
