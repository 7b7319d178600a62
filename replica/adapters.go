package replica

// Adapter lifecycle: a replica makes an adapter resident before any op on it (reloading its saved
// state, or creating it from its seed), saves it as its new current state when it steps or loads,
// and saves it again before it leaves memory. The gateway says only which adapter an op is for
// and where its durable state lives (StateKeeper); it never touches the compute.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/skein-ai/skein/engine"
	"github.com/skein-ai/skein/storage"
)

// Adapter names a training adapter for an op: what it is, whose turn it takes, and who keeps its
// durable state.
type Adapter struct {
	ID    string
	Lane  string            // its tenant's lane: lanes take turns on the replica
	Lora  engine.LoraConfig // what a fresh adapter (no saved state) is created with
	State StateKeeper       // nil: the adapter has no owner any more (eviction only deletes it)
}

// StateKeeper is the owner's record of one adapter's durable state (the gateway's, shared between
// gateways through its store). The replica calls it on its worker, in the adapter's op order, so
// the record and the adapter in memory never disagree.
type StateKeeper interface {
	// Saved names the directory holding the adapter's current saved state, "" when it has none.
	Saved() (string, error)
	// Restored is told that the adapter was reloaded from dir.
	Restored(dir string)
	// Fresh is asked before an adapter with no saved state is created from its seed: an error
	// (it has stepped, so starting over would lose its training) stops that.
	Fresh() error
	// Claim is called once the adapter is resident here (reloaded or created): it makes this
	// replica the adapter's one writer and returns the fence its saves carry (the ETag of the
	// state pointer after rewriting it; "" while there is no pointer). A replica that held the
	// adapter before, cut off and still running, then has an old fence: its saves are refused.
	Claim(ctx context.Context) (fence string, err error)
	// Save makes a new current state, atomically, if the state pointer is still at fence: fill
	// writes the adapter into a new version's dir, then the pointer is swapped to it with a
	// conditional write. It returns the new fence; a pointer moved on by another writer is a
	// *storage.StaleError and the state stays the other writer's.
	Save(ctx context.Context, fence string, fill func(dir string) error) (string, error)
	// BeforeStep is asked, with the adapter resident, whether an optimizer step may run (the
	// gateway checks that no acknowledged gradients were lost).
	BeforeStep(ctx context.Context) error
	// Stepped is told that an optimizer step consumed the gradients in memory, just before the
	// state is saved: the save that follows (the next Save call) holds no gradients and is at
	// step, and the step counts (its forward_backwards leave the owner's ledger) only once that
	// save succeeds. If it fails, the replica drops the copy in memory, so the adapter reloads
	// from the state saved before the step.
	Stepped(step int)
	// Replaced is told that load_weights replaced the adapter, before the state is saved.
	Replaced(cfg engine.LoraConfig, step int)
}

// MayHaveRun reports whether a failed op reached a remote worker's compute with a call that can
// change training state before the failure: such an op must not be run again elsewhere.
func MayHaveRun(err error) bool {
	var r *ranError
	return errors.As(err, &r)
}

type ranError struct{ error }

func (e *ranError) Unwrap() error { return e.error }

// effectCounter is a remote compute that counts its calls that may change training state
// (worker.Client); an in-process engine's failures happen here, with nothing half done elsewhere.
type effectCounter interface{ Effects() int64 }

func (r *Replica) effects() int64 {
	if c, ok := r.compute.(effectCounter); ok {
		return c.Effects()
	}
	return 0
}

// onAdapter runs fn on the worker in a's lane, with a resident first, and waits for it. The
// compute calls see ctx's values but not its end: an op that started runs to the end (a Tinker
// future outlives the request that made it), and the wait for the worker does not end with ctx
// either, so a failure always says whether the op ran.
func (r *Replica) onAdapter(ctx context.Context, a Adapter, fn func(ctx context.Context) error) error {
	ctx = r.withTurns(context.WithoutCancel(ctx))
	var opErr error
	var ran bool
	err := r.DoIn(ctx, AdapterLane(a.Lane, a.ID), func() {
		before := r.effects()
		defer func() { ran = r.effects() != before }()
		if err := r.ensure(ctx, a); err != nil {
			opErr = fmt.Errorf("restoring the adapter: %w", err)
			return
		}
		if fn != nil {
			opErr = fn(ctx)
		}
	})
	if err == nil {
		err = opErr
	}
	if err != nil && ran {
		err = &ranError{err}
	}
	return err
}

// ensure makes a resident: reloaded from its saved state, or, if it has none and never stepped,
// created from its seed (PEFT init is deterministic). Runs on the worker.
func (r *Replica) ensure(ctx context.Context, a Adapter) error {
	if r.compute.HasAdapter(ctx, a.ID) {
		if _, claimed := r.fence(a.ID); claimed || a.State == nil {
			return nil
		}
		if r.takeVouch(a.ID) {
			// Resident but never claimed through this replica, and vouched for: a worker that
			// kept it across its gateway's restart, adopted because it was at the run's
			// acknowledged step with no pending gradients (gateway.adoptable). Claim its state
			// as it is; if another replica claimed it meanwhile, the saved state may be newer:
			// reload that instead.
			fence, err := a.State.Claim(ctx)
			if err == nil {
				r.setFence(a.ID, fence)
				return nil
			}
			slog.Info("a resident adapter's state was claimed elsewhere: reloading it", "run", a.ID, "replica", r.id, "err", err)
		} else {
			// Left here by another gateway (one that handed the run over saves it first and
			// leaves it resident; one that died may have left gradients no save holds). Its
			// contents are known only through its saved state, which records which
			// forward_backwards it holds: claimed as it was, this gateway's view of the run held
			// none, and its next optim_step reported acknowledged gradients lost.
			slog.Info("reloading a resident adapter this replica did not place", "run", a.ID, "replica", r.id)
		}
		r.compute.DeleteAdapter(ctx, a.ID)
	}
	if a.State == nil {
		return fmt.Errorf("adapter %s has no owner", a.ID)
	}
	dir, err := a.State.Saved()
	if err != nil {
		return err
	}
	if dir != "" {
		slog.Info("reloading adapter from its saved state", "run", a.ID, "replica", r.id, "dir", dir)
		if err := r.compute.LoadAdapter(ctx, a.ID, dir, true); err != nil {
			return err
		}
		a.State.Restored(dir)
	} else {
		if err := a.State.Fresh(); err != nil {
			return err
		}
		if err := r.compute.CreateLora(ctx, a.ID, a.Lora); err != nil {
			return err
		}
	}
	fence, err := a.State.Claim(ctx)
	if err != nil {
		r.compute.DeleteAdapter(ctx, a.ID) // not ours to train: another replica claimed it meanwhile
		return fmt.Errorf("claiming the adapter's state: %w", err)
	}
	r.setFence(a.ID, fence)
	return nil
}

// persist saves the adapter's full state (weights, optimizer, step, pending gradients) as its new
// current state, fenced by this replica's claim. Runs on the worker.
func (r *Replica) persist(ctx context.Context, a Adapter) error {
	fence, _ := r.fence(a.ID)
	next, err := a.State.Save(ctx, fence, func(dir string) error { return r.compute.SaveAdapter(ctx, a.ID, dir, true) })
	var stale *storage.StaleError
	if errors.As(err, &stale) {
		// Another replica owns the adapter now (this one was cut off, and its op outlived
		// that): its state must win. Drop the copy here so nothing trains on it again.
		r.log().Warn("a save of an adapter whose state another replica has claimed was refused (412)",
			"run", a.ID, "replica", r.id, "pointer", stale.Key, "fence", stale.Expected)
		r.compute.DeleteAdapter(ctx, a.ID)
		r.dropFence(a.ID)
		return err
	}
	if err != nil {
		return err
	}
	r.setFence(a.ID, next)
	return nil
}

func (r *Replica) fence(id string) (string, bool) {
	r.fenceMu.Lock()
	defer r.fenceMu.Unlock()
	f, ok := r.fences[id]
	return f, ok
}

func (r *Replica) setFence(id, fence string) {
	r.fenceMu.Lock()
	defer r.fenceMu.Unlock()
	if r.fences == nil {
		r.fences = map[string]string{}
	}
	r.fences[id] = fence
}

func (r *Replica) dropFence(id string) {
	r.fenceMu.Lock()
	defer r.fenceMu.Unlock()
	delete(r.fences, id)
	delete(r.vouched, id) // gone from here: a copy found later is another's
}

// Vouch records that the gateway adopted the resident adapter id as it is (gateway.adoptable:
// clean, at the step its saved state records): its first use claims it without a reload.
func (r *Replica) Vouch(id string) {
	r.fenceMu.Lock()
	defer r.fenceMu.Unlock()
	if r.vouched == nil {
		r.vouched = map[string]bool{}
	}
	r.vouched[id] = true
}

// takeVouch reports whether id was vouched for, and forgets it (it counts once: a later
// resident copy is another's).
func (r *Replica) takeVouch(id string) bool {
	r.fenceMu.Lock()
	defer r.fenceMu.Unlock()
	v := r.vouched[id]
	delete(r.vouched, id)
	return v
}

// PlacementLane is the lane placements and evictions wait in: their own, so that moving an
// adapter in or out waits for one turn, not behind every op its tenant has queued here.
const PlacementLane = ""

// Place makes the adapter resident (the router's Load: a new placement).
func (r *Replica) Place(ctx context.Context, a Adapter) error {
	a.Lane = PlacementLane
	return r.onAdapter(ctx, a, nil)
}

// Evict saves the adapter's full state, if it is resident and has an owner, and removes it from
// memory; its next op reloads it, possibly on another replica. It waits for the worker, or for ctx.
func (r *Replica) Evict(ctx context.Context, a Adapter) error {
	var err error
	if derr := r.DoIn(ctx, PlacementLane, func() { err = r.evict(context.WithoutCancel(ctx), a) }); derr != nil {
		return derr
	}
	return err
}

// Save saves the adapter's full state (gradients not yet stepped included) if it is resident
// and has an owner, and keeps it resident: a gateway handing its runs over leaves the adapters
// on their worker, and the state saved is what the next holder loads if it does not find them
// there. It waits for the worker, or for ctx.
func (r *Replica) Save(ctx context.Context, a Adapter) error {
	var err error
	if derr := r.DoIn(ctx, PlacementLane, func() {
		if a.State != nil && r.compute.HasAdapter(context.WithoutCancel(ctx), a.ID) {
			err = r.persist(context.WithoutCancel(ctx), a)
		}
	}); derr != nil {
		return derr
	}
	return err
}

// Unload is Evict without waiting: it runs after the adapter's ops already queued in its lane,
// and a failure to save is logged.
func (r *Replica) Unload(a Adapter) error {
	return r.RunIn(AdapterLane(a.Lane, a.ID), func() {
		if err := r.evict(context.Background(), a); err != nil {
			slog.Error("saving adapter before release", "run", a.ID, "replica", r.id, "err", err)
		}
	})
}

func (r *Replica) evict(ctx context.Context, a Adapter) error {
	if a.State != nil && r.compute.HasAdapter(ctx, a.ID) {
		if err := r.persist(ctx, a); err != nil {
			return err
		}
	}
	r.compute.DeleteAdapter(ctx, a.ID)
	r.dropFence(a.ID)
	return nil
}

// Forward runs a validated batch through the adapter (through the base model alone when baseOnly)
// without changing anything.
func (r *Replica) Forward(ctx context.Context, a Adapter, b *engine.Batch, baseOnly bool) (*engine.ForwardResult, error) {
	var res *engine.ForwardResult
	err := r.onAdapter(ctx, a, func(ctx context.Context) error {
		id := a.ID
		if baseOnly {
			id = ""
		}
		start := time.Now()
		var err error
		if res, err = r.compute.ForwardBatch(ctx, id, b, false); err == nil && res != nil {
			r.logOp("forward", a.ID, start, batchTokens(b), "loss_sum", res.Loss)
		}
		return err
	})
	return res, err
}

// ForwardBackward runs a validated batch and accumulates its gradients in the adapter.
func (r *Replica) ForwardBackward(ctx context.Context, a Adapter, b *engine.Batch) (*engine.ForwardResult, error) {
	var res *engine.ForwardResult
	err := r.onAdapter(ctx, a, func(ctx context.Context) error {
		start := time.Now()
		var err error
		if res, err = r.compute.ForwardBatch(ctx, a.ID, b, true); err == nil && res != nil {
			r.logOp("forward_backward", a.ID, start, batchTokens(b), "loss_sum", res.Loss)
		}
		return err
	})
	return res, err
}

// OptimStep applies the accumulated gradients and saves the adapter: a step is acknowledged only
// once it is on disk. It returns the step's metrics and the adapter's step count.
func (r *Replica) OptimStep(ctx context.Context, a Adapter, p engine.AdamParams) (map[string]float64, int, error) {
	var metrics map[string]float64
	var step int
	err := r.onAdapter(ctx, a, func(ctx context.Context) error {
		start := time.Now()
		if err := a.State.BeforeStep(ctx); err != nil {
			return err
		}
		var err error
		if metrics, err = r.compute.OptimStep(ctx, a.ID, p); err != nil {
			return err
		}
		// From here the step consumed the gradients in memory, but it counts only once it is
		// saved: on any failure the copy in memory (ahead of its saved state) is dropped, so
		// the next op reloads the saved state and the owner, whose ledger still lists the
		// forward_backwards this step consumed, reports them lost instead of stepping on
		// nothing (a worker lost while saving once made the next step a zero-gradient one).
		forget := func() {
			r.compute.DeleteAdapter(context.WithoutCancel(ctx), a.ID)
			r.dropFence(a.ID)
		}
		if _, step, err = r.compute.AdapterInfo(ctx, a.ID); err != nil {
			forget()
			return fmt.Errorf("reading the adapter's step: %w", err)
		}
		a.State.Stepped(step)
		if err := r.persist(ctx, a); err != nil {
			forget()
			return fmt.Errorf("saving the adapter state: %w", err)
		}
		r.logOp("optim_step", a.ID, start, 0, "step", step) // its time includes saving the state
		return nil
	})
	return metrics, step, err
}

// SaveTo writes the adapter's weights (and optimizer state, if asked) into dir: a checkpoint.
func (r *Replica) SaveTo(ctx context.Context, a Adapter, dir string, withOptimizer bool) error {
	return r.onAdapter(ctx, a, func(ctx context.Context) error {
		return r.compute.SaveAdapter(ctx, a.ID, dir, withOptimizer)
	})
}

// LoadFrom replaces the adapter with the saved one in dir (its optimizer state too, if asked),
// and saves that as its new current state. It returns the loaded adapter's config and step.
func (r *Replica) LoadFrom(ctx context.Context, a Adapter, dir string, withOptimizer bool) (engine.LoraConfig, int, error) {
	var cfg engine.LoraConfig
	var step int
	err := r.onAdapter(ctx, a, func(ctx context.Context) error {
		if err := r.compute.LoadAdapter(ctx, a.ID, dir, withOptimizer); err != nil {
			return err
		}
		var err error
		if cfg, step, err = r.compute.AdapterInfo(ctx, a.ID); err != nil { // a worker's unusable answer
			return fmt.Errorf("reading the loaded adapter: %w", err)
		}
		a.State.Replaced(cfg, step)
		if err := r.persist(ctx, a); err != nil {
			return fmt.Errorf("saving the adapter state: %w", err)
		}
		return nil
	})
	return cfg, step, err
}

// Snapshot saves the adapter's weights as they are now into w.Dir and keeps them in memory as a
// read-only sampler copy named w.ID, on this replica (where the adapter is).
func (r *Replica) Snapshot(ctx context.Context, a Adapter, w Weights) error {
	return r.onAdapter(ctx, a, func(ctx context.Context) error {
		if err := r.compute.SaveAdapter(ctx, a.ID, w.Dir, false); err != nil {
			return err
		}
		if err := r.compute.LoadSnapshot(ctx, w.ID, w.Dir); err != nil {
			return err
		}
		r.keepCopy(ctx, w.ID)
		return nil
	})
}

// AdapterIDs lists the adapters in memory here (training adapters and sampler copies).
func (r *Replica) AdapterIDs(ctx context.Context) []string {
	if r.compute == nil {
		return nil
	}
	return r.compute.AdapterIDs(ctx)
}

// Info describes the base model (fixed at load: no round trip).
func (r *Replica) Info() engine.ModelInfo { return r.compute.Info() }
