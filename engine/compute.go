package engine

import (
	"context"
	"errors"
	"fmt"
	"math"
)

// ErrNonFinite marks a computation that produced NaN or ±Inf (logits, a loss, gradients, an
// optimizer update): the request fails and nothing it would have changed is changed.
var ErrNonFinite = errors.New("non-finite values")

// ModelInfo is what callers need to validate requests for a model without holding its weights
// (a gateway in front of remote workers).
type ModelInfo struct {
	Config       *Config `json:"config"`
	MaxRank      int     `json:"max_rank"`
	HasTokenizer bool    `json:"has_tokenizer"`
}

// Info describes the loaded model.
func (e *Engine) Info() ModelInfo {
	return ModelInfo{Config: e.Config, MaxRank: e.opts.MaxRank, HasTokenizer: e.Tokenizer != nil}
}

// ValidateLora checks a LoRA config as CreateAdapter would, without creating anything.
func (m ModelInfo) ValidateLora(cfg LoraConfig) error {
	if cfg.Rank < 1 || cfg.Rank > m.MaxRank {
		return inputErr(-1, "lora_config.rank", "rank %d out of range [1, %d]", cfg.Rank, m.MaxRank)
	}
	if !cfg.spec().any() {
		return inputErr(-1, "lora_config", "at least one of train_attn, train_mlp, train_unembed must be true")
	}
	if cfg.Alpha < 0 || math.IsNaN(cfg.Alpha) || math.IsInf(cfg.Alpha, 0) {
		return inputErr(-1, "lora_config.alpha", "alpha must be a positive number")
	}
	return nil
}

// ValidateAdam checks optimizer parameters.
func ValidateAdam(p AdamParams) error { return p.validate() }

// Compute is the engine as a replica uses it: implemented by *Engine in process and by the worker
// client over HTTP.
//
// Every call but Info (a description fixed at load, never a round trip) takes a context: a
// remote call is aborted when it ends, and a pass stops between layers, between the chunks of a
// chunked batch and between decode steps, returning an error that wraps ctx.Err() and leaving
// the adapter as it was (see Engine.run).
type Compute interface {
	Info() ModelInfo
	HasAdapter(ctx context.Context, id string) bool
	AdapterIDs(ctx context.Context) []string
	// TrainingAdapterIDs lists the adapters that take a LoRA slot: those made by CreateLora or
	// LoadAdapter, not the read-only sampler snapshots of LoadSnapshot.
	TrainingAdapterIDs(ctx context.Context) []string
	CreateLora(ctx context.Context, id string, cfg LoraConfig) error
	LoadAdapter(ctx context.Context, id, dir string, withOptimizer bool) error
	// LoadSnapshot loads saved weights as a read-only sampler snapshot (no optimizer state, no
	// LoRA slot): for sampling only.
	LoadSnapshot(ctx context.Context, id, dir string) error
	SaveAdapter(ctx context.Context, id, dir string, withOptimizer bool) error
	DeleteAdapter(ctx context.Context, id string) bool
	AdapterInfo(ctx context.Context, id string) (LoraConfig, int, error)
	// ForwardBatch runs a batch made by ModelInfo.PrepareBatch: with backward, accumulating the
	// adapter's gradients; without, changing nothing (id "" is the bare base model).
	ForwardBatch(ctx context.Context, id string, b *Batch, backward bool) (*ForwardResult, error)
	OptimStep(ctx context.Context, id string, p AdamParams) (map[string]float64, error)
	SampleBatch(ctx context.Context, id string, reqs []SampleRequest) ([]*SampleResult, error)
}

// CreateLora is CreateAdapter for the Compute interface.
func (e *Engine) CreateLora(ctx context.Context, id string, cfg LoraConfig) error {
	if err := stopped(ctx); err != nil {
		return err
	}
	_, err := e.CreateAdapter(id, cfg)
	return err
}

// ErrCancelled wraps the context's error when a call stops because its context ended.
var ErrCancelled = errors.New("engine: call cancelled")

// stopped is nil while ctx runs, else its error wrapped (errors.Is finds both ErrCancelled and
// context.Canceled or context.DeadlineExceeded).
func stopped(ctx context.Context) error {
	if ctx == nil {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%w: %w", ErrCancelled, err)
	}
	return nil
}

var _ Compute = (*Engine)(nil)

type turnsKey struct{}

// WithTurns returns ctx carrying give, which long work calls between the layers of its passes
// (training, forwards, and each prefill and decode step): whoever runs the engine serves others'
// short work there (the replica runs queued sampling batches), so one large op does not hold
// everyone else for its whole length. give runs on the caller's goroutine, in the middle of the
// op: it must not change the adapter the op is working on.
func WithTurns(ctx context.Context, give func()) context.Context {
	return context.WithValue(ctx, turnsKey{}, give)
}

type turnWantedKey struct{}

// WithTurnWanted returns ctx carrying wanted, on which whoever gives turns (WithTurns) signals
// that short work is waiting for one. A compute whose layers run elsewhere (a remote worker's
// client: it cannot call GiveTurn between layers it does not run) waits on it while its call is
// in flight and gives the turn then; the short work it runs goes to the worker, which serves it
// between the layers of the call in flight.
func WithTurnWanted(ctx context.Context, wanted <-chan struct{}) context.Context {
	return context.WithValue(ctx, turnWantedKey{}, wanted)
}

// TurnWanted is ctx's WithTurnWanted channel, or nil (a nil channel never receives).
func TurnWanted(ctx context.Context) <-chan struct{} {
	if ctx == nil {
		return nil
	}
	ch, _ := ctx.Value(turnWantedKey{}).(<-chan struct{})
	return ch
}

// GiveTurn calls ctx's WithTurns function, if any.
func GiveTurn(ctx context.Context) {
	if ctx == nil {
		return
	}
	if give, ok := ctx.Value(turnsKey{}).(func()); ok {
		give()
	}
}
