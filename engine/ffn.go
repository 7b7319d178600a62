package engine

// ffn is a decoder layer's feed-forward block: what the layer runs on the post-attention norm's
// output before adding the residual (pass.feedForward): the dense SwiGLU MLP (denseFFN), or a
// sparse mixture of experts (moeFFN, moe.go) on the layers a MoE config marks.
type ffn[E float] interface {
	// forward returns the block's output [N, D] for x [N, D], keeping in la what backward
	// reads (la nil: a forward-only pass).
	forward(s *pass[E], x mat[E], la *layerActs[E]) mat[E]
	// backward takes d loss/d(the block's output) and returns d loss/d x, adding the LoRA
	// gradients of the block's modules on the way.
	backward(s *pass[E], dy mat[E], la *layerActs[E]) mat[E]
	// linears are the block's modules (those a LoRA can adapt).
	linears() []*linear[E]
}

// denseFFN is the SwiGLU MLP of Llama and Qwen: down(silu(gate(x)) · up(x)).
type denseFFN[E float] struct {
	gate, up, down *linear[E]
}

var (
	_ ffn[float32] = denseFFN[float32]{}
	_ ffn[float64] = denseFFN[float64]{}
)

func (f denseFFN[E]) linears() []*linear[E] { return []*linear[E]{f.gate, f.up, f.down} }

// denseActs are what denseFFN's backward reads.
type denseActs[E float] struct {
	gate, up, act mat[E]
	sig           mat[E] // σ(gate)
}

func (f denseFFN[E]) forward(s *pass[E], x mat[E], la *layerActs[E]) mat[E] {
	N, F := x.Dims[0], f.gate.out // the model's MLP, or a shared expert's
	gate := s.linear(x, f.gate)
	up := s.linear(x, f.up)
	act, sig := s.op.Alloc(N, F), s.op.Alloc(N, F)
	s.op.SiluGate(gate, up, sig, act, s.e.ggmlNorms())
	out := s.linear(act, f.down)
	if la != nil {
		la.dense = denseActs[E]{gate: gate, up: up, act: act, sig: sig}
	}
	return out
}

// backward gives back the block's activations and its own temporaries as soon as each is read
// for the last time, so that attention's backward, which runs next, never holds them beside its
// own: [tokens, F] buffers, 7F a token (an 8B shape at 1024 tokens: 0.39 GB, the largest part
// of a recomputed layer). The numbers are the same; only when the memory is reused changes.
func (f denseFFN[E]) backward(s *pass[E], dy mat[E], la *layerActs[E]) mat[E] {
	N, F := dy.Dims[0], f.gate.out
	a := &la.dense
	release := s.op.ReleaseOne
	if s.e.keepFFNActs {
		release = func(mat[E]) {}
	}
	da := s.linearBack(dy, f.down, true)
	release(a.act) // down's input: its LoRA gradients are summed (loraGrads)
	dg, du := s.op.Alloc(N, F), s.op.Alloc(N, F)
	s.op.SiluGateBack(*da, a.gate, a.up, a.sig, dg, du)
	for _, m := range []mat[E]{*da, a.gate, a.up, a.sig} {
		release(m)
	}
	*a = denseActs[E]{}
	dx := s.linearBack(dg, f.gate, true)
	release(dg)
	dxUp := s.linearBack(du, f.up, true)
	release(du)
	s.op.Add(*dx, *dxUp)
	release(*dxUp)
	return *dx
}
