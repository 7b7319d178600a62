package gateway

// REST listings of training runs, and their paging.

import (
	"maps"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"time"

	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/checkpoint"
)

func paging(r *http.Request) (offset, limit int, err error) {
	limit = 20
	if v := r.URL.Query().Get("limit"); v != "" {
		if limit, err = strconv.Atoi(v); err != nil || limit < 1 || limit > 1000 {
			return 0, 0, errf(http.StatusBadRequest, "limit must be an integer in [1, 1000]")
		}
	}
	if v := r.URL.Query().Get("offset"); v != "" {
		if offset, err = strconv.Atoi(v); err != nil || offset < 0 {
			return 0, 0, errf(http.StatusBadRequest, "offset must be a non-negative integer")
		}
	}
	return offset, limit, nil
}

func page[T any](items []T, offset, limit int) []T {
	if offset >= len(items) {
		return []T{}
	}
	return items[offset:min(len(items), offset+limit)]
}

// runRow and runRowFrom are called with s.runs.mu and s.ckpts.mu held.
func (s *Server) runRow(run *trainingRun, live bool) runListing {
	return s.runRowFrom(run, s.indexCheckpoints(), live)
}

// runListing is a listed run, with, when asked (`include=state`, the console's skein
// extension), what the console needs to show it as it is: its step and whether it is working,
// idle or gone. Without it a listing is Tinker's, key for key (the recorded SDK traffic pins it).
type runListing struct {
	api.TrainingRun
	Step      *int   `json:"step,omitempty"`
	State     string `json:"state,omitempty"`      // "running" (an op running or queued), "idle", "expired" (unloaded or its session expired)
	QueuedOps *int   `json:"queued_ops,omitempty"` // ops waiting behind the running one
}

// wantsState reports whether a listing request asked for the runs' live state.
func wantsState(r *http.Request) bool { return r.URL.Query().Get("include") == "state" }

// liveStateOf is called with s.runs.mu held (the lock order of queueOf: runs, then the queue).
func liveStateOf(run *trainingRun) (state string, queued int) {
	if !run.ready {
		return "expired", 0
	}
	if q := run.queue; q != nil {
		q.mu.Lock()
		defer q.mu.Unlock()
		if q.running || q.ops > 0 {
			return "running", q.ops
		}
	}
	return "idle", 0
}

func (s *Server) runRowFrom(run *trainingRun, idx ckptIndex, live bool) runListing {
	tr := api.TrainingRun{TrainingRunID: run.id, BaseModel: run.baseModel, ModelOwner: run.tenant, IsLora: true,
		LoraRank: run.lora.Rank, LastRequestTime: run.lastRequest.UTC().Format(time.RFC3339Nano), UserMetadata: run.metadata}
	tr.ProjectID = run.project
	if m := idx.newest[[2]string{run.id, checkpoint.KindWeights}]; m != nil {
		c := s.ckptRow(m)
		tr.LastCheckpoint = &c
	}
	if m := idx.newest[[2]string{run.id, checkpoint.KindSamplerWeights}]; m != nil {
		c := s.ckptRow(m)
		tr.LastSamplerCheckpoint = &c
	}
	if !live {
		return runListing{TrainingRun: tr}
	}
	state, queued := liveStateOf(run)
	step := run.step
	return runListing{TrainingRun: tr, Step: &step, State: state, QueuedOps: &queued}
}

func (s *Server) listRuns(w http.ResponseWriter, r *http.Request, tenant string) (any, error) {
	offset, limit, err := paging(r)
	if err != nil {
		return nil, err
	}
	listed, err := runFilter(r, tenant)
	if err != nil {
		return nil, err
	}
	otherRuns, err := s.otherRuns(r.Context(), tenant)
	if err != nil {
		return nil, err
	}
	otherCkpts, err := s.otherCheckpoints(r.Context(), tenant)
	if err != nil {
		return nil, err
	}
	s.runs.mu.Lock()
	defer s.runs.mu.Unlock()
	s.ckpts.mu.Lock()
	defer s.ckpts.mu.Unlock()
	var runs []*trainingRun
	idx := s.indexCheckpoints(otherCkpts...)
	for _, run := range append(slices.Collect(maps.Values(s.runs.m)), otherRuns...) {
		if listed(run, idx) {
			runs = append(runs, run)
		}
	}
	sort.Slice(runs, func(i, j int) bool { return runs[i].created.Before(runs[j].created) })
	rows := []runListing{}
	for _, run := range page(runs, offset, limit) {
		rows = append(rows, s.runRowFrom(run, idx, wantsState(r)))
	}
	return struct {
		TrainingRuns []runListing `json:"training_runs"`
		Cursor       api.Cursor   `json:"cursor"`
	}{rows, api.Cursor{Offset: offset, Limit: limit, TotalCount: len(runs)}}, nil
}

func (s *Server) getRun(w http.ResponseWriter, r *http.Request, tenant string) (any, error) {
	run, err := s.accessibleRun(r, tenant, r.PathValue("id"))
	if err != nil {
		return nil, err
	}
	s.runs.mu.Lock()
	defer s.runs.mu.Unlock()
	s.ckpts.mu.Lock()
	defer s.ckpts.mu.Unlock()
	return s.runRow(run, wantsState(r)), nil
}
