package engine

import (
	"context"
	"math"
	"sort"

	"github.com/gomlx/compute/dtypes"
)

// TensorInput is one loss_fn_inputs entry: a flat array with its declared dtype and shape.
type TensorInput struct {
	DType string    // "int64" or "float32" (as on the wire)
	Shape []int     // nil means 1-D of len(Data)
	Data  []float64 // integers are exact up to 2^53
}

// Datum is one training example: the model input tokens and the loss inputs, position i of
// the tokens predicting target_tokens[i].
type Datum struct {
	Tokens []int
	Inputs map[string]TensorInput
}

// ForwardResult is what forward and forward_backward return.
type ForwardResult struct {
	Logprobs [][]float64 // per datum, target-token logprobs
	Losses   [][]float64 // per datum, per-token loss
	Loss     float64     // sum of all per-token losses
	Metrics  map[string]float64
}

// Loss functions.
const (
	lossCrossEntropy = "cross_entropy"
	lossImportance   = "importance_sampling"
	lossPPO          = "ppo"
	lossCISPO        = "cispo"
	lossDRO          = "dro"
)

// LossNames are the supported loss functions.
var LossNames = []string{lossCrossEntropy, lossImportance, lossPPO, lossCISPO, lossDRO}

type lossDef struct {
	required []string           // loss_fn_inputs beside target_tokens
	optional map[string]float64 // optional float inputs with their default per token
	config   map[string]float64 // loss_fn_config keys and defaults
}

var lossDefs = map[string]lossDef{
	lossCrossEntropy: {optional: map[string]float64{"weights": 1}},
	lossImportance:   {required: []string{"logprobs", "advantages"}},
	lossPPO:          {required: []string{"logprobs", "advantages"}, config: map[string]float64{"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}},
	lossCISPO:        {required: []string{"logprobs", "advantages"}, config: map[string]float64{"clip_low_threshold": 0, "clip_high_threshold": 4}},
	lossDRO:          {required: []string{"logprobs", "advantages"}, optional: map[string]float64{"mask": 1}, config: map[string]float64{"beta": 0.05}},
}

// prepared is a validated batch, ready to be cut into passes.
type prepared struct {
	data         []Datum
	loss         string
	tokens       [][]int
	targets      [][]int
	weights      [][]float64
	oldLP        [][]float64
	adv          [][]float64
	lo, hi, beta float64
	images       []*Images         // per datum; nil entries (or all nil): text only
	feats        [][]imageFeatures // the tower's output per datum, computed once by run
}

// prepareFor validates a batch against a model config: all a gateway needs to reject bad input
// without the model's weights.
func prepareFor(c *Config, data []Datum, loss string, cfg map[string]float64) (*prepared, error) {
	def, ok := lossDefs[loss]
	if !ok {
		return nil, inputErr(-1, "loss_fn", "unknown loss function %q (supported: %v)", loss, LossNames)
	}
	if len(data) == 0 {
		return nil, inputErr(-1, "data", "empty batch")
	}
	keys := make([]string, 0, len(cfg))
	for k := range cfg {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	conf := map[string]float64{}
	for k, v := range def.config {
		conf[k] = v
	}
	for _, k := range keys {
		if _, ok := def.config[k]; !ok {
			return nil, inputErr(-1, "loss_fn_config."+k, "not a parameter of %s", loss)
		}
		if math.IsNaN(cfg[k]) || math.IsInf(cfg[k], 0) {
			return nil, inputErr(-1, "loss_fn_config."+k, "must be finite")
		}
		conf[k] = cfg[k]
	}
	p := &prepared{data: data, loss: loss, lo: conf["clip_low_threshold"], hi: conf["clip_high_threshold"], beta: conf["beta"]}
	// Clips bound a probability ratio, which is ≥ 0; a negative DRO beta rewards moving away
	// from the sampling policy without bound.
	for _, k := range []string{"clip_low_threshold", "clip_high_threshold", "beta"} {
		if v, ok := conf[k]; ok && v < 0 {
			return nil, inputErr(-1, "loss_fn_config."+k, "must be ≥ 0, got %v", v)
		}
	}
	if p.lo > p.hi {
		return nil, inputErr(-1, "loss_fn_config", "clip_low_threshold %v > clip_high_threshold %v", p.lo, p.hi)
	}
	V, maxLen := c.VocabSize, c.MaxPositionEmbeddings
	for i, d := range data {
		n := len(d.Tokens)
		if n == 0 {
			return nil, inputErr(i, "model_input", "no tokens")
		}
		if n > maxLen {
			return nil, inputErr(i, "model_input", "%d tokens exceed the model's context of %d", n, maxLen)
		}
		for j, t := range d.Tokens {
			if t < 0 || t >= V {
				return nil, inputErr(i, "model_input", "token %d at position %d is outside the vocabulary [0, %d)", t, j, V)
			}
		}
		allowed := map[string]bool{"target_tokens": true}
		for _, k := range def.required {
			allowed[k] = true
		}
		for k := range def.optional {
			allowed[k] = true
		}
		for k := range d.Inputs {
			if !allowed[k] && !imageInput(k) {
				return nil, inputErr(i, "loss_fn_inputs."+k, "not an input of %s", loss)
			}
		}
		tt, err := vectorInput(i, d, "target_tokens", true, n)
		if err != nil {
			return nil, err
		}
		targets := make([]int, n)
		for j, v := range tt {
			if v < 0 || v >= float64(V) {
				return nil, inputErr(i, "loss_fn_inputs.target_tokens", "token %v at position %d is outside the vocabulary [0, %d)", v, j, V)
			}
			targets[j] = int(v)
		}
		get := func(name string, def float64) ([]float64, error) {
			if _, ok := d.Inputs[name]; !ok {
				out := make([]float64, n)
				for j := range out {
					out[j] = def
				}
				return out, nil
			}
			return vectorInput(i, d, name, false, n)
		}
		for _, k := range def.required {
			if _, ok := d.Inputs[k]; !ok {
				return nil, inputErr(i, "loss_fn_inputs."+k, "required by %s", loss)
			}
		}
		w, err := get("weights", def.optional["weights"])
		if err != nil {
			return nil, err
		}
		lp, err := get("logprobs", 0)
		if err != nil {
			return nil, err
		}
		adv, err := get("advantages", 0)
		if err != nil {
			return nil, err
		}
		if loss == lossDRO {
			if w, err = droMask(i, d, lp, adv); err != nil {
				return nil, err
			}
		}
		img, err := datumImages(c, i, d.Tokens, d.Inputs)
		if err != nil {
			return nil, err
		}
		p.images = append(p.images, img)
		p.tokens = append(p.tokens, d.Tokens)
		p.targets = append(p.targets, targets)
		p.weights = append(p.weights, w)
		p.oldLP = append(p.oldLP, lp)
		p.adv = append(p.adv, adv)
	}
	return p, nil
}

// droMask is the weight of each position in the dro loss: 1 where it trains, 0 where it does
// not. Unlike the other RL losses, dro's quadratic term ½·β·(lp−q)² does not vanish where the
// advantage is 0, so prompt positions padded with target 0, logprob 0 and advantage 0 (as the
// tinker-cookbook sends them) would be pulled towards token 0. Without a mask input, a position
// trains when its advantage or its sampling logprob is non-zero (a sampled token has a negative
// logprob, unless its probability was exactly 1); a mask of 0s and 1s decides alone.
func droMask(datum int, d Datum, lp, adv []float64) ([]float64, error) {
	n := len(lp)
	if _, ok := d.Inputs["mask"]; ok {
		m, err := vectorInput(datum, d, "mask", false, n)
		if err != nil {
			return nil, err
		}
		for j, v := range m {
			if v != 0 && v != 1 {
				return nil, inputErr(datum, "loss_fn_inputs.mask", "value %v at position %d, want 0 or 1", v, j)
			}
		}
		return m, nil
	}
	w := make([]float64, n)
	for j := range w {
		if adv[j] != 0 || lp[j] != 0 {
			w[j] = 1
		}
	}
	return w, nil
}

// vectorInput checks one loss input is 1-D of length n, of the right kind, all finite.
func vectorInput(datum int, d Datum, name string, integer bool, n int) ([]float64, error) {
	field := "loss_fn_inputs." + name
	t, ok := d.Inputs[name]
	if !ok {
		return nil, inputErr(datum, field, "missing")
	}
	if integer && t.DType != "int64" && t.DType != "int32" {
		return nil, inputErr(datum, field, "dtype %q, want int64", t.DType)
	}
	if !integer && t.DType != "float32" && t.DType != "float64" && t.DType != "bfloat16" {
		return nil, inputErr(datum, field, "dtype %q, want float32", t.DType)
	}
	if t.Shape != nil && (len(t.Shape) != 1 || t.Shape[0] != len(t.Data)) {
		return nil, inputErr(datum, field, "shape %v, want [%d]", t.Shape, n)
	}
	if len(t.Data) != n {
		return nil, inputErr(datum, field, "length %d, want %d (the number of model_input tokens)", len(t.Data), n)
	}
	for j, v := range t.Data {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return nil, inputErr(datum, field, "non-finite value %v at position %d", v, j)
		}
		if integer && v != math.Trunc(v) {
			return nil, inputErr(datum, field, "non-integer value %v at position %d", v, j)
		}
		if !integer && math.Abs(v) > math.MaxFloat32 {
			return nil, inputErr(datum, field, "value %v at position %d is beyond float32's range", v, j)
		}
	}
	return t.Data, nil
}

func isFinite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

// isFinite32 reports whether v is finite as a float32 too.
func isFinite32(v float64) bool { return isFinite(v) && math.Abs(v) <= math.MaxFloat32 }

// finiteResult refuses a pass whose logprobs or losses are not finite float32s (the dtype they
// are answered in): extreme loss inputs (a sampling logprob of -1e30 makes exp(lp − q)
// overflow) are the user's to fix, and NaN cannot be answered in JSON anyway.
func finiteResult(res *ForwardResult) error {
	for i := range res.Losses {
		for t := range res.Losses[i] {
			if !isFinite32(res.Losses[i][t]) || !isFinite32(res.Logprobs[i][t]) {
				return inputErr(i, "loss_fn_inputs", "%v: the loss at position %d is %v (logprob %v); nothing was changed (check the magnitudes of weights, logprobs and advantages)",
					ErrNonFinite, t, res.Losses[i][t], res.Logprobs[i][t])
			}
		}
	}
	if !isFinite(res.Loss) {
		return inputErr(-1, "loss_fn_inputs", "%v: the summed loss is %v; nothing was changed", ErrNonFinite, res.Loss)
	}
	return nil
}

// chunks cuts a batch into passes of at most MaxBatchTokens padded tokens whose activations fit
// in MaxStepBytes (a sequence too long for the budget still runs, alone).
func (e *Engine) chunks(lengths []int) [][2]int {
	var out [][2]int
	start, maxLen := 0, 0
	for i, n := range lengths {
		m := max(maxLen, n)
		if i > start && (i-start+1)*padLen(m) > e.chunkTokens(padLen(m)) {
			out = append(out, [2]int{start, i})
			start, m = i, n
		}
		maxLen = m
	}
	return append(out, [2]int{start, len(lengths)})
}

// padLen is the length a chunk's sequences are padded to.
func padLen(n int) int { return (n + 15) / 16 * 16 }

// chunkTokens is how many padded tokens of length T one pass may hold.
func (e *Engine) chunkTokens(T int) int {
	size := 4
	if e.opts.Float64 {
		size = 8
	}
	c := e.Config
	perToken := c.stepElemsPerToken(T)
	perToken += perToken / 10 // margin: small tensors the estimate leaves out (measured within 4% on the small preset)
	return max(T, min(e.opts.MaxBatchTokens, (e.opts.MaxStepBytes/size-e.stepFixedElems())/perToken))
}

// stepFixedElems is what a training pass holds besides per-token tensors: merged LoRA weights,
// one layer's or all of them; the head's LoRA merged into a copy of the head (passes long
// enough to merge) and its rank×V gradient temporaries, which a pass holds from the head's
// backward to its end; with bf16 weights also one weight widened for its product, at most the
// head (for Qwen3-0.6B 600 MB, as much as 140 tokens' activations).
func (e *Engine) stepFixedElems() int {
	c := e.Config
	fixed := c.layerWeightElems()
	if e.keepsMerged() {
		fixed *= c.NumHiddenLayers
	}
	head := c.VocabSize * c.HiddenSize
	fixed += head + c.VocabSize*e.opts.MaxRank
	if e.opts.Precision == PrecisionBF16 {
		fixed += max(head, c.HiddenSize*max(c.NumAttentionHeads*c.HeadDim, c.IntermediateSize))
	}
	return fixed
}

// layerWeightElems is the size of one decoder layer's linear weights.
func (c *Config) layerWeightElems() int {
	q, kv := c.NumAttentionHeads*c.HeadDim, c.NumKeyValueHeads*c.HeadDim
	return c.HiddenSize * (2*q + 2*kv + 3*c.IntermediateSize)
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
// and the token's logits. Attention probabilities grow with T; they are kept for the backward
// pass only while they are not the bulk of a layer (see recomputesProbs).
func (c *Config) stepElemsPerToken(T int) int {
	D, F := c.HiddenSize, c.IntermediateSize
	q, kv := c.NumAttentionHeads*c.HeadDim, c.NumKeyValueHeads*c.HeadDim
	probs := c.NumAttentionHeads * T
	layer := c.layerElemsPerToken()
	backward := 5*D + 6*q + 4*kv + probs + 3*F
	if c.recomputesProbs(T) {
		backward += probs // recomputed while the layer's backward runs
	} else {
		layer += probs
	}
	return c.NumHiddenLayers*layer + backward + c.VocabSize + 2*D
}

// layerElemsPerToken is what a layer keeps per token for its backward pass, besides attention
// probabilities.
func (c *Config) layerElemsPerToken() int {
	q, kv := c.NumAttentionHeads*c.HeadDim, c.NumKeyValueHeads*c.HeadDim
	return 4*c.HiddenSize + 5*q + 6*kv + 4*c.IntermediateSize + 4
}

// recomputesProbs reports whether attention probabilities of sequences of length T are computed
// again in the backward pass rather than kept: when they would be more than the rest of what a
// layer keeps (from 1456 tokens on the small preset, 2064 on Qwen3-0.6B's shape).
func (c *Config) recomputesProbs(T int) bool {
	return c.NumAttentionHeads*T > c.layerElemsPerToken()
}

func (e *Engine) run(ctx context.Context, a *Adapter, p *prepared, backward bool) (*ForwardResult, error) {
	data := p.data
	var err error
	if p.feats, err = e.encodeImages(p.images); err != nil {
		return nil, err
	}
	res := &ForwardResult{Logprobs: make([][]float64, len(data)), Losses: make([][]float64, len(data))}
	var grads [][]float64
	if backward {
		grads = make([][]float64, len(a.params))
		for i, q := range a.params {
			grads[i] = make([]float64, len(q.w))
		}
	}
	lengths := make([]int, len(data))
	nTokens := 0
	for i, t := range p.tokens {
		lengths[i] = len(t)
		nTokens += len(t)
	}
	// Chunks run one after another: each already keeps every core busy (matmuls and kernels are
	// multi-threaded), and summing in chunk order keeps results independent of scheduling.
	for _, c := range e.chunks(lengths) {
		if err := stopped(ctx); err != nil {
			return nil, err
		}
		var l float64
		var err error
		if e.dtype == dtypes.Float64 {
			l, err = runPass[float64](ctx, e, a, p, c[0], c[1], p.loss, res, grads)
		} else {
			l, err = runPass[float32](ctx, e, a, p, c[0], c[1], p.loss, res, grads)
		}
		if err != nil {
			return nil, err
		}
		res.Loss += l
	}
	if err := finiteResult(res); err != nil {
		return nil, err
	}
	// The last moment a cancel is seen: from here the gradients are added whole.
	if err := stopped(ctx); err != nil {
		return nil, err
	}
	if backward {
		// Check every sum before changing any: a refused batch leaves the accumulator as it was.
		for i, q := range a.params {
			for j, g := range grads[i] {
				if !isFinite(q.g[j] + g) {
					return nil, inputErr(-1, "loss_fn_inputs", "%v: the gradients are not finite (nothing was changed; check the magnitudes of weights, logprobs and advantages)", ErrNonFinite)
				}
			}
		}
		for i, q := range a.params {
			for j, g := range grads[i] {
				q.g[j] += g
			}
		}
		a.pendingGrads = true
	}
	res.Metrics = map[string]float64{"loss:sum": res.Loss, "num_tokens:sum": float64(nTokens)}
	return res, nil
}
