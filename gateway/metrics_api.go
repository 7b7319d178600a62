package gateway

// Per-step training metrics: every optim_step's metrics and the loss of the forward_backwards
// before it, kept in the state store (a bounded window per run) and listed by
// GET /api/v1/training_runs/{id}/metrics, for the console's charts and for scripts.
// (gateway/metrics.go is the Prometheus endpoint.)

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/store"
)

// metricStepsKept is how many of a run's newest steps the store keeps.
const metricStepsKept = 10000

// stepTally gathers a run's forward_backward metrics until its next optim_step. It is
// guarded by s.runs.mu.
type stepTally struct {
	count   int
	metrics map[string]float64
}

// noteForwardBackwardMetrics adds a forward_backward's metrics to its run's next step record
// (a forward-only call trains nothing and is left out).
func (s *Server) noteForwardBackwardMetrics(run *trainingRun, forwardOnly bool, metrics map[string]float64) {
	if forwardOnly {
		return
	}
	s.runs.mu.Lock()
	defer s.runs.mu.Unlock()
	acc := &run.pendingStep
	if acc.metrics == nil {
		acc.metrics = map[string]float64{}
	}
	acc.count++
	for k, v := range metrics {
		if strings.HasSuffix(k, ":sum") {
			acc.metrics[k] += v
		} else {
			acc.metrics[k] = v
		}
	}
}

// recordStepMetrics stores the step an optim_step just took. A failure to store it is logged,
// never the step's: the metrics are a record, not part of the training state.
func (s *Server) recordStepMetrics(run *trainingRun, step int, optim map[string]float64) {
	s.runs.mu.Lock()
	acc := run.pendingStep
	run.pendingStep = stepTally{}
	s.runs.mu.Unlock()
	rec := api.StepMetrics{ForwardBackwards: acc.count, ForwardBackward: finiteOnly(acc.metrics), OptimStep: finiteOnly(optim)}
	if sum, tokens := rec.ForwardBackward["loss:sum"], rec.ForwardBackward["num_tokens:sum"]; tokens > 0 {
		if loss := sum / tokens; !math.IsNaN(loss) && !math.IsInf(loss, 0) {
			rec.Loss = &loss
		}
	}
	data, err := json.Marshal(rec)
	if err != nil {
		s.logErr("step metrics", err)
		return
	}
	s.logErr("step metrics", s.st.AddStepMetric(context.Background(),
		store.StepMetric{RunID: run.id, Step: int64(step), At: time.Now(), Data: data}, metricStepsKept))
}

// finiteOnly drops NaN and infinite values, which JSON cannot carry.
func finiteOnly(m map[string]float64) map[string]float64 {
	if len(m) == 0 {
		return nil
	}
	out := make(map[string]float64, len(m))
	for k, v := range m {
		if !math.IsNaN(v) && !math.IsInf(v, 0) {
			out[k] = v
		}
	}
	return out
}

// runMetrics is the listing with the run's state (runs.go's runListing), so a console polling
// the steps sees whether more are coming.
type runMetrics struct {
	api.TrainingRunMetricsResponse
	State     string `json:"state"`
	QueuedOps int    `json:"queued_ops"`
}

// getRunMetrics lists a run's steps after after_step, at most limit of them (default and most:
// metricStepsKept). Tenancy is get_training_run's: another tenant's run is a 404.
func (s *Server) getRunMetrics(w http.ResponseWriter, r *http.Request, tenant string) (any, error) {
	run, err := s.accessibleRun(r, tenant, r.PathValue("id"))
	if err != nil {
		return nil, err
	}
	after, limit := int64(0), metricStepsKept
	if v := r.URL.Query().Get("after_step"); v != "" {
		if after, err = strconv.ParseInt(v, 10, 64); err != nil || after < 0 {
			return nil, errf(http.StatusBadRequest, "after_step must be a non-negative integer")
		}
	}
	if v := r.URL.Query().Get("limit"); v != "" {
		if limit, err = strconv.Atoi(v); err != nil || limit < 1 || limit > metricStepsKept {
			return nil, errf(http.StatusBadRequest, "limit must be an integer in [1, %d]", metricStepsKept)
		}
	}
	rows, err := s.st.StepMetrics(r.Context(), run.id, after, limit+1)
	if err != nil {
		return nil, err
	}
	s.runs.mu.Lock()
	step := run.step
	state, queued := liveStateOf(run)
	s.runs.mu.Unlock()
	resp := runMetrics{TrainingRunMetricsResponse: api.TrainingRunMetricsResponse{TrainingRunID: run.id, Step: step,
		Steps: []api.StepMetrics{}, RetainedSteps: metricStepsKept}, State: state, QueuedOps: queued}
	if len(rows) > limit {
		rows, resp.HasMore = rows[:limit], true
	}
	for _, row := range rows {
		var m api.StepMetrics
		if err := json.Unmarshal(row.Data, &m); err != nil {
			return nil, fmt.Errorf("step %d of run %s: %w", row.Step, run.id, err)
		}
		m.Step, m.Time = row.Step, row.At.Format(time.RFC3339Nano)
		resp.Steps = append(resp.Steps, m)
	}
	return resp, nil
}
