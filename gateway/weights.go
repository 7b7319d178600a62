package gateway

// Weights of a training run: save_weights, save_weights_for_sampler, load_weights, weights_info.

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/checkpoint"
	"github.com/skein-ai/skein/replica"
)

func (s *Server) saveWeights(w http.ResponseWriter, r *http.Request, tenant string) (any, error) {
	var req api.SaveWeightsRequest
	if err := s.decodeJSON(r, &req); err != nil {
		return nil, err
	}
	run, err := s.usedRun(tenant, req.ModelID)
	if err != nil {
		return nil, err
	}
	name := req.Path
	if name == "" {
		name = fmt.Sprintf("ckpt-%s", time.Now().UTC().Format("20060102T150405.000"))
		name = strings.ReplaceAll(name, ".", "-")
	}
	p := checkpoint.Path{ModelID: run.id, Kind: checkpoint.KindWeights, Name: name}
	return s.submitOrdered(r, tenant, run, req.SeqID, "SaveWeights", func() error {
		return s.checkNewCheckpoint(p, req.Overwrite, req.TTLSeconds)
	}, func(ctx context.Context, rep *replica.Replica, a replica.Adapter) (any, error) {
		if err := s.writeCheckpoint(ctx, rep, a, run, p, true, req.TTLSeconds); err != nil {
			return nil, err
		}
		return api.SaveWeightsResponse{Path: p.String(), Type: "save_weights"}, nil
	})
}

func (s *Server) checkNewCheckpoint(p checkpoint.Path, overwrite bool, ttl *int64) error {
	if err := checkpoint.ValidName(p.Name); err != nil {
		return err
	}
	if err := checkTTL(ttl); err != nil {
		return err
	}
	exists := s.ckpts.get(p.String()) != nil
	run := s.runs.get(p.ModelID)
	if exists && !overwrite {
		return fmt.Errorf("checkpoint %s already exists (set overwrite to replace it)", p)
	}
	if run != nil {
		return s.checkQuota(run.tenant, p, 0)
	}
	return nil
}

// writeCheckpoint saves an adapter's state under the data directory and records it.
func (s *Server) writeCheckpoint(ctx context.Context, rep *replica.Replica, a replica.Adapter, run *trainingRun, p checkpoint.Path, withOptimizer bool, ttl *int64) error {
	start := time.Now()
	gen := randomHex(8)
	meta := &ckptMeta{Path: p.String(), Owner: run.tenant, BaseModel: run.baseModel, Generation: gen, Lora: run.lora, parsed: p}
	var previous string // object storage: the generation this one replaces, removed once the row names the new one
	if old := s.ckpts.get(p.String()); old != nil && s.objectStorage() {
		previous = s.ckptDir(old)
	}
	dir := s.ckptDir(meta)
	tmp := dir + checkpoint.PartialMark + randomHex(4)
	if s.objectStorage() {
		tmp = dir // a fresh generation's prefix: nothing to replace, nothing to rename
	}
	if err := rep.SaveTo(ctx, a, tmp, withOptimizer); err != nil {
		s.removeTree(tmp)
		return err
	}
	if err := s.checkQuota(run.tenant, p, s.treeSize(tmp)); err != nil {
		s.removeTree(tmp)
		return err
	}
	if !s.objectStorage() {
		// An overwrite moves the acknowledged checkpoint aside rather than removing it first, so
		// a crash at any point leaves it or the new one (recovered at start: recoverCheckpoints).
		if err := checkpoint.Replace(tmp, dir); err != nil {
			os.RemoveAll(tmp)
			return err
		}
	}
	meta.Created, meta.Size = time.Now().UTC(), s.treeSize(dir)
	if ttl != nil {
		t := meta.Created.Add(time.Duration(*ttl) * time.Second)
		meta.ExpiresAt = &t
	}
	if err := s.saveMeta(meta); err != nil {
		return err
	}
	s.ckpts.add(meta.Path, meta)
	if previous != "" && previous != dir {
		s.logErr("removing an overwritten checkpoint's files", s.removeTree(previous))
	}
	s.updateRun(run, func(run *trainingRun) {
		if p.Kind == checkpoint.KindWeights {
			run.lastCkpt = meta.Path
		} else {
			run.lastSamplerCkpt = meta.Path
		}
	})
	s.dropSamplerCopies(meta.Path) // an overwrite: copies of the old weights are stale
	s.trail.record(run.tenant, "checkpoint.save", run.id, meta.Path, p.Kind)
	s.recordCheckpoint(run, meta.Path, start)
	return nil
}

func (s *Server) saveWeightsForSampler(w http.ResponseWriter, r *http.Request, tenant string) (any, error) {
	var req api.SaveWeightsRequest
	if err := s.decodeJSON(r, &req); err != nil {
		return nil, err
	}
	run, err := s.usedRun(tenant, req.ModelID)
	if err != nil {
		return nil, err
	}
	if req.Path != "" {
		p := checkpoint.Path{ModelID: run.id, Kind: checkpoint.KindSamplerWeights, Name: req.Path}
		return s.submitOrdered(r, tenant, run, req.SeqID, "SaveWeightsForSampler", func() error {
			return s.checkNewCheckpoint(p, true, req.TTLSeconds)
		}, func(ctx context.Context, rep *replica.Replica, a replica.Adapter) (any, error) {
			if err := s.writeCheckpoint(ctx, rep, a, run, p, false, req.TTLSeconds); err != nil {
				return nil, err
			}
			return api.SaveWeightsForSamplerResponse{Path: p.String(), Type: "save_weights_for_sampler"}, nil
		})
	}
	// Ephemeral: a sampler over a snapshot of the adapter as it is at this seq_id.
	smp := &sampler{id: "samp-" + randomHex(8), tenant: tenant, session: run.session, baseModel: run.baseModel}
	smp.engineID = "sampler:" + smp.id
	smp.dir = filepath.Join(s.opts.DataDir, "ephemeral", smp.id)
	return s.submitOrdered(r, tenant, run, req.SeqID, "SaveWeightsForSampler", func() error { return nil }, func(ctx context.Context, rep *replica.Replica, a replica.Adapter) (any, error) {
		smp.rep = rep // the snapshot lives where the adapter is
		if err := rep.Snapshot(ctx, a, weightsOf(smp)); err != nil {
			return nil, err
		}
		s.registerSampler(smp, run.session)
		return api.SaveWeightsForSamplerResponse{SamplingSessionID: smp.id, Type: "save_weights_for_sampler"}, nil
	})
}

func (s *Server) loadWeights(w http.ResponseWriter, r *http.Request, tenant string) (any, error) {
	var req api.LoadWeightsRequest
	if err := s.decodeJSON(r, &req); err != nil {
		return nil, err
	}
	run, err := s.usedRun(tenant, req.ModelID)
	if err != nil {
		return nil, err
	}
	var meta *ckptMeta
	return s.submitOrdered(r, tenant, run, req.SeqID, "LoadWeights", func() error {
		var err error
		if meta, err = s.checkpointFor(r.Context(), tenant, req.Path); err != nil {
			return err
		}
		if meta.BaseModel != run.baseModel {
			return fmt.Errorf("checkpoint was trained on %s, this model is %s", meta.BaseModel, run.baseModel)
		}
		if req.Optimizer && meta.parsed.Kind != checkpoint.KindWeights {
			return fmt.Errorf("%s is a sampler checkpoint: it has no optimizer state", req.Path)
		}
		return nil
	}, func(ctx context.Context, rep *replica.Replica, a replica.Adapter) (any, error) {
		// The replica loads it, tells the run its new config and step, and saves it as the
		// run's current state.
		if _, _, err := rep.LoadFrom(ctx, a, s.ckptDir(meta), req.Optimizer); err != nil {
			return nil, err
		}
		s.trail.record(tenant, "checkpoint.load", run.id, meta.Path, "")
		return api.LoadWeightsResponse{Path: req.Path, Type: "load_weights"}, nil
	})
}

func (s *Server) weightsInfo(w http.ResponseWriter, r *http.Request, tenant string) (any, error) {
	var req api.WeightsInfoRequest
	if err := s.decodeJSON(r, &req); err != nil {
		return nil, err
	}
	m, err := s.checkpointFor(r.Context(), tenant, req.TinkerPath)
	if err != nil {
		return nil, err
	}
	return api.WeightsInfoResponse{BaseModel: m.BaseModel, IsLora: true, LoraRank: m.Lora.Rank,
		TrainUnembed: m.Lora.TrainUnembed, TrainMLP: m.Lora.TrainMLP, TrainAttn: m.Lora.TrainAttn}, nil
}
