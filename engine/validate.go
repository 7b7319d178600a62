package engine

import "math"

// ValidateLora checks a LoRA config as CreateAdapter would, without creating anything.
func (e *Engine) ValidateLora(cfg LoraConfig) error {
	if cfg.Rank < 1 || cfg.Rank > e.opts.MaxRank {
		return inputErr(-1, "lora_config.rank", "rank %d out of range [1, %d]", cfg.Rank, e.opts.MaxRank)
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
func (e *Engine) ValidateBatch(data []Datum, loss string, cfg map[string]float64) error {
	_, err := e.prepare(data, loss, cfg)
	return err
}

// ValidateAdam checks optimizer parameters.
func ValidateAdam(p AdamParams) error { return p.validate() }

// ValidateSample checks (and fills defaults of) a sampling request without running it.
func (e *Engine) ValidateSample(r *SampleRequest) error { return e.validateSample(r) }
