package engine

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/skein-ai/skein/internal/filebound"
	"github.com/skein-ai/skein/safetensors"
)

// Files of a saved adapter. adapter_model.safetensors and adapter_config.json are PEFT's own
// layout (they load in HF PEFT and vLLM as they are); the other two are skein's training state.
const (
	AdapterWeightsFile = "adapter_model.safetensors"
	AdapterConfigFile  = "adapter_config.json"
	OptimizerFile      = "optimizer.safetensors"
	TrainerStateFile   = "trainer_state.json"
)

type peftConfig struct {
	PeftType        string   `json:"peft_type"`
	TaskType        string   `json:"task_type"`
	BaseModel       string   `json:"base_model_name_or_path"`
	R               int      `json:"r"`
	LoraAlpha       float64  `json:"lora_alpha"`
	LoraDropout     float64  `json:"lora_dropout"`
	TargetModules   []string `json:"target_modules"`
	Bias            string   `json:"bias"`
	FanInFanOut     bool     `json:"fan_in_fan_out"`
	InferenceMode   bool     `json:"inference_mode"`
	InitLoraWeights bool     `json:"init_lora_weights"`
	ModulesToSave   []string `json:"modules_to_save"`
	UseRSLoRA       bool     `json:"use_rslora"`
	SkeinSeed       int64    `json:"skein_seed"`
}

type trainerState struct {
	Step int `json:"step"`
}

// SaveAdapter writes an adapter to dir. withOptimizer adds the Adam moments and step count
// (a training-state checkpoint); without it the directory is a sampler-only PEFT adapter.
func (e *Engine) SaveAdapter(ctx context.Context, id, dir string, withOptimizer bool) error {
	if err := stopped(ctx); err != nil {
		return err
	}
	a, err := e.adapter(id)
	if err != nil {
		return err
	}
	if withOptimizer && a.Snapshot { // a snapshot holds weights only
		return fmt.Errorf("%w: %q has no optimizer state to save", ErrSnapshot, id)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	weights := map[string]safetensors.Tensor{}
	opt := map[string]safetensors.Tensor{}
	for _, p := range a.params {
		weights[p.name] = p.tensor('w')
		if withOptimizer {
			opt[p.name+".exp_avg"] = p.tensor('m')
			opt[p.name+".exp_avg_sq"] = p.tensor('v')
			if a.pendingGrads { // right after optim_step the accumulator is zero: not worth writing
				opt[p.name+".grad_accum"] = p.tensor('g')
			}
		}
	}
	targets := map[string]bool{}
	for _, m := range a.mods {
		targets[m.Path[strings.LastIndex(m.Path, ".")+1:]] = true
	}
	var tm []string
	for t := range targets {
		tm = append(tm, t)
	}
	sort.Strings(tm)
	pc := peftConfig{PeftType: "LORA", TaskType: "CAUSAL_LM", BaseModel: cmp.Or(e.opts.Name, e.Dir), R: a.Config.Rank,
		LoraAlpha: a.Config.Alpha, TargetModules: tm, Bias: "none", InferenceMode: true, InitLoraWeights: true,
		SkeinSeed: a.Config.Seed}
	cb, _ := json.MarshalIndent(pc, "", "  ")
	if err := safetensors.WriteFile(filepath.Join(dir, AdapterWeightsFile), weights, map[string]string{"format": "pt"}); err != nil {
		return err
	}
	if err := writeFileAtomic(filepath.Join(dir, AdapterConfigFile), cb); err != nil {
		return err
	}
	if !withOptimizer {
		return nil
	}
	if err := safetensors.WriteFile(filepath.Join(dir, OptimizerFile), opt, nil); err != nil {
		return err
	}
	sb, _ := json.Marshal(trainerState{Step: a.Step})
	return writeFileAtomic(filepath.Join(dir, TrainerStateFile), sb)
}

// tensor is one of p's vectors as a file tensor in the state's own dtype: F32 from the float32
// engine (its optimizer file half the size the float64 state wrote), F64 from the float64 one.
// Loads take either (readTensors), so checkpoints of float64 state load on the float32 engine.
func (p *param) tensor(which byte) safetensors.Tensor {
	if p.s64 != nil {
		return safetensors.FromFloat64(hostOf(pick(p.s64, which)), p.fileShape()...)
	}
	return safetensors.FromFloat32(hostOf(pick(p.s32, which)), p.fileShape()...)
}

func writeFileAtomic(path string, b []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// ErrNoOptimizerState is returned when a load asks for optimizer state that was not saved.
var ErrNoOptimizerState = errors.New("checkpoint has no optimizer state")

// ReadAdapterConfig reads the LoRA config of a saved adapter.
func ReadAdapterConfig(dir string) (LoraConfig, error) {
	b, err := filebound.Read(filepath.Join(dir, AdapterConfigFile), maxAdapterConfigBytes)
	if err != nil {
		return LoraConfig{}, err
	}
	var pc peftConfig
	if err := json.Unmarshal(b, &pc); err != nil {
		return LoraConfig{}, fmt.Errorf("engine: %s: %w", AdapterConfigFile, err)
	}
	c := LoraConfig{Rank: pc.R, Alpha: pc.LoraAlpha, Seed: pc.SkeinSeed}
	for _, t := range pc.TargetModules {
		switch t {
		case "q_proj", "k_proj", "v_proj", "o_proj",
			"in_proj_q", "in_proj_k", "in_proj_v", "in_proj_z", "out_proj": // Qwen3.5's DeltaNet layers
			c.TrainAttn = true
		case "gate_proj", "up_proj", "down_proj",
			"w1", "w2", "w3": // a mixture of experts' experts, Tinker's names (moe.go)
			c.TrainMLP = true
		case "lm_head":
			c.TrainUnembed = true
		}
	}
	return c, nil
}

// LoadAdapter creates adapter id from a saved directory, replacing any adapter of that id.
// withOptimizer restores Adam moments and step (and fails if they were not saved);
// without it the optimizer starts fresh at step 0.
func (e *Engine) LoadAdapter(ctx context.Context, id, dir string, withOptimizer bool) error {
	return e.load(ctx, id, dir, withOptimizer, false)
}

// LoadSnapshot loads a saved directory's weights as a read-only sampler snapshot, replacing any
// adapter of that id: it takes no LoRA slot (TrainingAdapterIDs leaves it out).
func (e *Engine) LoadSnapshot(ctx context.Context, id, dir string) error {
	return e.load(ctx, id, dir, false, true)
}

func (e *Engine) load(ctx context.Context, id, dir string, withOptimizer, snapshot bool) error {
	if err := stopped(ctx); err != nil {
		return err
	}
	cfg, err := ReadAdapterConfig(dir)
	if err != nil {
		return fmt.Errorf("engine: loading adapter: %w", err)
	}
	if cfg.Rank < 1 || cfg.Rank > e.opts.MaxRank {
		return inputErr(-1, "path", "saved adapter has rank %d, outside [1, %d]", cfg.Rank, e.opts.MaxRank)
	}
	a := e.newAdapter(id, cfg)
	want := map[string][]int{}
	for _, p := range a.params {
		want[p.name] = p.fileShape()
	}
	weights, err := readTensors(filepath.Join(dir, AdapterWeightsFile), want, nil)
	if errors.Is(err, ErrTensorMismatch) && e.Config.lm() != "model." {
		// Tinker names a vision-language model's LoRA modules without the language_model. part
		// (base_model.model.model.layers.0.linear_attn.in_proj_q…, reference §4); PEFT and skein
		// with it. Either is read.
		alias := map[string][]int{}
		for name, shape := range want {
			alias[tinkerAdapterName(e.Config, name)] = shape
		}
		if w, err2 := readTensors(filepath.Join(dir, AdapterWeightsFile), alias, nil); err2 == nil {
			weights, err = map[string][]float64{}, nil
			for name := range want {
				weights[name] = w[tinkerAdapterName(e.Config, name)]
			}
		}
	}
	if err != nil {
		return fmt.Errorf("engine: loading adapter %s: %w", dir, err)
	}
	for _, p := range a.params {
		p.setFloat64s('w', weights[p.name])
	}
	if withOptimizer {
		want := map[string][]int{}
		optional := map[string]bool{}
		for _, p := range a.params {
			want[p.name+".exp_avg"], want[p.name+".exp_avg_sq"] = p.fileShape(), p.fileShape()
			want[p.name+".grad_accum"] = p.fileShape()
			optional[p.name+".grad_accum"] = true // saved with an empty accumulator
		}
		opt, err := readTensors(filepath.Join(dir, OptimizerFile), want, optional)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("engine: %s: %w", dir, ErrNoOptimizerState)
			}
			return fmt.Errorf("engine: loading optimizer state %s: %w", dir, err)
		}
		for _, p := range a.params {
			p.setFloat64s('m', opt[p.name+".exp_avg"])
			p.setFloat64s('v', opt[p.name+".exp_avg_sq"])
			if g, ok := opt[p.name+".grad_accum"]; ok {
				p.setFloat64s('g', g)
				a.pendingGrads = true
			}
		}
		sb, err := filebound.Read(filepath.Join(dir, TrainerStateFile), maxAdapterConfigBytes)
		if err != nil {
			return fmt.Errorf("engine: %w", err)
		}
		var ts trainerState
		if err := json.Unmarshal(sb, &ts); err != nil {
			return fmt.Errorf("engine: %s: %w", TrainerStateFile, err)
		}
		a.Step = ts.Step
	}
	a.Snapshot = snapshot
	if snapshot {
		// Read-only weights: no gradients or moments (three quarters of a training adapter's
		// memory), so many tenants' sampler copies fit beside the training adapters.
		for _, p := range a.params {
			p.dropState()
		}
	}
	e.mu.Lock()
	old := e.adapters[id]
	e.adapters[id] = a
	e.mu.Unlock()
	if old != nil { // replaced (a sampler's weights loaded again): no request can name the old ones
		e.base.prefix.forget(func(w weightsKey) bool { return w.adapter == old.uid })
	}
	return nil
}

// tinkerAdapterName is a PEFT tensor name as Tinker writes it for a vision-language model: the
// LM's modules under model. rather than model.language_model.
func tinkerAdapterName(c *Config, name string) string {
	return strings.Replace(name, "base_model.model."+c.lm(), "base_model.model.model.", 1)
}

// ErrTensorMismatch is returned for a checkpoint file whose tensors do not fit the adapter.
var ErrTensorMismatch = errors.New("checkpoint tensors do not match this adapter")

// readTensors reads a safetensors file that must hold exactly the tensors in want (those in
// optional may be absent), each of a float dtype and its expected shape. The file's size is
// checked against what those tensors can take before it is read, so a corrupt or hostile
// checkpoint is an error of this load: never a panic later, never an unbounded allocation.
func readTensors(path string, want map[string][]int, optional map[string]bool) (map[string][]float64, error) {
	fh, info, err := filebound.Open(path) // a regular file: a link to /dev/zero has size 0 and no end
	if err != nil {
		return nil, err
	}
	fh.Close()
	limit := int64(1 << 20) // header headroom
	for name, shape := range want {
		n := int64(1)
		for _, d := range shape {
			n *= int64(d)
		}
		limit += 8*n + int64(len(name)+128)
	}
	if info.Size() > limit {
		return nil, fmt.Errorf("%w: %s is %d bytes, more than its tensors can take (%d)", ErrTensorMismatch, path, info.Size(), limit)
	}
	b, err := filebound.Read(path, limit)
	if err != nil {
		return nil, err
	}
	f, err := safetensors.Parse(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	out := make(map[string][]float64, len(want))
	for name, t := range f.Tensors {
		shape, ok := want[name]
		switch {
		case !ok:
			return nil, fmt.Errorf("%w: unexpected tensor %s (saved for another model or config?)", ErrTensorMismatch, name)
		case !slices.Equal(t.Shape, shape):
			return nil, fmt.Errorf("%w: tensor %s has shape %v, this adapter needs %v", ErrTensorMismatch, name, t.Shape, shape)
		case t.DType != "F32" && t.DType != "F64" && t.DType != "BF16" && t.DType != "F16":
			return nil, fmt.Errorf("%w: tensor %s has dtype %s, want a float type", ErrTensorMismatch, name, t.DType)
		}
		if out[name], err = t.Float64(); err != nil {
			return nil, fmt.Errorf("tensor %s: %w", name, err)
		}
	}
	for name := range want {
		if _, ok := out[name]; !ok && !optional[name] {
			return nil, fmt.Errorf("%w: %s lacks %s (saved for another model or config?)", ErrTensorMismatch, path, name)
		}
	}
	return out, nil
}
