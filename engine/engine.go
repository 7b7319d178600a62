// Package engine is skein's compute: it loads a Llama/Qwen-family model from a Hugging Face
// directory and trains and samples many LoRA adapters over one shared copy of its weights.
//
// It is built on GoMLX's pure-Go backend; nothing outside this package imports GoMLX, so the
// compute can be swapped without touching the service.
package engine

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/gobackend"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"

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
}

// Engine is one loaded base model plus the adapters trained on it.
type Engine struct {
	Config    *Config
	Tokenizer *tokenizer.Tokenizer // nil if the directory has no tokenizer.json
	Dir       string

	opts      Options
	backend   compute.Backend
	dtype     dtypes.DType
	baseNames []string
	base      []*tensors.Tensor
	invFreq   []float64

	mu       sync.Mutex
	adapters map[string]*Adapter
	graphs   *graphCache // shared by forks
	direct   *directBase // shared by forks
}

// graphCache holds the compiled graphs, shared by every fork of a base model: graphs depend on
// the model and the LoRA spec, not on which replica runs them.
type graphCache struct {
	mu         sync.Mutex
	execs      map[string]*graph.Exec
	compiles   CompileStats
	seenGraphs map[*graph.Graph]bool
}

// Fork returns an engine over the same base weights (shared, read-only, never copied) and the
// same compiled graphs, with its own adapters: one per replica of a base model.
func (e *Engine) Fork() *Engine {
	return &Engine{Config: e.Config, Tokenizer: e.Tokenizer, Dir: e.Dir, opts: e.opts, backend: e.backend,
		dtype: e.dtype, baseNames: e.baseNames, base: e.base, invFreq: e.invFreq,
		adapters: map[string]*Adapter{}, graphs: e.graphs, direct: e.direct}
}

// AdapterIDs lists the loaded adapters.
func (e *Engine) AdapterIDs() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	ids := make([]string, 0, len(e.adapters))
	for id := range e.adapters {
		ids = append(ids, id)
	}
	return ids
}

// CompileStats counts graph compilations, which happen once per (graph kind, bucketed shape).
type CompileStats struct {
	Count int
	Total time.Duration
}

// sharedBackend is GoMLX's Go backend with unlimited worker parallelism. With the default (a pool of
// 2×GOMAXPROCS workers) graph nodes running in parallel deadlock GoMLX v0.28.2 when several large
// matmuls each wait in Saturate for workers the others hold (seen at batch 8 × 256 on the small
// preset); "ops_sequential" avoids that but leaves every element-wise op on one core (2× slower).
// Unlimited parallelism has no pool to exhaust: each matmul still splits into GOMAXPROCS workers.
// SKEIN_GOBACKEND_CONFIG overrides the setting for experiments.
var sharedBackend = sync.OnceValues(func() (compute.Backend, error) {
	cfg := os.Getenv("SKEIN_GOBACKEND_CONFIG")
	if cfg == "" {
		cfg = "parallelism=-1"
	}
	// The backend prints its parallelism setting to stdout; keep stdout for our own output.
	stdout := os.Stdout
	if devnull, err := os.Open(os.DevNull); err == nil {
		os.Stdout = devnull
		defer func() { os.Stdout = stdout; devnull.Close() }()
	}
	return gobackend.New(cfg)
})

// Load opens a model directory (config.json, safetensors weights, optional tokenizer.json).
func Load(dir string, opts Options) (*Engine, error) {
	cfg, err := LoadConfig(dir)
	if err != nil {
		return nil, err
	}
	host, err := loadWeights(dir, cfg)
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
	return newEngine(dir, cfg, host, tok, opts)
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
	backend, err := sharedBackend()
	if err != nil {
		return nil, fmt.Errorf("engine: starting compute backend: %w", err)
	}
	e := &Engine{Config: cfg, Tokenizer: tok, Dir: dir, opts: opts, backend: backend,
		dtype: dtypes.Float32, adapters: map[string]*Adapter{},
		graphs:  &graphCache{execs: map[string]*graph.Exec{}, seenGraphs: map[*graph.Graph]bool{}},
		invFreq: cfg.invFreq()}
	if opts.Float64 {
		e.dtype = dtypes.Float64
	}
	e.baseNames = cfg.weightNames()
	for _, name := range e.baseNames {
		v, err := host[name].Float64()
		if err != nil {
			return nil, fmt.Errorf("engine: weight %s: %w", name, err)
		}
		t := hostTensor{shape: host[name].Shape, data: v}
		if isLinearWeight(name) {
			t = transpose2D(t)
		}
		bt := e.tensor(t.data, t.shape...)
		// On the device now, once: later graph calls (several at a time) only read it.
		if err := bt.MaterializeOnDevice(backend, backend.HasSharedBuffers(), 0); err != nil {
			return nil, fmt.Errorf("engine: placing weight %s: %w", name, err)
		}
		e.base = append(e.base, bt)
		delete(host, name)
	}
	if err := e.initDirect(); err != nil {
		return nil, err
	}
	return e, nil
}

// isLinearWeight reports the weights stored pre-transposed to [in,out] (all projections and an untied lm_head).
func isLinearWeight(name string) bool {
	return strings.HasSuffix(name, "_proj.weight") || name == "lm_head.weight"
}

func transpose2D(t hostTensor) hostTensor {
	r, c := t.shape[0], t.shape[1]
	out := make([]float64, len(t.data))
	for i := range r {
		for j := range c {
			out[j*r+i] = t.data[i*c+j]
		}
	}
	return hostTensor{shape: []int{c, r}, data: out}
}

// tensor makes a backend tensor of the engine dtype from float64 values.
func (e *Engine) tensor(v []float64, dims ...int) *tensors.Tensor {
	if e.dtype == dtypes.Float64 {
		return tensors.FromFlatDataAndDimensions(append([]float64(nil), v...), dims...)
	}
	f := make([]float32, len(v))
	for i, x := range v {
		f[i] = float32(x)
	}
	return tensors.FromFlatDataAndDimensions(f, dims...)
}

func (e *Engine) scalar(v float64) *tensors.Tensor {
	if e.dtype == dtypes.Float64 {
		return tensors.FromScalar(v)
	}
	return tensors.FromScalar(float32(v))
}

// values copies a tensor's contents out as float64 and frees it.
func values(t *tensors.Tensor) []float64 {
	defer t.FinalizeAll()
	var out []float64
	switch t.DType() {
	case dtypes.Float64:
		out = tensors.MustCopyFlatData[float64](t)
	case dtypes.Float32:
		f := tensors.MustCopyFlatData[float32](t)
		out = make([]float64, len(f))
		for i, x := range f {
			out[i] = float64(x)
		}
	}
	return out
}

func shapeOf(dt dtypes.DType, dims ...int) shapes.Shape { return shapes.Make(dt, dims...) }

// roundToDType rounds v to what the engine's dtype can hold, so stored weights equal what the
// graph sees and a float32 save/load round-trips exactly.
func (e *Engine) roundToDType(v float64) float64 {
	if e.dtype == dtypes.Float32 {
		return float64(float32(v))
	}
	return v
}

// exec returns (building on first use) the executable for a graph kind.
func (e *Engine) exec(key string, build func(in []*graph.Node) []*graph.Node) *graph.Exec {
	c := e.graphs
	c.mu.Lock()
	defer c.mu.Unlock()
	if x, ok := c.execs[key]; ok {
		return x
	}
	x := graph.MustNewExec(e.backend, build).WithName(key)
	x.SetMaxCache(256)
	c.execs[key] = x
	return x
}

// call runs an executable, turning GoMLX panics into errors and counting compilations.
func (e *Engine) call(x *graph.Exec, args []*tensors.Tensor) (out []*tensors.Tensor, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("engine: compute failed: %v\n%s", r, debug.Stack())
		}
	}()
	anyArgs := make([]any, len(args))
	for i, a := range args {
		anyArgs[i] = a
	}
	start := time.Now()
	out, g, err := x.CallWithGraph(anyArgs...)
	if err != nil {
		return nil, fmt.Errorf("engine: compute failed: %w", err)
	}
	c := e.graphs
	c.mu.Lock()
	if !c.seenGraphs[g] {
		// A graph seen for the first time was just built and compiled; the time includes one run.
		c.seenGraphs[g] = true
		c.compiles.Count++
		c.compiles.Total += time.Since(start)
	}
	c.mu.Unlock()
	return out, nil
}

// PeakStepBytes is the most activation memory one training or forward pass has held so far
// (base weights excluded), to compare with Options.MaxStepBytes.
func (e *Engine) PeakStepBytes() int {
	e.direct.mm.mu.Lock()
	defer e.direct.mm.mu.Unlock()
	return e.direct.mm.peakBytes
}

// CompileStats reports compilations so far: the sampler's graphs and the training pass's
// matmuls (one per distinct shape).
func (e *Engine) CompileStats() CompileStats {
	e.graphs.mu.Lock()
	s := e.graphs.compiles
	e.graphs.mu.Unlock()
	if e.direct != nil {
		m := e.direct.mm.stats()
		s.Count += m.Count
		s.Total += m.Total
	}
	return s
}

// ropeTables returns cos and sin [B,T,hd] for the given absolute positions [B][T].
func (e *Engine) ropeTables(pos [][]int) (*tensors.Tensor, *tensors.Tensor) {
	hd := e.Config.HeadDim
	B, T := len(pos), len(pos[0])
	cos := make([]float64, B*T*hd)
	sin := make([]float64, B*T*hd)
	for b := range B {
		for t := range T {
			base := (b*T + t) * hd
			for i, f := range e.invFreq {
				a := float64(pos[b][t]) * f
				c, s := math.Cos(a), math.Sin(a)
				cos[base+i], cos[base+i+hd/2] = c, c
				sin[base+i], sin[base+i+hd/2] = s, s
			}
		}
	}
	return e.tensor(cos, B, T, hd), e.tensor(sin, B, T, hd)
}

// Errors for callers to map to user faults.
var (
	ErrInvalidInput   = errors.New("invalid input")
	ErrUnknownAdapter = errors.New("unknown adapter")
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

// bucket rounds n up to a power of two, at least lo.
func bucket(n, lo int) int {
	b := lo
	for b < n {
		b *= 2
	}
	return b
}
