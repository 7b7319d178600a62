package engine

import (
	"context"
	"math"
	"sort"
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

// Batch is a forward or forward_backward batch validated against a model: made once, at the
// gateway, by ModelInfo.PrepareBatch, and run by Compute.ForwardBatch without being checked again
// in the same process. A remote worker receives only its data and validates it again: a network
// peer is unproven.
type Batch struct {
	Data       []Datum
	Loss       string
	LossConfig map[string]float64

	p      *prepared
	config *Config // the model p was validated against
}

// PrepareBatch validates a batch for the model: every error a forward pass could find in its
// input is found here, before the batch waits in any queue.
func (m ModelInfo) PrepareBatch(data []Datum, loss string, cfg map[string]float64) (*Batch, error) {
	p, err := prepareFor(m.Config, data, loss, cfg)
	if err != nil {
		return nil, err
	}
	return &Batch{Data: data, Loss: loss, LossConfig: cfg, p: p, config: m.Config}, nil
}

// preparedFor is the batch validated against c: as prepared when that was against c itself,
// validated now otherwise (a Batch built by hand, or for another model).
func (b *Batch) preparedFor(c *Config) (*prepared, error) {
	if b.p != nil && b.config == c {
		return b.p, nil
	}
	return prepareFor(c, b.Data, b.Loss, b.LossConfig)
}

// ForwardBatch runs a batch through adapter id: with backward, accumulating its gradients (a
// training adapter only); without, changing nothing (id "" is the bare base model). On any
// error nothing about the adapter changes.
//
// A cancelled ctx stops the pass between layers or between chunks. Gradients are summed into a
// buffer of the call's own and added to the accumulator only after every chunk has run, so a
// cancelled call, like a failed one, has changed nothing: no partial gradients to roll back.
func (e *Engine) ForwardBatch(ctx context.Context, id string, b *Batch, backward bool) (*ForwardResult, error) {
	var a *Adapter
	var err error
	switch {
	case backward:
		a, err = e.trainable(id)
	case id != "":
		a, err = e.adapter(id)
	}
	if err != nil {
		return nil, err
	}
	if err := stopped(ctx); err != nil {
		return nil, err
	}
	p, err := b.preparedFor(e.Config)
	if err != nil {
		return nil, err
	}
	return e.run(ctx, a, p, backward)
}

// ForwardBackward validates and runs a batch, accumulating gradients into the adapter.
func (e *Engine) ForwardBackward(ctx context.Context, id string, data []Datum, loss string, cfg map[string]float64) (*ForwardResult, error) {
	return e.ForwardBatch(ctx, id, &Batch{Data: data, Loss: loss, LossConfig: cfg}, true)
}

// Forward validates and runs a batch without gradients; id "" is the bare base model.
func (e *Engine) Forward(ctx context.Context, id string, data []Datum, loss string, cfg map[string]float64) (*ForwardResult, error) {
	return e.ForwardBatch(ctx, id, &Batch{Data: data, Loss: loss, LossConfig: cfg}, false)
}

// Validation and preparation: prepareFor checks every input of a batch against a model config
// (loss, tokens, loss inputs, images) and gathers them per datum for the passes.

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
	conf, err := lossConfig(loss, def, cfg)
	if err != nil {
		return nil, err
	}
	p := &prepared{data: data, loss: loss, lo: conf["clip_low_threshold"], hi: conf["clip_high_threshold"], beta: conf["beta"]}
	for i, d := range data {
		if err := p.add(c, def, i, d); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// lossConfig is the loss's parameters: its defaults, overridden by cfg, each checked.
func lossConfig(loss string, def lossDef, cfg map[string]float64) (map[string]float64, error) {
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
	// Clips bound a probability ratio, which is ≥ 0; a negative DRO beta rewards moving away
	// from the sampling policy without bound.
	for _, k := range []string{"clip_low_threshold", "clip_high_threshold", "beta"} {
		if v, ok := conf[k]; ok && v < 0 {
			return nil, inputErr(-1, "loss_fn_config."+k, "must be ≥ 0, got %v", v)
		}
	}
	if lo, hi := conf["clip_low_threshold"], conf["clip_high_threshold"]; lo > hi {
		return nil, inputErr(-1, "loss_fn_config", "clip_low_threshold %v > clip_high_threshold %v", lo, hi)
	}
	return conf, nil
}

// add validates datum i and appends it to the batch: its tokens, which inputs it names, its
// target tokens, its loss inputs and its images.
func (p *prepared) add(c *Config, def lossDef, i int, d Datum) error {
	if err := checkTokens(c, i, d.Tokens); err != nil {
		return err
	}
	if err := checkInputNames(def, p.loss, i, d); err != nil {
		return err
	}
	targets, err := targetTokens(c, i, d)
	if err != nil {
		return err
	}
	w, lp, adv, err := lossInputs(def, p.loss, i, d)
	if err != nil {
		return err
	}
	img, err := datumImages(c, i, d.Tokens, d.Inputs)
	if err != nil {
		return err
	}
	p.images = append(p.images, img)
	p.tokens = append(p.tokens, d.Tokens)
	p.targets = append(p.targets, targets)
	p.weights = append(p.weights, w)
	p.oldLP = append(p.oldLP, lp)
	p.adv = append(p.adv, adv)
	return nil
}

// checkTokens checks datum i's model input: some tokens, within the model's context and
// vocabulary.
func checkTokens(c *Config, i int, tokens []int) error {
	V, maxLen := c.VocabSize, c.MaxPositionEmbeddings
	n := len(tokens)
	if n == 0 {
		return inputErr(i, "model_input", "no tokens")
	}
	if n > maxLen {
		return inputErr(i, "model_input", "%d tokens exceed the model's context of %d", n, maxLen)
	}
	for j, t := range tokens {
		if t < 0 || t >= V {
			return inputErr(i, "model_input", "token %d at position %d is outside the vocabulary [0, %d)", t, j, V)
		}
	}
	return nil
}

// checkInputNames refuses loss inputs that are neither the loss's nor images.
func checkInputNames(def lossDef, loss string, i int, d Datum) error {
	allowed := map[string]bool{"target_tokens": true}
	for _, k := range def.required {
		allowed[k] = true
	}
	for k := range def.optional {
		allowed[k] = true
	}
	for k := range d.Inputs {
		if !allowed[k] && !imageInput(k) {
			return inputErr(i, "loss_fn_inputs."+k, "not an input of %s", loss)
		}
	}
	return nil
}

// targetTokens are datum i's target tokens, one per model input token, within the vocabulary.
func targetTokens(c *Config, i int, d Datum) ([]int, error) {
	V, n := c.VocabSize, len(d.Tokens)
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
	return targets, nil
}

// lossInputs are datum i's per-token weights, sampling logprobs and advantages, each given or
// its default; dro's weights are its mask (droMask).
func lossInputs(def lossDef, loss string, i int, d Datum) (w, lp, adv []float64, err error) {
	for _, k := range def.required {
		if _, ok := d.Inputs[k]; !ok {
			return nil, nil, nil, inputErr(i, "loss_fn_inputs."+k, "required by %s", loss)
		}
	}
	if w, err = inputOr(i, d, "weights", def.optional["weights"]); err != nil {
		return nil, nil, nil, err
	}
	if lp, err = inputOr(i, d, "logprobs", 0); err != nil {
		return nil, nil, nil, err
	}
	if adv, err = inputOr(i, d, "advantages", 0); err != nil {
		return nil, nil, nil, err
	}
	if loss == lossDRO {
		if w, err = droMask(i, d, lp, adv); err != nil {
			return nil, nil, nil, err
		}
	}
	return w, lp, adv, nil
}

// inputOr is datum i's float input name, or def at every position when it is not given.
func inputOr(i int, d Datum, name string, def float64) ([]float64, error) {
	n := len(d.Tokens)
	if _, ok := d.Inputs[name]; !ok {
		out := make([]float64, n)
		for j := range out {
			out[j] = def
		}
		return out, nil
	}
	return vectorInput(i, d, name, false, n)
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
