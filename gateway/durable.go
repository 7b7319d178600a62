package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/skein-ai/skein/checkpoint"
	"github.com/skein-ai/skein/replica"
	"github.com/skein-ai/skein/storage"
)

// An adapter's saved state lives in versioned directories under DATA/state, with a pointer file
// naming the current one:
//
//	state/<run>.current     the name of the current version directory (replaced atomically)
//	state/<run>@<version>/  one complete save (PEFT files, optimizer, trainer state, gradients.json)
//
// A save writes and syncs a new version directory, then replaces the pointer (write, sync,
// rename), then removes the previous version. A crash at any point leaves the pointer naming a
// complete version; what is left over is removed at start. Directories of the older layout
// (state/<run> itself, and the .old-*/.partial-* of its two-rename save) are still read, and a
// crash inside that save (state/<run> gone, its previous state in .old-*) is recovered at start.

const (
	pointerSuffix = ".current"
	versionSep    = "@"
	// gradientsFile lists the forward_backward requests whose gradients a saved state holds.
	gradientsFile = "gradients.json"
)

// errStateLost is returned when a run that has trained has no saved state to reload: it is never
// silently re-created from its seed.
var errStateLost = errors.New("the saved training state of this model is missing")

func (s *Server) stateRoot() string { return filepath.Join(s.opts.DataDir, "state") }

func stateName(runID string) string { return strings.ReplaceAll(runID, ":", "_") }

// pointerKey is the storage key of a run's state pointer; versionKey that of one version.
func pointerKey(runID string) string { return "state/" + stateName(runID) + pointerSuffix }

func versionKey(name string) string { return "state/" + name }

// localStorage is the data directory when the storage is it (files in place), else "".
func (s *Server) localStorage() string { return storage.Local(s.storage) }

// savedState finds where a run's latest state is: the version the pointer names, else (local
// storage only) a directory of the older layout; "" when it has none. A pointer naming a
// missing version is an error, not a reason to start over.
func (s *Server) savedState(runID string) (string, error) {
	ctx := context.Background()
	pk := pointerKey(runID)
	name, _, err := storage.ReadPointer(ctx, s.storage, pk)
	switch {
	case err == nil:
		if !strings.HasPrefix(name, stateName(runID)+versionSep) || storage.CheckKey(versionKey(name)) != nil {
			return "", fmt.Errorf("%w: %s names %q", errStateLost, pk, name)
		}
		dir := filepath.Join(s.stateRoot(), name)
		if s.localStorage() != "" {
			if _, err := os.Stat(dir); err != nil {
				return "", fmt.Errorf("%w: %s names %s: %v", errStateLost, pk, dir, err)
			}
		} else if _, err := s.storage.Head(ctx, versionKey(name)+"/"+gradientsFile); err != nil {
			// gradients.json is written into every version, before its pointer: one without it is gone.
			return "", fmt.Errorf("%w: %s names %s: %v", errStateLost, pk, versionKey(name), err)
		}
		return dir, nil
	case !errors.Is(err, storage.ErrNotFound):
		return "", fmt.Errorf("reading %s: %w", pk, err)
	}
	if s.localStorage() != "" {
		base := filepath.Join(s.stateRoot(), stateName(runID))
		if _, err := os.Stat(base); err == nil {
			return base, nil
		}
	}
	return "", nil
}

// claimSavedState makes the caller the run's one writer: the pointer is rewritten, unchanged,
// with a write conditional on the ETag just read, and the new ETag is the caller's fence. ""
// when the run has no pointer yet (its first save then requires that none appeared).
//
// Under run leases the pointer also carries the claiming gateway's epoch, and a claim below the
// pointer's epoch is refused: a gateway that lost the run cannot make its replica the writer
// again after the run's new holder claimed it (the ETag alone fences replicas of one gateway).
// A gateway without leases (the only one, on SQLite) checks no epoch, as before.
func (s *Server) claimSavedState(ctx context.Context, runID string) (string, error) {
	pk := pointerKey(runID)
	name, etag, at, err := storage.ReadPointerEpoch(ctx, s.storage, pk)
	if errors.Is(err, storage.ErrNotFound) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("reading %s: %w", pk, err)
	}
	epoch := s.stateEpoch(runID)
	if s.leases.on && at > epoch {
		return "", fmt.Errorf("%w: model %s's state was claimed by a gateway at epoch %d, and this gateway holds it at %d (it lost the run)",
			&storage.StaleError{Key: pk, Expected: etag, Value: name}, runID, at, epoch)
	}
	return storage.SwapPointerEpoch(ctx, s.storage, pk, name, etag, epoch)
}

// stateEpoch is the epoch this gateway's writes of a run's state carry: the run lease's, 0
// without leases (or without a valid lease: then any leased writer's claim wins).
func (s *Server) stateEpoch(runID string) int64 {
	if !s.leases.on {
		return 0
	}
	e, _ := s.leases.valid(runID)
	return e
}

// writeSavedState saves a run's state as a new version (write into dir by save, then the
// gradients list, sync) and makes it current by swapping the pointer if it is still at fence;
// the previous version is removed afterwards. A pointer another writer moved is a
// *storage.StaleError, and this version is removed unread.
func (s *Server) writeSavedState(ctx context.Context, runID, fence string, rec gradientsRecord, save func(dir string) error) (string, error) {
	prev, _ := s.savedState(runID)
	name := fmt.Sprintf("%s%s%016x-%s", stateName(runID), versionSep, time.Now().UnixNano(), randomHex(2))
	dir := filepath.Join(s.stateRoot(), name)
	vk := versionKey(name)
	drop := func() {
		s.logErr("removing an unused state version", storage.DeleteTree(context.WithoutCancel(ctx), s.storage, vk, storage.MaxTreeFiles))
	}
	if err := save(dir); err != nil {
		drop()
		return "", err
	}
	b, _ := json.Marshal(rec)
	if _, err := s.storage.Put(ctx, vk+"/"+gradientsFile, bytes.NewReader(b), storage.Cond{}); err != nil {
		drop()
		return "", err
	}
	if s.localStorage() != "" {
		// The engine wrote the files in place without syncing them: sync before the pointer names them.
		if err := syncTree(dir); err != nil {
			drop()
			return "", fmt.Errorf("syncing %s: %w", dir, err)
		}
	}
	next, err := storage.SwapPointerEpoch(ctx, s.storage, pointerKey(runID), name, fence, s.stateEpoch(runID))
	if err != nil {
		drop()
		return "", err
	}
	if prev != "" && prev != dir {
		if pk, err := replica.KeyOf(s.opts.DataDir, prev); err == nil && pk != "state/"+stateName(runID) {
			s.logErr("removing a replaced state version", storage.DeleteTree(ctx, s.storage, pk, storage.MaxTreeFiles))
		} else {
			os.RemoveAll(prev) // the older layout's directory (local storage only)
		}
	}
	return next, nil
}

// gradientsRecord is gradients.json: which forward_backward requests (future ids) the saved
// gradient accumulator holds, so an optim_step after a reload can tell whether any
// acknowledged one is missing.
// Step is the optimizer step the saved state is at (0 in records written before it was kept).
// Applied is the optim_step request (future id) whose step this state is the save of.
type gradientsRecord struct {
	ForwardBackwards []string `json:"forward_backwards"`
	Step             int      `json:"step,omitempty"`
	Applied          string   `json:"applied,omitempty"`
}

func (s *Server) readGradientsRecord(dir string) gradientsRecord {
	var r gradientsRecord
	key, err := replica.KeyOf(s.opts.DataDir, dir)
	if err != nil {
		return r
	}
	b, _, err := storage.ReadAll(context.Background(), s.storage, key+"/"+gradientsFile, 64<<20)
	if err != nil {
		return r
	}
	_ = json.Unmarshal(b, &r)
	return r
}

// syncTree syncs the files of dir and dir itself, so a pointer never names data still in flight.
func syncTree(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		f, err := os.Open(filepath.Join(dir, e.Name()))
		if err != nil {
			return err
		}
		err = f.Sync()
		f.Close()
		if err != nil {
			return err
		}
	}
	return checkpoint.SyncDir(dir)
}

// tidySavedStates removes what interrupted saves left in DATA/state and recovers a state left
// in an .old-* directory by the older layout's save. Runs at start, before any save; only when
// this process is the only gateway (another one may be saving right now).
func (s *Server) tidySavedStates() {
	if s.objectStorage() {
		s.tidyStoredStates(context.Background())
		return
	}
	entries, err := os.ReadDir(s.stateRoot())
	if err != nil {
		return
	}
	type run struct {
		pointer  string   // the version the pointer names
		versions []string // version directories
		olds     []string // .old-* directories of the older layout
		legacy   bool     // state/<run> of the older layout
	}
	runs := map[string]*run{}
	get := func(name string) *run {
		if runs[name] == nil {
			runs[name] = &run{}
		}
		return runs[name]
	}
	root := s.stateRoot()
	for _, e := range entries {
		n := e.Name()
		switch {
		case strings.Contains(n, pointerSuffix+".tmp-"), strings.Contains(n, ".partial-"):
			s.removeLeftover(filepath.Join(root, n))
		case strings.HasSuffix(n, pointerSuffix):
			b, _ := os.ReadFile(filepath.Join(root, n))
			first, _, _ := strings.Cut(string(b), "\n") // the version; a second line is the write's nonce (storage.SwapPointer)
			get(strings.TrimSuffix(n, pointerSuffix)).pointer = strings.TrimSpace(first)
		case strings.Contains(n, versionSep) && e.IsDir():
			name, _, _ := strings.Cut(n, versionSep)
			get(name).versions = append(get(name).versions, n)
		case strings.Contains(n, ".old-") && e.IsDir():
			name, _, _ := strings.Cut(n, ".old-")
			get(name).olds = append(get(name).olds, n)
		case e.IsDir():
			get(n).legacy = true
		}
	}
	for name, r := range runs {
		current := ""
		if r.pointer != "" {
			if _, err := os.Stat(filepath.Join(root, r.pointer)); err != nil {
				// Someone removed what the pointer names: keep everything for the operator to
				// look at (the run's requests fail saying so; see savedState).
				s.log.Error("an adapter's state pointer names a missing directory", "run", name, "pointer", r.pointer)
				continue
			}
			current = r.pointer
		}
		if current == "" && !r.legacy && len(r.olds) > 0 {
			// The older save died between its two renames: the last acknowledged state is the
			// newest .old-* directory (a .partial-* one was never acknowledged).
			sort.Strings(r.olds)
			newest := r.olds[0]
			for _, o := range r.olds {
				if modTime(filepath.Join(root, o)).After(modTime(filepath.Join(root, newest))) {
					newest = o
				}
			}
			if err := os.Rename(filepath.Join(root, newest), filepath.Join(root, name)); err == nil {
				s.log.Warn("recovered an adapter state left by an interrupted save", "dir", filepath.Join(root, name))
				r.legacy = true
			}
		}
		for _, v := range r.versions {
			if v != current { // not yet current when its save was interrupted, or already replaced
				s.removeLeftover(filepath.Join(root, v))
			}
		}
		for _, o := range r.olds {
			s.removeLeftover(filepath.Join(root, o))
		}
		if current != "" && r.legacy {
			s.removeLeftover(filepath.Join(root, name))
		}
	}
}

// maxStateObjects bounds the objects under state/ one start-up sweep lists.
const maxStateObjects = 1 << 20

// tidyStoredStates removes, in object storage, the state versions no pointer names: saves that
// died before their swap, and those a stale replica wrote and lost (its swap got 412).
func (s *Server) tidyStoredStates(ctx context.Context) {
	objs, err := s.storage.List(ctx, "state/", maxStateObjects)
	if err != nil {
		s.log.Warn("not tidying adapter state in storage", "err", err)
		return
	}
	current := map[string]bool{} // version names the pointers name
	for _, o := range objs {
		if strings.HasSuffix(o.Key, pointerSuffix) && strings.Count(o.Key, "/") == 1 {
			if name, _, err := storage.ReadPointer(ctx, s.storage, o.Key); err == nil {
				current[name] = true
			}
		}
	}
	gone := map[string]bool{}
	for _, o := range objs {
		rest := strings.TrimPrefix(o.Key, "state/")
		name, _, isFile := strings.Cut(rest, "/")
		if !isFile || !strings.Contains(name, versionSep) || current[name] {
			continue
		}
		if !gone[name] {
			gone[name] = true
			s.log.Info("removing a state version no pointer names", "version", name)
		}
		s.logErr("removing an unused state version", s.storage.Delete(ctx, o.Key))
	}
}

// removeSavedState removes every saved version of a run's state, its pointer and a directory
// of the older layout (for a run that can never run again).
func (s *Server) removeSavedState(runID string) error {
	if s.objectStorage() {
		ctx := context.Background()
		objs, err := s.storage.List(ctx, "state/"+stateName(runID), maxTreeObjects)
		if err != nil {
			return err
		}
		var errs []error
		for _, o := range objs {
			// state/<run>.current and state/<run>@…/…, not another run's whose id extends this one.
			rest := strings.TrimPrefix(o.Key, "state/"+stateName(runID))
			if rest == pointerSuffix || strings.HasPrefix(rest, versionSep) {
				errs = append(errs, s.storage.Delete(ctx, o.Key))
			}
		}
		return errors.Join(errs...)
	}
	base := filepath.Join(s.stateRoot(), stateName(runID))
	versions, _ := filepath.Glob(base + versionSep + "*")
	var errs []error
	for _, p := range append(versions, base) {
		errs = append(errs, os.RemoveAll(p))
	}
	if err := os.Remove(base + pointerSuffix); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func (s *Server) removeLeftover(path string) {
	if _, err := os.Stat(path); err != nil {
		return
	}
	s.log.Info("removing what an interrupted save left", "path", path)
	s.logErr("removing leftover", os.RemoveAll(path))
}

func modTime(path string) time.Time {
	info, err := os.Stat(path)
	if err != nil {
		return time.Time{}
	}
	return info.ModTime()
}

// errStoreForgot is returned at start when the data directory holds saved adapters or
// checkpoints that the state store has no record of.
var errStoreForgot = errors.New("the state store does not know the saved state in the data directory")

// checkStoreKnowsDisk refuses to start over a data directory whose state store lost its records
// (state.db deleted, emptied, or a new database): starting anyway would silently forget every
// run and checkpoint on disk.
func (s *Server) checkStoreKnowsDisk(ctx context.Context) error {
	runs, err := s.st.Runs(ctx)
	if err != nil {
		return err
	}
	ckpts, err := s.st.Checkpoints(ctx)
	if err != nil {
		return err
	}
	if len(runs) > 0 || len(ckpts) > 0 {
		return nil
	}
	var found []string
	for _, dir := range []string{s.stateRoot(), filepath.Join(s.opts.DataDir, "checkpoints")} {
		if s.objectStorage() {
			prefix := filepath.Base(dir) + "/"
			if objs, err := s.storage.List(ctx, prefix, 1); errors.Is(err, storage.ErrTooMany) || len(objs) > 0 {
				found = append(found, fmt.Sprintf("%s %s", s.storage, prefix))
			}
			continue
		}
		if entries, err := os.ReadDir(dir); err == nil && len(entries) > 0 {
			found = append(found, fmt.Sprintf("%s (%d entries)", dir, len(entries)))
		}
	}
	if len(found) == 0 {
		return nil
	}
	where := "the state store"
	if s.ownsSt {
		where = filepath.Join(s.opts.DataDir, "state.db") + " (missing or empty)"
	}
	return fmt.Errorf("%w: %s has no runs or checkpoints, but %s hold saved adapters or checkpoints. "+
		"Restore the state store from a backup to keep them, or move those directories out of the data directory "+
		"to start fresh without them", errStoreForgot, where, strings.Join(found, " and "))
}
