package gateway

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/skein-ai/skein/storage"
)

// What would otherwise grow forever is swept: sessions closed long ago (with their training runs
// that can never run again), temporary directories a crash left behind, ephemeral sampler
// weights whose sampler is gone, and on object storage checkpoint generations no checkpoint
// names (objectsweep.go).

const (
	// DefaultSessionRetention is how long a closed (expired) session is kept, listed and
	// readable, before the sweep forgets it.
	DefaultSessionRetention = 7 * 24 * time.Hour
	// staleTempAge is how old a temporary directory (a save's ".partial-*", a replaced state's
	// ".old-*") must be before it counts as left by a crash: no save takes this long, and with
	// several gateways on one data directory the others' saves in progress are younger.
	staleTempAge = time.Hour
	// leftoversAtMost is the longest time between two sweeps (one also runs at start).
	leftoversAtMost = time.Hour
	// leftoversAtLeast is the shortest: a sweep lists every session, run and checkpoint.
	leftoversAtLeast = time.Second
)

// leftoversEvery is how often the sweep runs: often enough that what the retention lets go is
// gone within a quarter of the retention after it (a short retention is a promise about disk and
// rows, not only listings), within [leftoversAtLeast, leftoversAtMost].
func leftoversEvery(retention time.Duration) time.Duration {
	return min(leftoversAtMost, max(retention/4, leftoversAtLeast))
}

// isTempDir reports whether a name is one of the temporary directories of a save. An ".old-*"
// directory may be the only copy of a run's state (the older layout's save died between its
// renames) or of a checkpoint (an overwrite died between its renames): tidySavedStates and
// recoverCheckpoints recover or remove those at start, never the age-based sweep.
func isTempDir(_, name string) bool {
	return strings.Contains(name, ".partial-")
}

// sweepLeftovers removes what a crash or the passage of time left behind.
func (s *Server) sweepLeftovers(now time.Time) {
	ctx := context.Background()
	s.sweepTempDirs(now)
	s.sweepClosedSessions(ctx, now)
	s.sweepEphemeral(ctx, now)
	s.sweepObjects(ctx, now)
}

// sweepTempDirs removes stale temporary directories under the state and checkpoint trees.
func (s *Server) sweepTempDirs(now time.Time) {
	if d, ok := s.storage.(*storage.Dir); ok {
		if n := d.SweepTemp(now, staleTempAge); n > 0 {
			s.log.Info("removed temporary files left by interrupted writes", "count", n, "dir", filepath.Join(d.Root(), ".tmp"))
		}
	}
	for _, root := range []string{filepath.Join(s.opts.DataDir, "state"), filepath.Join(s.opts.DataDir, "checkpoints")} {
		_ = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil || !d.IsDir() || !isTempDir(root, d.Name()) {
				return nil // unreadable parts are skipped, not fatal
			}
			if info, err := d.Info(); err == nil && now.Sub(info.ModTime()) > staleTempAge {
				s.log.Info("removing a temporary directory left by a crash", "dir", path)
				s.logErr("removing a stale temporary directory", os.RemoveAll(path))
			}
			return filepath.SkipDir
		})
	}
}

// sweepClosedSessions forgets sessions closed longer than the retention ago, and their training
// runs that are no longer live: a run's saved state goes with it, and the run itself too unless
// checkpoints of it remain (they stay listed under it).
func (s *Server) sweepClosedSessions(ctx context.Context, now time.Time) {
	sessions, err := s.st.Sessions(ctx)
	if err != nil {
		s.logErr("listing sessions for the sweep", err)
		return
	}
	old := map[string]bool{}
	for _, row := range sessions {
		if row.Closed && now.Sub(row.Heartbeat) > s.opts.SessionTimeout+s.opts.SessionRetention {
			old[row.ID] = true
		}
	}
	if len(old) == 0 {
		return
	}
	runs, err := s.st.Runs(ctx)
	if err != nil {
		s.logErr("listing runs for the sweep", err)
		return
	}
	ckpts, err := s.st.Checkpoints(ctx)
	if err != nil {
		s.logErr("listing checkpoints for the sweep", err)
		return
	}
	hasCkpt := map[string]bool{}
	for _, c := range ckpts {
		hasCkpt[c.ModelID] = true
	}
	for _, row := range runs {
		if !old[row.SessionID] || row.Live {
			continue
		}
		s.logErr("removing a dead run's state", s.removeSavedState(row.ID))
		if hasCkpt[row.ID] {
			continue
		}
		s.runs.mu.Lock()
		if run := s.runs.m[row.ID]; run != nil && !run.ready {
			delete(s.runs.m, row.ID)
		}
		s.runs.mu.Unlock()
		s.logErr("run", s.st.DeleteRun(ctx, row.ID))
		s.logErr("run metrics", s.st.DeleteStepMetrics(ctx, row.ID))
	}
	for id := range old {
		s.logErr("session", s.st.DeleteSession(ctx, id))
	}
	s.log.Info("swept closed sessions", "count", len(old))
}

// sweepEphemeral removes the weights of ephemeral samplers that no longer exist (their session
// expired) and are older than a save could be.
func (s *Server) sweepEphemeral(ctx context.Context, now time.Time) {
	dir := filepath.Join(s.opts.DataDir, "ephemeral")
	entries, err := os.ReadDir(dir)
	if err != nil || len(entries) == 0 {
		return
	}
	samplers, err := s.st.Samplers(ctx)
	if err != nil {
		s.logErr("listing samplers for the sweep", err)
		return
	}
	live := map[string]bool{}
	for _, x := range samplers {
		live[x.ID] = true
	}
	for _, e := range entries {
		if live[e.Name()] {
			continue
		}
		if info, err := e.Info(); err == nil && now.Sub(info.ModTime()) > staleTempAge {
			s.logErr("removing a gone sampler's weights", os.RemoveAll(filepath.Join(dir, e.Name())))
		}
	}
}
