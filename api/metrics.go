package api

// StepMetrics is one optimizer step of a training run, as GET /api/v1/training_runs/{id}/metrics
// lists it.
type StepMetrics struct {
	Step int64  `json:"step"` // the run's optimizer step count after this step (1 for the first)
	Time string `json:"time"` // RFC 3339, when the step finished
	// Loss is the mean loss per token of the forward_backwards since the previous step
	// (loss:sum / num_tokens:sum); absent when there were none, or no tokens.
	Loss *float64 `json:"loss,omitempty"`
	// ForwardBackwards is how many forward_backwards went into the step; ForwardBackward sums
	// their ":sum" metrics and keeps the last value of the others.
	ForwardBackwards int                `json:"forward_backwards"`
	ForwardBackward  map[string]float64 `json:"forward_backward,omitempty"`
	OptimStep        map[string]float64 `json:"optim_step,omitempty"` // what optim_step reported
}

// TrainingRunMetricsResponse answers GET /api/v1/training_runs/{id}/metrics: the run's steps
// after after_step, oldest first. Only the newest steps of a run are kept (RetainedSteps).
type TrainingRunMetricsResponse struct {
	TrainingRunID string        `json:"training_run_id"`
	Step          int           `json:"step"` // optimizer steps the run has taken (its newest step)
	Steps         []StepMetrics `json:"steps"`
	HasMore       bool          `json:"has_more"` // more steps follow the last one listed
	RetainedSteps int           `json:"retained_steps"`
}
