package engine

import (
	"fmt"
	"math"

	"github.com/gomlx/compute/dtypes"
	. "github.com/gomlx/gomlx/core/graph" //nolint:revive // graph code reads better unqualified
)

// loraSpec says which linear layers carry LoRA; it decides the graph's structure.
// The rank only changes input shapes, so it is not part of the spec.
type loraSpec struct {
	Attn, MLP, Unembed bool
}

func (s loraSpec) any() bool { return s.Attn || s.MLP || s.Unembed }

// loraModule is one adapted linear layer: HF module path and its dimensions.
type loraModule struct {
	Path    string // e.g. "model.layers.0.self_attn.q_proj", or "lm_head"
	In, Out int
}

// modules lists the adapted layers of a spec, in graph-input order.
func (c *Config) loraModules(s loraSpec) []loraModule {
	D, F, hd := c.HiddenSize, c.IntermediateSize, c.HeadDim
	qd, kvd := c.NumAttentionHeads*hd, c.NumKeyValueHeads*hd
	var mods []loraModule
	for l := range c.NumHiddenLayers {
		p := fmt.Sprintf("model.layers.%d.", l)
		if s.Attn {
			mods = append(mods,
				loraModule{p + "self_attn.q_proj", D, qd},
				loraModule{p + "self_attn.k_proj", D, kvd},
				loraModule{p + "self_attn.v_proj", D, kvd},
				loraModule{p + "self_attn.o_proj", qd, D})
		}
		if s.MLP {
			mods = append(mods,
				loraModule{p + "mlp.gate_proj", D, F},
				loraModule{p + "mlp.up_proj", D, F},
				loraModule{p + "mlp.down_proj", F, D})
		}
	}
	if s.Unembed {
		mods = append(mods, loraModule{"lm_head", D, c.VocabSize})
	}
	return mods
}

// netInputs are the graph inputs every model graph starts with: base weights, LoRA pairs, LoRA scale.
type netInputs struct {
	cfg   *Config
	dtype dtypes.DType
	w     map[string]*Node    // base weights, by HF name (linear weights pre-transposed to [in,out])
	lora  map[string][2]*Node // module path -> (A [r,in], B [out,r])
	scale *Node               // alpha / r
}

// takeNetInputs consumes the leading inputs in the order engine.inputTensors produces them.
func takeNetInputs(cfg *Config, dtype dtypes.DType, names []string, spec loraSpec, in []*Node) (*netInputs, []*Node) {
	n := &netInputs{cfg: cfg, dtype: dtype, w: map[string]*Node{}, lora: map[string][2]*Node{}}
	for i, name := range names {
		n.w[name] = in[i]
	}
	in = in[len(names):]
	mods := cfg.loraModules(spec)
	for i, m := range mods {
		n.lora[m.Path] = [2]*Node{in[2*i], in[2*i+1]}
	}
	in = in[2*len(mods):]
	n.scale = in[0]
	return n, in[1:]
}

// linear applies x·Wᵀ (+ bias) (+ scale·(x·Aᵀ)·Bᵀ) for the module at path. W is stored
// pre-transposed as [in, out] so the big matmul is x·W. Batch and time are flattened into one
// axis first: the backward pass then contracts over a single axis, which the Go backend's matmul
// handles without transposing the activations (two contracting axes would force a transpose of
// x for every LoRA gradient).
func (n *netInputs) linear(x *Node, path string) *Node {
	dims := x.Shape().Dimensions
	B, T, in := dims[0], dims[1], dims[2]
	x2 := Reshape(x, B*T, in)
	y := MatMul(x2, n.w[path+".weight"])
	if b, ok := n.w[path+".bias"]; ok {
		y = Add(y, ExpandLeftToRank(b, y.Rank()))
	}
	if _, ok := n.lora[path]; ok {
		y = Add(y, n.loraDelta(path, x2))
	}
	return Reshape(y, B, T, y.Shape().Dimensions[1])
}

// loraDelta is scale·(x·Aᵀ)·Bᵀ for x [N,in].
func (n *netInputs) loraDelta(path string, x *Node) *Node {
	ab := n.lora[path]
	xa := Einsum("ni,ri->nr", x, ab[0])
	return Mul(Einsum("nr,or->no", xa, ab[1]), n.scale)
}

func (n *netInputs) rmsNorm(x, w *Node) *Node {
	ms := ReduceAndKeep(Square(x), ReduceMean, -1)
	inv := Div(ScalarOne(x.Graph(), x.DType()), Sqrt(AddScalar(ms, n.cfg.RMSNormEps))) // Rsqrt has no gradient
	return Mul(Mul(x, inv), ExpandLeftToRank(w, x.Rank()))
}

// rope rotates x [B,T,heads,hd] by cos/sin [B,T,hd] (HF rotate_half convention), in the
// projection's own layout so no transpose is needed before it.
func rope(x, cos, sin *Node) *Node {
	hd := x.Shape().Dimensions[3]
	c := InsertAxes(cos, 2) // [B,T,1,hd], broadcast over heads
	s := InsertAxes(sin, 2)
	x1 := SliceAxis(x, -1, AxisRange(0, hd/2))
	x2 := SliceAxis(x, -1, AxisRange(hd/2, hd))
	rot := Concatenate([]*Node{Neg(x2), x1}, -1)
	return Add(Mul(x, c), Mul(rot, s))
}

// attnKV is what one layer's attention sees: keys and values [B,KVH,S,hd], and an additive
// mask bias (0 or -1e9) broadcastable to [B,KVH,G,T,S] (its shape is [1 or B,1,1,T,S]).
type attnKV struct {
	k, v, bias *Node
}

// block runs one decoder layer. kvFn receives this layer's fresh k, v [B,T,KVH,hd] and
// returns the keys/values/mask to attend over (the same tensors with a causal mask when
// training, an updated cache when sampling).
//
// The attention matmuls are laid out for the Go backend's fast paths (one leading batch axis,
// contraction on the last lhs axis): heads are folded into the batch as [B·KVH, G·T, hd], so the
// only transposes are moving heads in front of time for q (and k, v) and back for the output.
func (n *netInputs) block(l int, h, cos, sin *Node, kvFn func(l int, k, v *Node) attnKV) *Node {
	c := n.cfg
	p := fmt.Sprintf("model.layers.%d.", l)
	dims := h.Shape().Dimensions
	B, T := dims[0], dims[1]
	H, KVH, hd := c.NumAttentionHeads, c.NumKeyValueHeads, c.HeadDim
	G := H / KVH

	x := n.rmsNorm(h, n.w[p+"input_layernorm.weight"])
	q := Reshape(n.linear(x, p+"self_attn.q_proj"), B, T, H, hd)
	k := Reshape(n.linear(x, p+"self_attn.k_proj"), B, T, KVH, hd)
	v := Reshape(n.linear(x, p+"self_attn.v_proj"), B, T, KVH, hd)
	if c.Arch == ArchQwen3 {
		q = n.rmsNorm(q, n.w[p+"self_attn.q_norm.weight"])
		k = n.rmsNorm(k, n.w[p+"self_attn.k_norm.weight"])
	}
	q = rope(q, cos, sin)
	k = rope(k, cos, sin)

	kv := kvFn(l, k, v)
	S := kv.k.Shape().Dimensions[2]
	qh := TransposeAllAxes(Reshape(q, B, T, KVH, G, hd), 0, 2, 3, 1, 4) // [B,KVH,G,T,hd]
	qh = Reshape(qh, B*KVH, G*T, hd)
	scores := Einsum("nqd,nsd->nqs", qh, Reshape(kv.k, B*KVH, S, hd)) // [B·KVH, G·T, S]
	scores = Add(MulScalar(Reshape(scores, B, KVH, G, T, S), 1/math.Sqrt(float64(hd))), kv.bias)
	probs := Reshape(Softmax(scores, -1), B*KVH, G*T, S)
	o := Einsum("nqs,nsd->nqd", probs, Reshape(kv.v, B*KVH, S, hd))   // [B·KVH, G·T, hd]
	o = TransposeAllAxes(Reshape(o, B, KVH, G, T, hd), 0, 3, 1, 2, 4) // [B,T,KVH,G,hd]
	h = Add(h, n.linear(Reshape(o, B, T, H*hd), p+"self_attn.o_proj"))

	x = n.rmsNorm(h, n.w[p+"post_attention_layernorm.weight"])
	gate := n.linear(x, p+"mlp.gate_proj")
	up := n.linear(x, p+"mlp.up_proj")
	act := Mul(Mul(gate, Sigmoid(gate)), up)
	return Add(h, n.linear(act, p+"mlp.down_proj"))
}

// maskBias turns an attend/ignore mask into an additive bias: 0 where allowed, -1e9 elsewhere.
func maskBias(mask *Node, dtype dtypes.DType) *Node {
	g := mask.Graph()
	return Where(mask, Scalar(g, dtype, 0), Scalar(g, dtype, -1e9))
}

// logits runs the whole network on tokens [B,T] and returns logits [B,T,V].
func (n *netInputs) logits(tokens, cos, sin *Node, kvFn func(l int, k, v *Node) attnKV) *Node {
	c := n.cfg
	emb := n.w["model.embed_tokens.weight"] // [V,D], kept untransposed for the gather
	h := Gather(emb, InsertAxes(tokens, -1))
	for l := range c.NumHiddenLayers {
		h = n.block(l, h, cos, sin, kvFn)
	}
	h = n.rmsNorm(h, n.w["model.norm.weight"])
	var out *Node
	if c.TieWordEmbeddings {
		out = Einsum("btd,vd->btv", h, emb)
	} else {
		out = Einsum("btd,dv->btv", h, n.w["lm_head.weight"])
	}
	if _, ok := n.lora["lm_head"]; ok {
		dims := h.Shape().Dimensions
		delta := n.loraDelta("lm_head", Reshape(h, dims[0]*dims[1], dims[2]))
		out = Add(out, Reshape(delta, dims[0], dims[1], c.VocabSize))
	}
	return out
}
