// Package engine is skein's compute: it loads a Llama/Qwen-family model from a Hugging Face
// directory and trains and samples many LoRA adapters over one shared copy of its weights.
//
// Its matmuls run on skein's own kernels (internal/kernels) where the CPU path has them and on
// GoMLX's pure-Go backend otherwise; only internal/tensor imports GoMLX, so the compute can be
// swapped without touching the engine's model code, let alone the service.
package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"

	"github.com/skein-ai/skein/engine/internal/backend"
	"github.com/skein-ai/skein/engine/internal/backend/cpu"
	"github.com/skein-ai/skein/engine/internal/backend/cuda"
	"github.com/skein-ai/skein/engine/internal/quant"
	"github.com/skein-ai/skein/engine/tokenizer"
	"github.com/skein-ai/skein/safetensors"
)

// Options tune an engine. The zero value is the production default.
type Options struct {
	// Float64 computes in float64: slow, for gradient checks.
	Float64 bool
	// MaxRank bounds LoRA rank (default 128).
	MaxRank int
	// LoraAlpha is PEFT's lora_alpha; the scale is alpha/rank (default 32).
	LoraAlpha float64
	// MaxBatchTokens bounds B×T of one pass; bigger batches run in chunks (default 8192).
	MaxBatchTokens int
	// MaxStepBytes bounds the activations one pass holds, estimated from the model's shape;
	// batches that would need more run in smaller chunks (default 4 GiB).
	MaxStepBytes int
	// Precision of the base weights in memory: "f32" (the default; "" too) or "bf16", which
	// keeps the projections and the embedding in bfloat16 (half the memory), widened per
	// product. Computation is in float32 (float64 with Float64) either way.
	Precision string
	// GGMLActivations computes the forward products of quantized base weights (q8_0, q4_k,
	// q4_k_m) as llama.cpp's CPU backend does: each input row rounded to 8-bit blocks (Q8_0 per
	// 32 for Q8_0 weights, Q8_K per 256 for Q4_K and Q6_K), integer dot products with the
	// blocks, so logits equal llama.cpp's on the same GGUF (within 1e-3 on the tiny models).
	// Input gradients still multiply by the dequantized weights (straight-through) and LoRA
	// terms stay float32. No effect on float32 or bf16 bases. Slower (scalar Go).
	GGMLActivations bool
	// Device is where the engine computes: "auto" (or ""), "cpu", "cuda" or "cuda:N" (--device).
	// The CUDA backend finds its libraries and compiles its kernels but does not run the model
	// yet: cuda and cuda:N are refused with that said, and auto computes on the CPU, logging why.
	Device string
	// Name is the model as its users know it (the served name, e.g. Qwen/Qwen3-8B): saved
	// adapters name it as their base_model_name_or_path, so they load elsewhere. Default: Dir.
	Name string
	// Logger gets Load's progress lines (what it loads, how far it has read, the total and
	// the time taken); nil: none.
	Logger *slog.Logger
	// KVCacheMB bounds the sampler's prefix cache across requests (prefixcache.go): keys and
	// values of prompts' leading blocks, kept so that a later prompt starting with the same
	// tokens on the same weights prefills only the rest. 0: no cache (the zero value, so a
	// library user and the tests opt in); serve and worker set it from --kv-cache-mb.
	KVCacheMB int
	// PrefillChunk bounds the row-tokens of one prefill pass of a request joining a running
	// sampling loop (SampleContinuous): the loop's rows take a decode step between two such
	// passes, so none waits for more than one chunk. 0: DefaultPrefillChunk.
	PrefillChunk int
	// weightFormats, set by tests only, picks each projection's block format under a quantized
	// precision in place of the precision's rule (weightFormat), e.g. to quantize only the MLP.
	weightFormats func(name string) *quant.Format
}

// Engine is one loaded base model plus the adapters trained on it.
type Engine struct {
	Config    *Config
	Tokenizer *tokenizer.Tokenizer // nil if the directory has no tokenizer.json
	Dir       string

	opts    Options
	invFreq []float64
	device  string // where it computes, and for auto why (chooseDevice)

	mu       sync.Mutex
	adapters map[string]*Adapter
	base     *baseModel // base weights, compiled matmuls, step buffers: shared by forks
	// recomputeProbs decides per sequence length whether the backward pass recomputes attention
	// probabilities (Config.recomputesProbs; tests force either way).
	recomputeProbs func(T int) bool
	keepMerged     *bool // nil: keepsMerged decides by size; tests force either way
	recompute      *bool // nil: recomputesLayers decides by size; tests force either way
	headTile       int   // rows of a tile of the head (0: headTileRows decides); tests set it
	pairsChunk     int   // outputs of a chunk of a quantized weight's pairs (0: the backend decides); tests set it
	attnChunk      int   // query rows of a chunk of a forward-only pass's attention (0: attnChunkRows decides); tests set it
	keepFFNActs    bool  // tests: the feed-forward block's backward keeps its buffers to the layer's end, as it once did
	// layerHook, set by tests only, is called before each decoder layer of every pass.
	layerHook func(layer int)
	// decodeHook, set by tests only, is called with the rows of every decode loop.
	decodeHook func(rows int)
	// prefillLimit, set by tests only, replaces prefillTokens (row-tokens of one prefill pass).
	prefillLimit int
	// stepHook, set by tests only, is called with the rows and tokens of every sampler pass.
	stepHook func(B, T int)
	// prefilled counts the prompts the sampler prefilled once for all their samples (tests).
	prefilled atomic.Int64
	// noPrefixShare, set by benchmarks only, prefills every sample's row (as before sharing).
	noPrefixShare bool
}

// DefaultPrefillChunk is Options.PrefillChunk's default: on the small preset and 2 cores a pass
// of 256 row-tokens costs about three decode steps of 8 rows.
const DefaultPrefillChunk = 256

// MaxPrefillChunk bounds Options.PrefillChunk (prefillTokens: a bigger chunk is a whole prefill).
const MaxPrefillChunk = prefillTokens

// MaxKVCacheMB bounds Options.KVCacheMB (1 TiB): a larger cap is a typo, not a plan.
const MaxKVCacheMB = 1 << 20

// Device says where the engine computes, and for --device auto why there.
func (e *Engine) Device() string { return e.device }

// Fork returns an engine over the same base weights (shared, read-only, never copied) and the
// same compiled matmuls, with its own adapters: one per replica of a base model.
func (e *Engine) Fork() *Engine {
	return &Engine{Config: e.Config, Tokenizer: e.Tokenizer, Dir: e.Dir, opts: e.opts, device: e.device,
		invFreq: e.invFreq, adapters: map[string]*Adapter{}, base: e.base,
		recomputeProbs: e.recomputeProbs}
}

// AdapterIDs lists the loaded adapters.
func (e *Engine) AdapterIDs(ctx context.Context) []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	ids := make([]string, 0, len(e.adapters))
	for id := range e.adapters {
		ids = append(ids, id)
	}
	return ids
}

// TrainingAdapterIDs lists the loaded adapters that are not sampler snapshots.
func (e *Engine) TrainingAdapterIDs(ctx context.Context) []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var ids []string
	for id, a := range e.adapters {
		if !a.Snapshot {
			ids = append(ids, id)
		}
	}
	return ids
}

// CompileStats counts compilations: one one-node matmul per distinct shape.
type CompileStats = cpu.CompileStats

// float is the element type of a pass: float32 in production, float64 for gradient checks.
type float = backend.Float

// mat is a tensor of a step or a weight; a step hands a pass's tensors out, takes them back and
// runs the ops on them (internal/backend).
type (
	mat[E float]  = backend.Tensor[E]
	step[E float] = backend.Step[E]
)

// newStep starts a step on the engine's backend.
func newStep[E float](e *Engine) step[E] {
	return cpu.NewStep[E](e.base.cpu, backend.StepOptions{GGML: e.opts.GGMLActivations, PairsChunk: e.pairsChunk})
}

// The --activations names: how the forward products of quantized base weights treat their input
// rows (Options.GGMLActivations).
const (
	ActivationsF32  = "f32"  // float32 rows times the dequantized weights (the default)
	ActivationsGGML = "ggml" // rows rounded to 8-bit blocks, integer dots: llama.cpp's CPU values
)

// ParseActivations is Options.GGMLActivations for an --activations name ("" is f32).
func ParseActivations(s string) (bool, error) {
	switch s {
	case "", ActivationsF32:
		return false, nil
	case ActivationsGGML:
		return true, nil
	}
	return false, fmt.Errorf("engine: unknown activations %q (f32, ggml)", s)
}

// CheckPrecision refuses a precision of base weights that Load would refuse ("" is f32).
func CheckPrecision(p string) error {
	switch p {
	case "", PrecisionF32, PrecisionBF16, PrecisionQ8_0, PrecisionQ4_K, PrecisionQ6_K, PrecisionQ4_K_M:
		return nil
	}
	return fmt.Errorf("engine: unknown precision %q (f32, bf16, q8_0, q4_k, q6_k, q4_k_m)", p)
}

// Load opens a model directory (config.json, safetensors weights, optional tokenizer.json), or
// a GGUF file (gguf_load.go).
func Load(dir string, opts Options) (*Engine, error) {
	if IsGGUF(dir) {
		return loadGGUF(dir, opts)
	}
	cfg, err := LoadConfig(dir)
	if err != nil {
		return nil, err
	}
	host, progress, err := loadWeights(dir, cfg, opts.Logger)
	if err != nil {
		return nil, err
	}
	var tok *tokenizer.Tokenizer
	if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err == nil {
		tok, err = tokenizer.Load(filepath.Join(dir, "tokenizer.json"))
		if err != nil {
			return nil, fmt.Errorf("engine: %w", err)
		}
	}
	tensors := len(host) // loading takes the tensors out of host as it places them
	e, err := newEngine(dir, cfg, host, tok, opts)
	if err != nil {
		return nil, err
	}
	progress.done(dir, tensors) // after newEngine: converting the weights is part of the wait
	return e, nil
}

func newEngine(dir string, cfg *Config, host map[string]safetensors.Tensor, tok *tokenizer.Tokenizer, opts Options) (*Engine, error) {
	if opts.MaxRank == 0 {
		opts.MaxRank = 128
	}
	if opts.LoraAlpha == 0 {
		opts.LoraAlpha = 32
	}
	if opts.MaxBatchTokens == 0 {
		opts.MaxBatchTokens = 8192
	}
	if opts.MaxStepBytes == 0 {
		opts.MaxStepBytes = 4 << 30
	}
	if err := CheckPrecision(opts.Precision); err != nil {
		return nil, err
	}
	if opts.PrefillChunk < 0 || opts.PrefillChunk > MaxPrefillChunk {
		return nil, fmt.Errorf("engine: a prefill chunk of %d tokens, outside [0, %d]", opts.PrefillChunk, MaxPrefillChunk)
	}
	if opts.KVCacheMB < 0 || opts.KVCacheMB > MaxKVCacheMB {
		return nil, fmt.Errorf("engine: a prefix cache of %d MB, outside [0, %d]", opts.KVCacheMB, MaxKVCacheMB)
	}
	device, err := chooseDevice(opts)
	if err != nil {
		return nil, err
	}
	if opts.Precision == "" {
		opts.Precision = PrecisionF32
	}
	if quantFormat(opts.Precision) != nil && opts.Float64 {
		return nil, fmt.Errorf("engine: %s weights run in float32 passes, not float64", opts.Precision)
	}
	cpuBackend, err := cpu.New(opts.MaxStepBytes)
	if err != nil {
		return nil, err
	}
	e := &Engine{Config: cfg, Tokenizer: tok, Dir: dir, opts: opts, device: device,
		adapters: map[string]*Adapter{}, invFreq: cfg.invFreq(),
		recomputeProbs: cfg.recomputesProbs}
	// Free step buffers are kept up to one step budget (MaxStepBytes).
	e.base = &baseModel{cpu: cpuBackend, prefix: newPrefixCache(int64(opts.KVCacheMB) << 20)}
	if e.opts.Float64 {
		e.base.weights, e.base.bytes, err = loadModel[float64](opts, cfg, host)
	} else {
		e.base.weights, e.base.bytes, err = loadModel[float32](opts, cfg, host)
	}
	if err != nil {
		return nil, err
	}
	if cfg.VisionConfig != nil {
		var n int
		if e.opts.Float64 {
			e.base.vision, n, err = loadVisionTower[float64](cfg, host)
		} else {
			e.base.vision, n, err = loadVisionTower[float32](cfg, host)
		}
		if err != nil {
			return nil, err
		}
		e.base.bytes += n
	}
	return e, nil
}

// PeakStepBytes is the most activation memory one training or forward pass has held so far
// (base weights excluded), to compare with Options.MaxStepBytes.
func (e *Engine) PeakStepBytes() int { return e.base.cpu.Pool.Peak() }

// WeightBytes is the memory the base weights take (shared by forks).
func (e *Engine) WeightBytes() int { return e.base.bytes }

// CompileStats reports matmul compilations so far (one per distinct shape).
func (e *Engine) CompileStats() CompileStats { return e.base.cpu.Pool.Stats() }

// Errors for callers to map to user faults.
var (
	ErrInvalidInput   = errors.New("invalid input")
	ErrUnknownAdapter = errors.New("unknown adapter")
	// ErrSnapshot: a training call (forward_backward, optim_step) on a read-only sampler snapshot.
	ErrSnapshot = errors.New("adapter is a read-only sampler snapshot")
)

// InputError is a user fault in one datum or field, with nothing changed.
type InputError struct {
	Datum int    // -1 when not about one datum
	Field string // e.g. "loss_fn_inputs.weights"
	Msg   string
}

func (e *InputError) Error() string {
	if e.Datum >= 0 {
		return fmt.Sprintf("datum %d: %s: %s", e.Datum, e.Field, e.Msg)
	}
	if e.Field != "" {
		return fmt.Sprintf("%s: %s", e.Field, e.Msg)
	}
	return e.Msg
}

func (e *InputError) Unwrap() error { return ErrInvalidInput }

func inputErr(datum int, field, format string, args ...any) error {
	return &InputError{Datum: datum, Field: field, Msg: fmt.Sprintf(format, args...)}
}

// bucket rounds n up to a power of two, at least lo; past 2^40 (no real length) it is n itself,
// so a hostile size can neither overflow the doubling nor loop forever.
func bucket(n, lo int) int {
	b := max(lo, 1)
	for b < n {
		if b > 1<<40 {
			return n
		}
		b *= 2
	}
	return b
}

// AdapterBytes is the memory the loaded adapters hold (training adapters and sampler snapshots):
// weights, gradient accumulators and optimizer moments, in the engine's element type.
func (e *Engine) AdapterBytes() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, a := range e.adapters {
		for _, p := range a.params {
			n += p.bytes()
		}
	}
	return n
}

// chooseDevice decides --device: the CPU, the only backend that runs the model today. An
// explicit GPU is refused, saying why (no GPU, no library, or the backend not running the model
// yet); auto takes the CPU and says what it saw (Engine.Device).
func chooseDevice(opts Options) (string, error) {
	kind, _, err := cuda.ParseDevice(opts.Device)
	if err != nil {
		return "", err
	}
	if kind == "cpu" {
		return "cpu", nil
	}
	var choice cuda.Choice
	if kind == "auto" {
		choice, err = autoDevice()
	} else {
		choice, err = cuda.SelectDevice(opts.Device)
	}
	if kind == "cuda" {
		if err != nil {
			return "", fmt.Errorf("engine: --device %s: %w", opts.Device, err)
		}
		return "", fmt.Errorf("engine: --device %s (%s): the CUDA backend finds its libraries and compiles its kernels but does not run the model yet; use --device cpu", opts.Device, choice.Info.Name)
	}
	why := choice.Why
	if choice.CUDA {
		why = fmt.Sprintf("%s (%s) found, but the CUDA backend does not run the model yet", choice, choice.Info.Name)
	}
	return "cpu (auto: " + why + ")", nil
}

// autoDevice is --device auto's probe, made once a process (it loads the driver and NVRTC).
var autoDevice = sync.OnceValues(func() (cuda.Choice, error) { return cuda.SelectDevice("auto") })
