package engine

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"

	"github.com/skein-ai/skein/engine/internal/backend"
	"github.com/skein-ai/skein/engine/internal/backend/cpu"
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

// param is one LoRA matrix with its gradient accumulator and Adam moments, kept in the engine's
// element type: float32 on the float32 engine (16 bytes a parameter rather than 32: an 8B
// model's rank-32 adapter is 1.5 GB, not 2.9), float64 on the float64 engine, whose tests check
// gradients by finite differences. Exactly one of s32, s64 is set (nil both: never).
type param struct {
	name  string // PEFT key
	shape []int
	file  []int // its shape in a file: shape, or Tinker's 3-D one of an expert LoRA
	s32   *paramState[float32]
	s64   *paramState[float64]
}

// paramState is a param's numbers as the backend keeps them: weights, accumulated gradient,
// Adam's two moments. A sampler snapshot holds w only (g, m, v empty).
type paramState[E float] struct{ w, g, m, v mat[E] }

// numbersOf is p's numbers in the element type E of the engine that made it.
func numbersOf[E float](p *param) *paramState[E] {
	if s, ok := any(p.s32).(*paramState[E]); ok {
		return s
	}
	return any(p.s64).(*paramState[E])
}

// newParam allocates a param of the engine's element type, zeroed.
func (e *Engine) newParam(name string, shape []int, withState bool) *param {
	p := &param{name: name, shape: shape}
	if e.opts.Float64 {
		p.s64 = newParamState[float64](shape, withState)
	} else {
		p.s32 = newParamState[float32](shape, withState)
	}
	return p
}

func newParamState[E float](shape []int, withState bool) *paramState[E] {
	s := &paramState[E]{w: cpu.NewParam[E](shape...)}
	if withState {
		s.g, s.m, s.v = cpu.NewParam[E](shape...), cpu.NewParam[E](shape...), cpu.NewParam[E](shape...)
	}
	return s
}

// backendParam is p as the backend's optimizer takes it.
func backendParam[E float](p *param) backend.Param[E] {
	q := numbersOf[E](p)
	return backend.Param[E]{W: q.w, G: q.g, M: q.m, V: q.v}
}

// fileShape is p's shape in an adapter file.
func (p *param) fileShape() []int {
	if p.file != nil {
		return p.file
	}
	return p.shape
}

// size is the number of the param's weights.
func (p *param) size() int { return p.shape[0] * p.shape[1] }

// bytes is the memory p's numbers hold.
func (p *param) bytes() int {
	n := 0
	count := func(ts ...[]int) {
		for _, d := range ts {
			if d != nil {
				n += p.size()
			}
		}
	}
	if p.s64 != nil {
		count(p.s64.w.Dims, p.s64.g.Dims, p.s64.m.Dims, p.s64.v.Dims)
		return 8 * n
	}
	count(p.s32.w.Dims, p.s32.g.Dims, p.s32.m.Dims, p.s32.v.Dims)
	return 4 * n
}

// float64s widens one of p's vectors ('w', 'g', 'm', 'v') for a file or a test (nil: p has
// none); the float64 engine's are its own numbers.
func (p *param) float64s(which byte) []float64 {
	if p.s64 != nil {
		return hostOf(pick(p.s64, which))
	}
	v := hostOf(pick(p.s32, which))
	if v == nil {
		return nil
	}
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = float64(x)
	}
	return out
}

// hostOf is a param tensor's numbers on the host (nil for an empty one).
func hostOf[E float](t mat[E]) []E {
	if t.Dims == nil {
		return nil
	}
	return cpu.Values(t)
}

func pick[E float](s *paramState[E], which byte) mat[E] {
	switch which {
	case 'w':
		return s.w
	case 'g':
		return s.g
	case 'm':
		return s.m
	}
	return s.v
}

// setFloat64s narrows v (a file's numbers) into one of p's vectors, a new tensor.
func (p *param) setFloat64s(which byte, v []float64) {
	if p.s64 != nil {
		setPicked(p.s64, which, cpu.ParamOf[float64](v, p.shape...))
		return
	}
	setPicked(p.s32, which, cpu.ParamOf[float32](v, p.shape...))
}

func setPicked[E float](s *paramState[E], which byte, v mat[E]) {
	switch which {
	case 'w':
		s.w = v
	case 'g':
		s.g = v
	case 'm':
		s.m = v
	default:
		s.v = v
	}
}

// dropState forgets p's gradient and moments (a sampler snapshot's weights).
func (p *param) dropState() {
	if p.s64 != nil {
		p.s64.g, p.s64.m, p.s64.v = mat[float64]{}, mat[float64]{}, mat[float64]{}
	} else {
		p.s32.g, p.s32.m, p.s32.v = mat[float32]{}, mat[float32]{}, mat[float32]{}
	}
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
	// scratch is the gradient sums ([][]float32 or [][]float64) of a forward_backward that ran
	// with gradients pending, kept for the next such one until the optim_step: as big as the
	// adapter's weights, it would otherwise be garbage every accumulated batch.
	scratchMu sync.Mutex
	scratch   any
	// uid is the adapter's identity in the sampler's prefix cache (unique in the process, never
	// reused: a deleted and recreated adapter of the same name is another), and version counts
	// changes of its weights as a sequence lock: odd while an optimizer step writes them. Cached
	// keys and values are named by both (prefixcache.go).
	uid     uint64
	version atomic.Uint64
}

// adapterUIDs hands out Adapter.uid (0 is the base model's).
var adapterUIDs atomic.Uint64

// weightsKey is the prefix cache's name for the weights a pass of a (nil: the base model) runs
// with now, and whether they are settled (no optimizer step writing them).
func weightsKeyOf(a *Adapter) (weightsKey, bool) {
	if a == nil {
		return weightsKey{}, true
	}
	v := a.version.Load()
	return weightsKey{adapter: a.uid, version: v}, v%2 == 0
}

// batchGrads is zeroed gradient sums for one forward_backward over a (given back by putGrads).
func batchGrads[E float](a *Adapter, st step[E]) []mat[E] {
	a.scratchMu.Lock()
	g, _ := a.scratch.([]mat[E])
	a.scratch = nil
	a.scratchMu.Unlock()
	if g == nil {
		g = make([]mat[E], len(a.params))
		for i, q := range a.params {
			g[i] = cpu.NewParam[E](q.shape...)
		}
		return g
	}
	st.Clear(g...)
	return g
}

func putGrads[E float](a *Adapter, g []mat[E]) {
	a.scratchMu.Lock()
	a.scratch = g
	a.scratchMu.Unlock()
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
		w := make([]float64, pa.size())
		for j := range w {
			w[j] = (rng.Float64()*2 - 1) * bound
		}
		pa.setFloat64s('w', w)
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
	a := &Adapter{ID: id, Config: cfg, mods: e.Config.loraModules(cfg.spec()), uid: adapterUIDs.Add(1)}
	for _, m := range a.mods {
		for _, p := range []struct {
			suffix      string
			shape, file []int
		}{{"lora_A", m.aShape(cfg.Rank), m.aFile(cfg.Rank)}, {"lora_B", m.bShape(cfg.Rank), m.bFile(cfg.Rank)}} {
			q := e.newParam("base_model.model."+m.Path+"."+p.suffix+".weight", p.shape, true)
			q.file = p.file
			a.params = append(a.params, q)
		}
	}
	return a
}

// DeleteAdapter forgets an adapter; it reports whether it existed.
func (e *Engine) DeleteAdapter(ctx context.Context, id string) bool {
	e.mu.Lock()
	a, ok := e.adapters[id]
	delete(e.adapters, id)
	e.mu.Unlock()
	if ok { // no request can name its weights again: its cached prefixes go now, not by LRU
		e.base.prefix.forget(func(w weightsKey) bool { return w.adapter == a.uid })
	}
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
	var metrics map[string]float64
	if e.opts.Float64 {
		metrics, err = adamStep[float64](e, a, p)
	} else {
		metrics, err = adamStep[float32](e, a, p)
	}
	return metrics, err
}

// adamStep is OptimStep over an adapter whose numbers are of type E, by the backend's AdamW (the
// arithmetic is float64 whatever E is: each number widened as it is read and narrowed as it is
// stored).
func adamStep[E float](e *Engine, a *Adapter, p AdamParams) (map[string]float64, error) {
	st := newStep[E](e)
	defer st.Free()
	ps := make([]backend.Param[E], len(a.params))
	gs := make([]mat[E], len(a.params))
	for i, pr := range a.params {
		ps[i] = backendParam[E](pr)
		gs[i] = ps[i].G
	}
	norm := st.GradNorm(gs)
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
	h := backend.AdamW{LR: p.LearningRate, Beta1: p.Beta1, Beta2: p.Beta2, Eps: p.Eps, WeightDecay: p.WeightDecay,
		Clip: clip, BC1: 1 - math.Pow(p.Beta1, t), BC2: 1 - math.Pow(p.Beta2, t)}
	// The weights change under the prefix cache's name for them: odd while they do, and a new
	// even version after (weightsKeyOf), so no cached keys and values of the old weights serve
	// the new ones.
	a.version.Add(1)
	defer func() {
		now := a.version.Add(1)
		// The old weights' cached prefixes can serve no request again: they go now, not by LRU.
		e.base.prefix.forget(func(w weightsKey) bool { return w.adapter == a.uid && w.version < now })
	}()
	updSq, bad, w, m, v := st.AdamW(ps, h)
	if bad >= 0 {
		return nil, inputErr(-1, "adam_params", "%v: the update of %s is not finite (weight %v, moments %v, %v) with learning_rate %v; step refused, nothing changed",
			ErrNonFinite, a.params[bad].name, w, m, v, p.LearningRate)
	}
	a.Step++
	st.Clear(gs...)
	a.pendingGrads = false
	// The next forward_backward sums into the zero accumulator in place; a batch-sums buffer kept
	// from gradient accumulation would be a fifth copy of the adapter held while it idles.
	a.scratchMu.Lock()
	a.scratch = nil
	a.scratchMu.Unlock()
	return map[string]float64{
		"grad_norm:mean":     norm,
		"update_norm:mean":   math.Sqrt(updSq),
		"learning_rate:mean": p.LearningRate,
		"step:max":           t,
	}, nil
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
	// Experts > 0: a mixture of experts' projection in Tinker's shared-outer layout (moe.go):
	// gate and up (In D, Out E·I) share A [r, D] and stack B_e into [E·I, r]; down (ExpertA;
	// In I, Out D) stacks A_e into [E·r, I] and shares B [D, r].
	Experts int
	ExpertA bool
}

// aShape and bShape are the module's A and B as the engine keeps them, at rank r.
func (m loraModule) aShape(r int) []int {
	if m.ExpertA {
		return []int{m.Experts * r, m.In}
	}
	return []int{r, m.In}
}

func (m loraModule) bShape(r int) []int { return []int{m.Out, r} }

// aFile and bFile are their shapes in an adapter file: Tinker's 3-D ones for experts (a size-1
// leading axis on the shared factor), the plain ones otherwise.
func (m loraModule) aFile(r int) []int {
	switch {
	case m.ExpertA:
		return []int{m.Experts, r, m.In}
	case m.Experts > 0:
		return []int{1, r, m.In}
	}
	return m.aShape(r)
}

func (m loraModule) bFile(r int) []int {
	switch {
	case m.ExpertA:
		return []int{1, m.Out, r}
	case m.Experts > 0:
		return []int{m.Experts, m.Out / m.Experts, r}
	}
	return m.bShape(r)
}

// params is how many numbers the module's LoRA has at rank r.
func (m loraModule) params(r int) int {
	a, b := m.aShape(r), m.bShape(r)
	return a[0]*a[1] + b[0]*b[1]
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
				loraModule{Path: a + "in_proj_q", In: D, Out: d.Kd},
				loraModule{Path: a + "in_proj_k", In: D, Out: d.Kd},
				loraModule{Path: a + "in_proj_v", In: D, Out: d.Vd},
				loraModule{Path: a + "in_proj_z", In: D, Out: d.Vd},
				loraModule{Path: a + "out_proj", In: d.Vd, Out: D})
		} else if s.Attn {
			mods = append(mods,
				loraModule{Path: p + "self_attn.q_proj", In: D, Out: qd},
				loraModule{Path: p + "self_attn.k_proj", In: D, Out: kvd},
				loraModule{Path: p + "self_attn.v_proj", In: D, Out: kvd},
				loraModule{Path: p + "self_attn.o_proj", In: c.NumAttentionHeads * hd, Out: D})
		}
		if s.MLP && c.isMoE(l) {
			mods = append(mods, c.expertLoRAModules(l)...)
		} else if s.MLP {
			mods = append(mods,
				loraModule{Path: p + "mlp.gate_proj", In: D, Out: F},
				loraModule{Path: p + "mlp.up_proj", In: D, Out: F},
				loraModule{Path: p + "mlp.down_proj", In: F, Out: D})
		}
	}
	if s.Unembed {
		mods = append(mods, loraModule{Path: "lm_head", In: D, Out: c.VocabSize})
	}
	return mods
}
