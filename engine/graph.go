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
	w     map[string]*Node     // base weights, by HF name (linear weights pre-transposed to [in,out])
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

// linear applies x·Wᵀ (+ bias) (+ scale·(x·Aᵀ)·Bᵀ) for the module at path. weight is the
// HF weight name; W is stored pre-transposed as [in, out] so the big matmul is x·W.
func (n *netInputs) linear(x *Node, path string) *Node {
	y := Einsum("bti,io->bto", x, n.w[path+".weight"])
	if b, ok := n.w[path+".bias"]; ok {
		y = Add(y, ExpandLeftToRank(b, y.Rank()))
	}
	if ab, ok := n.lora[path]; ok {
		xa := Einsum("bti,ri->btr", x, ab[0])
		y = Add(y, Mul(Einsum("btr,or->bto", xa, ab[1]), n.scale))
	}
	return y
}

func (n *netInputs) rmsNorm(x, w *Node) *Node {
	ms := ReduceAndKeep(Square(x), ReduceMean, -1)
	inv := Div(ScalarOne(x.Graph(), x.DType()), Sqrt(AddScalar(ms, n.cfg.RMSNormEps))) // Rsqrt has no gradient
	return Mul(Mul(x, inv), ExpandLeftToRank(w, x.Rank()))
}

// rope rotates x [B,heads,T,hd] by cos/sin [B,T,hd] (HF rotate_half convention).
func rope(x, cos, sin *Node) *Node {
	hd := x.Shape().Dimensions[3]
	c := InsertAxes(cos, 1)
	s := InsertAxes(sin, 1)
	x1 := SliceAxis(x, -1, AxisRange(0, hd/2))
	x2 := SliceAxis(x, -1, AxisRange(hd/2, hd))
	rot := Concatenate([]*Node{Neg(x2), x1}, -1)
	return Add(Mul(x, c), Mul(rot, s))
}

// attnKV is what one layer's attention sees: keys and values [B,KVH,S,hd], and which
// key positions each query may attend to, mask [B,T,S] (bool).
type attnKV struct {
	k, v, mask *Node
}

// block runs one decoder layer. kvFn receives this layer's fresh k, v [B,KVH,T,hd] and
// returns the keys/values/mask to attend over (the same tensors with a causal mask when
// training, an updated cache when sampling).
func (n *netInputs) block(l int, h, cos, sin *Node, kvFn func(l int, k, v *Node) attnKV) *Node {
	c := n.cfg
	p := fmt.Sprintf("model.layers.%d.", l)
	dims := h.Shape().Dimensions
	B, T := dims[0], dims[1]
	H, KVH, hd := c.NumAttentionHeads, c.NumKeyValueHeads, c.HeadDim

	x := n.rmsNorm(h, n.w[p+"input_layernorm.weight"])
	q := Reshape(n.linear(x, p+"self_attn.q_proj"), B, T, H, hd)
	k := Reshape(n.linear(x, p+"self_attn.k_proj"), B, T, KVH, hd)
	v := Reshape(n.linear(x, p+"self_attn.v_proj"), B, T, KVH, hd)
	if c.Arch == ArchQwen3 {
		q = n.rmsNorm(q, n.w[p+"self_attn.q_norm.weight"])
		k = n.rmsNorm(k, n.w[p+"self_attn.k_norm.weight"])
	}
	q = TransposeAllAxes(q, 0, 2, 1, 3) // [B,H,T,hd]
	k = TransposeAllAxes(k, 0, 2, 1, 3)
	v = TransposeAllAxes(v, 0, 2, 1, 3)
	q = rope(q, cos, sin)
	k = rope(k, cos, sin)

	kv := kvFn(l, k, v)
	S := kv.k.Shape().Dimensions[2]
	G := H / KVH
	q5 := Reshape(q, B, KVH, G, T, hd)
	scores := Einsum("bkgtd,bksd->bkgts", q5, kv.k)
	scores = MulScalar(scores, 1/math.Sqrt(float64(hd)))
	mask := BroadcastToDims(Reshape(kv.mask, B, 1, 1, T, S), B, KVH, G, T, S)
	neg := BroadcastToDims(Scalar(h.Graph(), n.dtype, -1e9), B, KVH, G, T, S)
	scores = Where(mask, scores, neg)
	probs := Softmax(scores, -1)
	o := Einsum("bkgts,bksd->bkgtd", probs, kv.v) // [B,KVH,G,T,hd]
	o = Reshape(TransposeAllAxes(Reshape(o, B, H, T, hd), 0, 2, 1, 3), B, T, H*hd)
	h = Add(h, n.linear(o, p+"self_attn.o_proj"))

	x = n.rmsNorm(h, n.w[p+"post_attention_layernorm.weight"])
	gate := n.linear(x, p+"mlp.gate_proj")
	up := n.linear(x, p+"mlp.up_proj")
	act := Mul(Mul(gate, Sigmoid(gate)), up)
	return Add(h, n.linear(act, p+"mlp.down_proj"))
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
	if ab, ok := n.lora["lm_head"]; ok {
		xa := Einsum("btd,rd->btr", h, ab[0])
		out = Add(out, Mul(Einsum("btr,vr->btv", xa, ab[1]), n.scale))
	}
	return out
}

// causalKV attends over the sequence itself: position t sees s ≤ t.
func causalKV(k, v *Node) attnKV {
	dims := k.Shape().Dimensions
	B, T := dims[0], dims[2]
	g := k.Graph()
	row := Iota(g, shapeOf(dtypes.Int32, T, T), 0)
	col := Iota(g, shapeOf(dtypes.Int32, T, T), 1)
	mask := BroadcastToDims(InsertAxes(GreaterOrEqual(row, col), 0), B, T, T)
	return attnKV{k: k, v: v, mask: mask}
}

// Loss kinds, as graph variants.
const (
	lossCrossEntropy = "cross_entropy"
	lossImportance   = "importance_sampling"
	lossPPO          = "ppo"
	lossCISPO        = "cispo"
	lossDRO          = "dro"
)

// lossInputs are the per-token tensors [B,T] and config scalars of the loss graph.
type lossInputs struct {
	targets, valid, weights, oldLP, adv *Node
	lo, hi, beta                        *Node
}

func takeLossInputs(in []*Node) (lossInputs, []*Node) {
	return lossInputs{targets: in[0], valid: in[1], weights: in[2], oldLP: in[3], adv: in[4],
		lo: in[5], hi: in[6], beta: in[7]}, in[8:]
}

// targetLogprobs returns log p(target) [B,T] from logits [B,T,V].
func targetLogprobs(logits, targets *Node) *Node {
	V := logits.Shape().Dimensions[2]
	lsm := LogSoftmax(logits, -1)
	return ReduceSum(Mul(lsm, OneHot(targets, V, logits.DType())), -1)
}

// tokenLoss is the per-token loss [B,T] of a loss kind; padding positions give 0.
func tokenLoss(kind string, lp *Node, li lossInputs) *Node {
	var l *Node
	switch kind {
	case lossCrossEntropy:
		l = Neg(Mul(lp, li.weights))
	case lossImportance:
		l = Neg(Mul(Exp(Sub(lp, li.oldLP)), li.adv))
	case lossPPO:
		r := Exp(Sub(lp, li.oldLP))
		clipped := clip(r, li.lo, li.hi)
		l = Neg(Min(Mul(r, li.adv), Mul(clipped, li.adv)))
	case lossCISPO:
		r := StopGradient(clip(Exp(Sub(lp, li.oldLP)), li.lo, li.hi))
		l = Neg(Mul(Mul(r, lp), li.adv))
	case lossDRO:
		d := Sub(lp, li.oldLP)
		l = Neg(Sub(Mul(lp, li.adv), Mul(MulScalar(li.beta, 0.5), Square(d))))
	default:
		panic(fmt.Sprintf("unknown loss %q", kind))
	}
	return Where(li.valid, l, ZerosLike(l))
}

// clip is Clamp built from Min and Max, which have gradients (Clamp has none in GoMLX).
func clip(x, lo, hi *Node) *Node { return Min(Max(x, lo), hi) }
