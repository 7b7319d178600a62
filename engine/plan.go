package engine

import (
	"github.com/skein-ai/skein/engine/internal/backend"
	"github.com/skein-ai/skein/engine/internal/backend/cpu"
)

// The memory plan of a pass: how many tokens one pass may hold (chunks, chunkTokens), from an
// estimate of what a training pass keeps (stepFixedElems, stepElemsPerToken), and the two
// choices that trade memory for work (keepsMerged, recomputesProbs).

// chunks cuts a batch into passes of at most MaxBatchTokens padded tokens whose activations fit
// in MaxStepBytes (a sequence too long for the budget still runs, alone).
func (e *Engine) chunks(lengths []int, a *Adapter) [][2]int {
	var out [][2]int
	start, maxLen := 0, 0
	for i, n := range lengths {
		m := max(maxLen, n)
		if i > start && (i-start+1)*padLen(m) > e.chunkTokens(padLen(m), a) {
			out = append(out, [2]int{start, i})
			start, m = i, n
		}
		maxLen = m
	}
	return append(out, [2]int{start, len(lengths)})
}

// padLen is the length a chunk's sequences are padded to.
func padLen(n int) int { return (n + 15) / 16 * 16 }

// chunkTokens is how many padded tokens of length T one pass may hold: as many as their full
// activations allow in MaxStepBytes; when not even one sequence's do, as many as fit with only
// each layer's input kept (recomputesLayers), and at least the one sequence.
func (e *Engine) chunkTokens(T int, a *Adapter) int {
	budget := e.opts.MaxStepBytes/e.elemSize() - e.stepFixedElems(a)
	if n := e.tokensIn(budget, withMargin(e.Config.stepElemsPerToken(T))); n >= T {
		return max(T, min(e.opts.MaxBatchTokens, n))
	}
	return max(T, min(e.opts.MaxBatchTokens, e.tokensIn(budget, withMargin(e.Config.recomputeElemsPerToken(T)))))
}

// tokensIn is the most tokens n whose n·perToken elements and head tile (headElems(n)) fit in
// budget elements.
func (e *Engine) tokensIn(budget, perToken int) int {
	rows, V := e.headTileRows(), e.Config.VocabSize
	if n := budget / (perToken + V); n <= rows {
		return n
	}
	return (budget - rows*V) / perToken
}

// headElems is what the head holds for a pass of n rows besides per-token tensors: one tile of
// logits (headRows), and the tile's copy of its rows of the final norm.
func (e *Engine) headElems(n int) int {
	rows := min(n, e.headTileRows())
	tile := rows * e.Config.VocabSize
	if rows < n {
		tile += rows * e.Config.HiddenSize
	}
	return tile
}

// stepElems is the plan's estimate of the elements a training pass of B sequences of T tokens
// holds at its peak, recomputing layers or not: the fixed part, every token's share with the
// margin, and the head's tile. Tests compare it with what passes really hold.
func (e *Engine) stepElems(B, T int, recompute bool, a *Adapter) int {
	per := e.Config.stepElemsPerToken(T)
	if recompute {
		per = e.Config.recomputeElemsPerToken(T)
	}
	return e.stepFixedElems(a) + B*T*withMargin(per) + e.headElems(B*T)
}

// withMargin adds the small tensors the estimate leaves out (measured within 4% on the small preset).
func withMargin(perToken int) int { return perToken + perToken/10 }

// elemSize is the bytes of one element of the passes' dtype.
func (e *Engine) elemSize() int {
	if e.opts.Float64 {
		return 8
	}
	return 4
}

// headTileBytes bounds one tile of logits (headRows): rows × vocabulary elements.
const headTileBytes = 64 << 20

// headTileRows is how many rows of logits one tile of the head holds: as many as fit in
// headTileBytes, a multiple of 16 and at least 16 (the tiny and small presets: every pass one
// tile; an 8B shape's 152k vocabulary: 96 rows in float32).
func (e *Engine) headTileRows() int {
	if e.headTile > 0 {
		return e.headTile
	}
	n := headTileBytes / (e.elemSize() * e.Config.VocabSize)
	return max(16, n/16*16)
}

// recomputesLayers reports whether a training pass of B sequences of T tokens keeps only each
// layer's input and runs each layer's forward again in the backward pass (one more forward of
// compute, a third more): when its full activations do not fit in MaxStepBytes, which happens
// only to a chunk of one sequence (chunkTokens cuts the rest). Memory then is every layer's
// input plus one layer's activations: for an 8B shape at 1 × 1024 tokens, 0.5 + 0.4 GB rather
// than 13 GB.
func (e *Engine) recomputesLayers(B, T int, a *Adapter) bool {
	if e.recompute != nil {
		return *e.recompute
	}
	return e.stepElems(B, T, false, a) > e.opts.MaxStepBytes/e.elemSize()
}

// recomputeElemsPerToken is stepElemsPerToken when layers are recomputed: every layer's input,
// one layer's activations and backward temporaries.
func (c *Config) recomputeElemsPerToken(T int) int {
	full := c.stepElemsPerToken(T)
	layers := c.allLayersElemsPerToken()
	if !c.recomputesProbs(T) {
		layers += c.attentionLayers() * c.NumAttentionHeads * T
	}
	return full - layers + c.NumHiddenLayers*c.HiddenSize + c.maxLayerElemsPerToken() + c.NumAttentionHeads*T
}

// stepFixedElems is what a training pass holds besides per-token tensors and the head's tile:
// adapter a's matrices as the pass copies them (loraPassElems; nil: none); merged LoRA weights,
// one layer's or all of them; the head's LoRA merged into a copy of the
// head when its tiles are long enough to merge (headMerges) and its rank×V gradient
// temporaries; with bf16 weights also one weight widened for its product, at most the head
// (for Qwen3-0.6B 600 MB, as much as 140 tokens' activations).
func (e *Engine) stepFixedElems(a *Adapter) int {
	c := e.Config
	fixed := 0
	if e.mergesLoRA() {
		fixed = c.layerWeightElems()
		if e.keepsMerged() {
			fixed = c.allLayerWeightElems()
		}
	}
	fixed += e.loraPassElems(a)
	head := c.VocabSize * c.HiddenSize
	if e.headMerges() {
		fixed += head
	}
	fixed += c.VocabSize * e.opts.MaxRank
	if (e.opts.Precision == PrecisionBF16 || quantFormat(e.opts.Precision) != nil) && !e.caps().BF16GEMM {
		// Widened into a float32 step buffer for the float32 GEMM (on a bf16 path the bf16 GEMM
		// reads bf16 weights as they are, and quantized ones widened outside the arena: Plan).
		// At most one chunk of widenChunkBytes through the float32 GEMM (widenedChunkProduct).
		widest := max(head, c.HiddenSize*max(c.NumAttentionHeads*c.HeadDim, c.IntermediateSize))
		if !e.opts.Float64 && e.caps().F32GEMM {
			widest = min(widest, cpu.WidenChunkBytes/4)
		}
		fixed += widest
	}
	return fixed
}

// TrainingPlan is the memory plan's account, in bytes, of a process that trains one adapter.
type TrainingPlan struct {
	Weights int64 // the base model as loaded (WeightBytes)
	Adapter int64 // the adapter's weights, gradients and Adam moments
	// AccumulateGrads is what a forward_backward holds more when gradients are already pending
	// (gradient accumulation: a second one before the optim_step sums its batch beside the
	// accumulator). Not in Total, which plans the loop of one forward_backward a step: the first
	// after an optim_step sums into the zero accumulator in place.
	AccumulateGrads int64
	Step            int64 // the largest pass: activations, head tile, the pass's copies of the adapter
	Widened         int64 // a quantized weight's chunk widened into bf16 pairs for the bf16 GEMM (the largest)
	// Recompute says whether the pass recomputes layers (the one sequence does not fit).
	Recompute bool
}

// Total is the sum of the parts.
func (p TrainingPlan) Total() int64 { return p.Weights + p.Adapter + p.Step + p.Widened }

// PlanTraining is the memory plan for forward_backward over B sequences of T tokens with a LoRA
// of cfg (its optim_step holds nothing more), as the engine sizes its passes: what the bench
// prints beside the resident memory it measures.
func (e *Engine) PlanTraining(B, T int, cfg LoraConfig) TrainingPlan {
	a := &Adapter{Config: cfg, mods: e.Config.loraModules(cfg.spec())}
	params := 0
	for _, m := range a.mods {
		params += m.params(cfg.Rank)
	}
	size := int64(e.elemSize())
	T = padLen(T)
	p := TrainingPlan{Weights: int64(e.WeightBytes()), Adapter: 4 * size * int64(params), AccumulateGrads: size * int64(params)}
	// The chunks the batch runs in: as many sequences of T as a pass takes.
	per := max(1, min(B, e.chunkTokens(T, a)/T))
	p.Recompute = e.recomputesLayers(per, T, a)
	p.Step = size * int64(e.stepElems(per, T, p.Recompute, a))
	if quantFormat(e.opts.Precision) != nil && e.caps().BF16GEMM && !e.opts.Float64 {
		words := 0 // the largest chunk of pairs a product widens
		for _, l := range modelOf[float32](e.base).linears {
			words = max(words, cpu.PairsChunkWords(l.w, e.pairsChunk))
		}
		p.Widened = 4 * int64(words)
	}
	return p
}

// loraPassElems is what loraOf copies of adapter a into a training pass: Aᵀ where LoRA may
// merge; A, B and scale·Bᵀ too where the matmuls take only backend buffers (aliasesLoRA false:
// float64, or no GEMM). On the float32 GEMM path with LoRA always added (bf16 or quantized
// weights) nothing: an 8B shape at rank 32 held 0.83 GB of copies before. nil: nothing.
func (e *Engine) loraPassElems(a *Adapter) int {
	if a == nil {
		return 0
	}
	var copiesA, copiesB int
	if e.mergesLoRA() {
		copiesA = 1
	}
	if e.opts.Float64 || !e.caps().F32GEMM {
		copiesA, copiesB = copiesA+1, 2
	}
	n := 0
	for _, m := range a.mods {
		if m.Experts > 0 { // never merged: A and B copied where copied at all
			n += min(copiesA, 1)*m.aShape(a.Config.Rank)[0]*m.In + min(copiesB, 1)*m.Out*a.Config.Rank
			continue
		}
		n += a.Config.Rank * (copiesA*m.In + copiesB*m.Out)
	}
	return n
}

// headMerges reports whether a head LoRA is merged into a copy of the head (loraWay at a full
// tile's rows): never over bf16 weights on a path with the bf16 GEMM or over quantized ones,
// which add their LoRA.
func (e *Engine) headMerges() bool {
	c := e.Config
	return e.mergesLoRA() && e.headTileRows()*(c.HiddenSize+c.VocabSize) >= c.HiddenSize*c.VocabSize
}

// mergesLoRA reports whether passes with many rows merge LoRA into copies of the weights
// (loraWay): not over bf16 weights on a path with the bf16 GEMM, nor over quantized ones, which
// always add it (for an 8B shape in bf16 that is 0.9 GB the plan need not hold back).
func (e *Engine) mergesLoRA() bool {
	return quantFormat(e.opts.Precision) == nil && !(e.opts.Precision == PrecisionBF16 && e.caps().BF16GEMM)
}

// layerWeightElems is the size of the largest decoder layer's linear weights.
func (c *Config) layerWeightElems() int {
	n := 0
	for l := range c.NumHiddenLayers {
		n = max(n, c.layerWeightElemsOf(l))
	}
	return n
}

// allLayerWeightElems is the size of every decoder layer's linear weights.
func (c *Config) allLayerWeightElems() int {
	n := 0
	for l := range c.NumHiddenLayers {
		n += c.layerWeightElemsOf(l)
	}
	return n
}

// layerWeightElemsOf is the size of layer l's linear weights that a LoRA may merge into, by its
// kind: a mixture of experts' experts add theirs (moe.go) and its router has none, so of its
// block only the shared expert counts.
func (c *Config) layerWeightElemsOf(l int) int {
	D, mlp := c.HiddenSize, 3*c.HiddenSize*c.IntermediateSize
	if c.isMoE(l) {
		mlp = 3 * D * c.SharedExpertIntermediateSize
	}
	if c.isDeltaNet(l) {
		d := c.dnDims()
		return D*(d.C+2*d.Vd+2*d.Hv) + mlp // q, k, v, z, a, b in; out_proj
	}
	q, kv := c.NumAttentionHeads*c.HeadDim, c.NumKeyValueHeads*c.HeadDim
	if c.family().gatedAttention {
		return D*(3*q+2*kv) + mlp // q_proj's gate rows
	}
	return D*(2*q+2*kv) + mlp
}

// keepsMerged reports whether a training pass keeps every layer's merged LoRA weights from the
// forward to the backward pass (saving a merge per module) rather than merging again: when all
// of them take at most an eighth of MaxStepBytes (tests force either way).
func (e *Engine) keepsMerged() bool {
	if e.keepMerged != nil {
		return *e.keepMerged
	}
	size := 4
	if e.opts.Float64 {
		size = 8
	}
	return e.Config.NumHiddenLayers*e.Config.layerWeightElems()*size <= e.opts.MaxStepBytes/8
}

// stepElemsPerToken estimates the tensor elements a training pass holds per token at its peak,
// for sequences of length T: every layer's saved activations, one layer's backward temporaries,
// the final norm's output and its gradient. Logits are not per token: the head runs in tiles
// (headElems). Attention probabilities grow with T; they are kept for the backward
// pass only while they are not the bulk of a layer (see recomputesProbs).
func (c *Config) stepElemsPerToken(T int) int {
	D, F := c.HiddenSize, c.IntermediateSize
	q, kv := c.NumAttentionHeads*c.HeadDim, c.NumKeyValueHeads*c.HeadDim
	probs := c.NumAttentionHeads * T
	layers := c.allLayersElemsPerToken()
	// A layer's backward runs in two phases (backward.go, layerBack): the feed-forward block's,
	// holding d(act), d(gate), d(up) and d(x2), then attention's, after the block has given back
	// those and its own activations (4F, counted in the layer's: ffn.go).
	ffnPhase := 0
	for l := range c.NumHiddenLayers {
		ffnPhase = max(ffnPhase, c.ffnBackElemsPerToken(l))
	}
	attnPhase := 6*D + 6*q + 4*kv + probs - 4*F
	if c.recomputesProbs(T) {
		attnPhase += probs // recomputed while the layer's backward runs
	}
	backward := max(ffnPhase, attnPhase)
	if c.deltaNet != nil {
		// A DeltaNet layer's backward temporaries: the gated norm's and the rule's gradients,
		// the conv's input and output gradients, beside the MLP's.
		d := c.dnDims()
		backward = max(backward, 3*D+2*d.C+2*d.Kd+4*d.Vd+4*d.Hv+3*F)
	}
	if !c.recomputesProbs(T) {
		layers += c.attentionLayers() * probs
	}
	return layers + backward + 2*D
}

// attentionLayers is how many layers are softmax attention (all but a hybrid's DeltaNet ones).
func (c *Config) attentionLayers() int {
	n := 0
	for l := range c.NumHiddenLayers {
		if !c.isDeltaNet(l) {
			n++
		}
	}
	return n
}

// layerElemsPerToken is what an attention layer keeps per token for its backward pass, besides
// attention probabilities.
func (c *Config) layerElemsPerToken() int {
	q, kv := c.NumAttentionHeads*c.HeadDim, c.NumKeyValueHeads*c.HeadDim
	if c.family().gatedAttention {
		q += q / 2 // the doubled q_proj output, its gate rows and the gated output, per query dim ≈ 1.5×
		return 4*c.HiddenSize + 6*q + 6*kv + 4*c.IntermediateSize + 4
	}
	return 4*c.HiddenSize + 5*q + 6*kv + 4*c.IntermediateSize + 4
}

// layerElemsPerTokenOf is what layer l keeps per token, by its kind (attention probabilities
// aside). A DeltaNet layer keeps its input and norm, the q/k/v/z/a/b projections, the conv's
// pre-activations, normalised q and k, values, gates, the rule's output and the gated norm's,
// and a state of Hv·dk·dv per deltaChunk tokens (reference §3's table).
func (c *Config) layerElemsPerTokenOf(l int) int {
	if !c.isDeltaNet(l) {
		return c.layerElemsPerToken() - 4*c.IntermediateSize + c.ffnElemsPerToken(l)
	}
	d := c.dnDims()
	D := c.HiddenSize
	mixer := 2*d.C + 2*d.Kd + 4*d.Vd + 6*d.Hv + (d.Hv*d.dk*d.dv+deltaChunk-1)/deltaChunk
	return 4*D + mixer + c.ffnElemsPerToken(l) + 4
}

// ffnElemsPerToken is what layer l's feed-forward block keeps per token for its backward pass:
// the dense MLP's gate, up, σ(gate) and activation (4F); a mixture of experts' router logits and
// weights, and per routed row its gathered input, gate, up, σ, activation and output (plus a
// LoRA's rank-sized rows, within the margin), and its shared expert's.
func (c *Config) ffnElemsPerToken(l int) int {
	if !c.isMoE(l) {
		return 4 * c.IntermediateSize
	}
	k, D := c.NumExpertsPerTok, c.HiddenSize
	return c.NumExperts + 2*k + k*(4*c.MoeIntermediateSize+2*D) + 4*c.SharedExpertIntermediateSize + 2*D
}

// ffnBackElemsPerToken is what the block's backward holds per token at once beside the kept
// activations: d(act), d(gate), d(up) and d(x2) (dense); a mixture's gradients of its routed rows.
func (c *Config) ffnBackElemsPerToken(l int) int {
	if !c.isMoE(l) {
		return 3*c.IntermediateSize + c.HiddenSize
	}
	k, D := c.NumExpertsPerTok, c.HiddenSize
	return c.NumExperts + k*(3*c.MoeIntermediateSize+2*D) + 3*c.SharedExpertIntermediateSize + 3*D
}

// allLayersElemsPerToken is layerElemsPerTokenOf summed over the layers.
func (c *Config) allLayersElemsPerToken() int {
	n := 0
	for l := range c.NumHiddenLayers {
		n += c.layerElemsPerTokenOf(l)
	}
	return n
}

// maxLayerElemsPerToken is the largest layer's layerElemsPerTokenOf.
func (c *Config) maxLayerElemsPerToken() int {
	n := 0
	for l := range c.NumHiddenLayers {
		n = max(n, c.layerElemsPerTokenOf(l))
	}
	return n
}

// recomputesProbs reports whether attention probabilities of sequences of length T are computed
// again in the backward pass rather than kept: when they would be more than the rest of what a
// layer keeps (from 1456 tokens on the small preset, 2064 on Qwen3-0.6B's shape).
func (c *Config) recomputesProbs(T int) bool {
	return c.NumAttentionHeads*T > c.layerElemsPerToken()
}

// caps is what the engine's backend can do (the plan's choices depend on it).
func (e *Engine) caps() backend.Caps { return e.base.cpu.Caps() }
