package engine

import (
	"errors"
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

// ValidateBatch checks a forward/forward_backward batch without running it.
func (m ModelInfo) ValidateBatch(data []Datum, loss string, cfg map[string]float64) error {
	_, err := prepareFor(m.Config, data, loss, cfg)
	return err
}

// ValidateAdam checks optimizer parameters.
func ValidateAdam(p AdamParams) error { return p.validate() }

// Compute is the engine as a replica uses it: implemented by *Engine in process and by the worker
// client over HTTP.
type Compute interface {
	Info() ModelInfo
	HasAdapter(id string) bool
	AdapterIDs() []string
	CreateLora(id string, cfg LoraConfig) error
	LoadAdapter(id, dir string, withOptimizer bool) error
	SaveAdapter(id, dir string, withOptimizer bool) error
	DeleteAdapter(id string) bool
	AdapterInfo(id string) (LoraConfig, int, error)
	Forward(id string, data []Datum, loss string, cfg map[string]float64) (*ForwardResult, error)
	ForwardBackward(id string, data []Datum, loss string, cfg map[string]float64) (*ForwardResult, error)
	OptimStep(id string, p AdamParams) (map[string]float64, error)
	SampleBatch(id string, reqs []SampleRequest) ([]*SampleResult, error)
}

// CreateLora is CreateAdapter for the Compute interface.
func (e *Engine) CreateLora(id string, cfg LoraConfig) error {
	_, err := e.CreateAdapter(id, cfg)
	return err
}

var _ Compute = (*Engine)(nil)
