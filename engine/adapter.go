package engine

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
)

// LoraConfig is Tinker's LoraConfig.
type LoraConfig struct {
	Rank         int     `json:"rank"`
	Seed         int64   `json:"seed"`
	TrainAttn    bool    `json:"train_attn"`
	TrainMLP     bool    `json:"train_mlp"`
	TrainUnembed bool    `json:"train_unembed"`
	Alpha        float64 `json:"alpha,omitempty"` // 0: the engine's default
}

func (c LoraConfig) spec() loraSpec {
	return loraSpec{Attn: c.TrainAttn, MLP: c.TrainMLP, Unembed: c.TrainUnembed}
}

// param is one LoRA matrix with its gradient accumulator and Adam moments.
type param struct {
	name  string // PEFT key
	shape []int
	w     []float64
	g     []float64
	m, v  []float64
}

// Adapter is one LoRA: weights, accumulated gradients, optimizer state, step count.
type Adapter struct {
	ID     string
	Config LoraConfig
	Step   int
	mods   []loraModule
	params []*param // A then B for each module, in loraModules order
	// pendingGrads is true between a forward_backward and the optim_step that consumes it.
	pendingGrads bool
	// Snapshot marks read-only sampler weights (LoadSnapshot): they take no LoRA slot.
	Snapshot bool
}

// CreateAdapter adds a LoRA with PEFT initialisation: A uniform(±1/√in) from the seed, B zero.
func (e *Engine) CreateAdapter(id string, cfg LoraConfig) (*Adapter, error) {
	if id == "" {
		return nil, inputErr(-1, "model_id", "empty adapter id")
	}
	if err := e.Info().ValidateLora(cfg); err != nil {
		return nil, err
	}
	if cfg.Alpha == 0 {
		cfg.Alpha = e.opts.LoraAlpha
	}
	a := e.newAdapter(id, cfg)
	for i, m := range a.mods {
		rng := rand.New(rand.NewPCG(uint64(cfg.Seed), uint64(i)))
		bound := 1 / math.Sqrt(float64(m.In))
		pa := a.params[2*i]
		for j := range pa.w {
			pa.w[j] = e.roundToDType((rng.Float64()*2 - 1) * bound)
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, ok := e.adapters[id]; ok {
		return nil, inputErr(-1, "model_id", "adapter %q already exists", id)
	}
	e.adapters[id] = a
	return a, nil
}

func (e *Engine) newAdapter(id string, cfg LoraConfig) *Adapter {
	a := &Adapter{ID: id, Config: cfg, mods: e.Config.loraModules(cfg.spec())}
	for _, m := range a.mods {
		for _, p := range []struct {
			suffix string
			shape  []int
		}{{"lora_A", []int{cfg.Rank, m.In}}, {"lora_B", []int{m.Out, cfg.Rank}}} {
			n := p.shape[0] * p.shape[1]
			a.params = append(a.params, &param{
				name:  "base_model.model." + m.Path + "." + p.suffix + ".weight",
				shape: p.shape, w: make([]float64, n), g: make([]float64, n),
				m: make([]float64, n), v: make([]float64, n)})
		}
	}
	return a
}

// DeleteAdapter forgets an adapter; it reports whether it existed.
func (e *Engine) DeleteAdapter(ctx context.Context, id string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	_, ok := e.adapters[id]
	delete(e.adapters, id)
	return ok
}

// HasAdapter reports whether id is loaded.
func (e *Engine) HasAdapter(ctx context.Context, id string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	_, ok := e.adapters[id]
	return ok
}

// AdapterInfo describes a loaded adapter.
func (e *Engine) AdapterInfo(ctx context.Context, id string) (LoraConfig, int, error) {
	if err := stopped(ctx); err != nil {
		return LoraConfig{}, 0, err
	}
	a, err := e.adapter(id)
	if err != nil {
		return LoraConfig{}, 0, err
	}
	return a.Config, a.Step, nil
}

func (e *Engine) adapter(id string) (*Adapter, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	a, ok := e.adapters[id]
	if !ok {
		return nil, fmt.Errorf("%w: %q", ErrUnknownAdapter, id)
	}
	return a, nil
}

// trainable is adapter for training calls: a sampler snapshot is refused.
func (e *Engine) trainable(id string) (*Adapter, error) {
	a, err := e.adapter(id)
	if err == nil && a.Snapshot {
		return nil, fmt.Errorf("%w: %q", ErrSnapshot, id)
	}
	return a, err
}

// AdamParams is Tinker's AdamParams.
type AdamParams struct {
	LearningRate float64 `json:"learning_rate"`
	Beta1        float64 `json:"beta1"`
	Beta2        float64 `json:"beta2"`
	Eps          float64 `json:"eps"`
	WeightDecay  float64 `json:"weight_decay"`
	GradClipNorm float64 `json:"grad_clip_norm"`
}

// DefaultAdamParams are the SDK's defaults.
func DefaultAdamParams() AdamParams {
	return AdamParams{LearningRate: 1e-4, Beta1: 0.9, Beta2: 0.95, Eps: 1e-12}
}

func (p AdamParams) validate() error {
	bad := func(f string, v float64) bool {
		return math.IsNaN(v) || math.IsInf(v, 0) || v < 0 || (f == "beta" && v >= 1)
	}
	switch {
	case bad("", p.LearningRate):
		return inputErr(-1, "adam_params.learning_rate", "must be a finite number ≥ 0, got %v", p.LearningRate)
	case bad("beta", p.Beta1):
		return inputErr(-1, "adam_params.beta1", "must be in [0, 1), got %v", p.Beta1)
	case bad("beta", p.Beta2):
		return inputErr(-1, "adam_params.beta2", "must be in [0, 1), got %v", p.Beta2)
	case bad("", p.Eps) || p.Eps == 0:
		// eps = 0 divides 0 by 0 for every weight whose gradients have all been zero.
		return inputErr(-1, "adam_params.eps", "must be a finite number > 0, got %v", p.Eps)
	case bad("", p.WeightDecay):
		return inputErr(-1, "adam_params.weight_decay", "must be a finite number ≥ 0, got %v", p.WeightDecay)
	case p.LearningRate*p.WeightDecay > 1:
		// Decoupled decay multiplies every weight by 1 − lr·wd: past 1 it flips their signs.
		return inputErr(-1, "adam_params.weight_decay", "learning_rate × weight_decay is %v, at most 1", p.LearningRate*p.WeightDecay)
	case bad("", p.GradClipNorm):
		return inputErr(-1, "adam_params.grad_clip_norm", "must be a finite number ≥ 0, got %v", p.GradClipNorm)
	}
	return nil
}

// OptimStep applies AdamW (decoupled weight decay, as torch.optim.AdamW) to the gradients
// accumulated since the last step, with optional global-norm clipping, then clears them.
//
// A cancelled ctx is only seen before the update starts: an update is never left half done.
func (e *Engine) OptimStep(ctx context.Context, id string, p AdamParams) (map[string]float64, error) {
	if err := stopped(ctx); err != nil {
		return nil, err
	}
	if err := p.validate(); err != nil {
		return nil, err
	}
	a, err := e.trainable(id)
	if err != nil {
		return nil, err
	}
	norm := gradNorm(a.params)
	if !isFinite(norm) {
		// Unreachable through the API (forward_backward refuses non-finite gradients); refused
		// all the same, changing nothing.
		return nil, inputErr(-1, "adam_params", "%v: the accumulated gradient norm is %v; step refused, nothing changed", ErrNonFinite, norm)
	}
	clip := 1.0
	if p.GradClipNorm > 0 && norm > p.GradClipNorm {
		clip = p.GradClipNorm / norm
	}
	t := float64(a.Step + 1)
	bc1 := 1 - math.Pow(p.Beta1, t)
	bc2 := 1 - math.Pow(p.Beta2, t)
	// adamUpdate is one element's step; it runs twice per element, first only to check that
	// every new weight and moment is finite (a huge learning rate, or an eps tiny against a
	// vanishing second moment, can overflow), then to apply the step. A refused step changes
	// nothing, and the arithmetic is the same both times, so what is checked is what is stored.
	adamUpdate := func(q *param, j int) (w, m, v float64) {
		g := q.g[j] * clip
		m = p.Beta1*q.m[j] + (1-p.Beta1)*g
		v = p.Beta2*q.v[j] + (1-p.Beta2)*g*g
		w = q.w[j] * (1 - p.LearningRate*p.WeightDecay)
		upd := p.LearningRate * (m / bc1) / (math.Sqrt(v/bc2) + p.Eps)
		return e.roundToDType(w - upd), m, v
	}
	for _, q := range a.params {
		for j := range q.w {
			if w, m, v := adamUpdate(q, j); !isFinite32(w) || !isFinite(m) || !isFinite(v) {
				return nil, inputErr(-1, "adam_params", "%v: the update of %s is not finite (weight %v, moments %v, %v) with learning_rate %v; step refused, nothing changed",
					ErrNonFinite, q.name, w, m, v, p.LearningRate)
			}
		}
	}
	a.Step++
	var updSq float64
	for _, q := range a.params {
		for j := range q.w {
			nw, m, v := adamUpdate(q, j)
			d := nw - q.w[j]
			updSq += d * d
			q.w[j], q.m[j], q.v[j] = nw, m, v
		}
		clear(q.g)
	}
	a.pendingGrads = false
	return map[string]float64{
		"grad_norm:mean":     norm,
		"update_norm:mean":   math.Sqrt(updSq),
		"learning_rate:mean": p.LearningRate,
		"step:max":           t,
	}, nil
}

// gradNorm is the global L2 norm of the accumulated gradients. A sum of squares that
// overflows (gradients near 1e154) is summed again scaled by the largest gradient.
func gradNorm(params []*param) float64 {
	var sq float64
	for _, q := range params {
		for _, g := range q.g {
			sq += g * g
		}
	}
	if !math.IsInf(sq, 1) {
		return math.Sqrt(sq)
	}
	var scale float64
	for _, q := range params {
		for _, g := range q.g {
			scale = max(scale, math.Abs(g))
		}
	}
	sq = 0
	for _, q := range params {
		for _, g := range q.g {
			sq += (g / scale) * (g / scale)
		}
	}
	return scale * math.Sqrt(sq)
}

// loraSpec says which linear layers carry LoRA.
type loraSpec struct {
	Attn, MLP, Unembed bool
}

func (s loraSpec) any() bool { return s.Attn || s.MLP || s.Unembed }

// loraModule is one adapted linear layer: HF module path and its dimensions.
type loraModule struct {
	Path    string // e.g. "model.layers.0.self_attn.q_proj", or "lm_head"
	In, Out int
}

// loraModules lists the adapted layers of a spec, in parameter order.
func (c *Config) loraModules(s loraSpec) []loraModule {
	D, F, hd := c.HiddenSize, c.IntermediateSize, c.HeadDim
	qd, kvd := c.NumAttentionHeads*hd, c.NumKeyValueHeads*hd
	var mods []loraModule
	if c.family().gatedAttention {
		qd *= 2 // each head's queries and its gate rows: Tinker's LoRA covers the whole output
	}
	for l := range c.NumHiddenLayers {
		p := c.layerPrefix(l)
		if s.Attn && c.isDeltaNet(l) {
			// Tinker's set on a DeltaNet layer (reference §4): the split q/k/v rows of in_proj_qkv,
			// z and out_proj; no LoRA on a, b or the conv.
			d := c.dnDims()
			a := p + "linear_attn."
			mods = append(mods,
				loraModule{a + "in_proj_q", D, d.Kd},
				loraModule{a + "in_proj_k", D, d.Kd},
				loraModule{a + "in_proj_v", D, d.Vd},
				loraModule{a + "in_proj_z", D, d.Vd},
				loraModule{a + "out_proj", d.Vd, D})
		} else if s.Attn {
			mods = append(mods,
				loraModule{p + "self_attn.q_proj", D, qd},
				loraModule{p + "self_attn.k_proj", D, kvd},
				loraModule{p + "self_attn.v_proj", D, kvd},
				loraModule{p + "self_attn.o_proj", c.NumAttentionHeads * hd, D})
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
