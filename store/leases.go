package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// Run leases (issue 38): with several gateways on one store, one gateway at a time sequences a
// training run's ops, since seq_id order needs one sequencer. It holds the run's lease, renewed
// in the background; when it dies, the lease lapses and another gateway takes it. Every taking
// (a new holder, or the same one after a lapse) raises the lease's epoch, which only grows: the
// epoch fences what a gateway that lost the lease still does (FinishFutureFenced here, the state
// pointer in storage). Safety rests on the epoch, not on clocks: leases expire by the wall
// clocks of the gateways, so a skew between them only moves when a takeover may happen.

// RunLease is one run's lease as the store holds it.
type RunLease struct {
	Run    string
	Holder string    // the gateway (its instance id)
	Addr   string    // where the holder serves, for forwarding ("" : not reachable)
	Epoch  int64     // grows at every taking; never reused for a run
	Until  time.Time // lapsed after this
}

// Live reports whether the lease is still held at now.
func (l RunLease) Live(now time.Time) bool { return l.Until.After(now) }

// Fence is what a write made for a run's sequencer carries: it is refused unless that gateway
// still holds the run at that epoch.
type Fence struct {
	Run    string
	Holder string
	Epoch  int64
}

// ErrFenced is a write refused because its fence is stale: another gateway took the run.
var ErrFenced = errors.New("store: the run's lease was taken by another gateway (stale epoch)")

func (s *SQL) leaseRow(ctx context.Context, q interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}, run string) (RunLease, error) {
	l := RunLease{Run: run}
	var until int64
	err := q.QueryRowContext(ctx, s.q(`SELECT holder, addr, epoch, until FROM run_leases WHERE run_id = ?`), run).
		Scan(&l.Holder, &l.Addr, &l.Epoch, &until)
	if errors.Is(err, sql.ErrNoRows) {
		return RunLease{}, ErrNotFound
	}
	l.Until = fromMS(until)
	return l, err
}

// AcquireRunLease takes or renews a run's lease for holder (serving at addr) for ttl, and
// returns the lease as it is afterwards: held by holder, or (live) by another gateway, which
// the caller forwards to. A taking raises the epoch; a renewal of a live lease keeps it. A live
// lease of another holder at the same (non-empty) address is taken at once: two live gateways
// cannot serve at one address, so that holder is this gateway's dead predecessor (a restart).
func (s *SQL) AcquireRunLease(ctx context.Context, run, holder, addr string, ttl time.Duration) (RunLease, error) {
	if run == "" || holder == "" {
		return RunLease{}, fmt.Errorf("store: a run lease needs a run and a holder")
	}
	now := time.Now()
	until := ms(now.Add(ttl))
	// One statement, so two gateways racing for a lapsed lease cannot both take it: the row is
	// locked by the conflict, and the WHERE is evaluated on the row as it is then.
	_, err := s.db.ExecContext(ctx, s.q(`INSERT INTO run_leases (run_id, holder, addr, epoch, until) VALUES (?, ?, ?, 1, ?)
		ON CONFLICT(run_id) DO UPDATE SET holder = excluded.holder, addr = excluded.addr, until = excluded.until,
			epoch = CASE WHEN run_leases.holder = excluded.holder AND run_leases.until >= ? THEN run_leases.epoch ELSE run_leases.epoch + 1 END
		WHERE run_leases.holder = excluded.holder OR run_leases.until < ? OR (run_leases.addr = excluded.addr AND excluded.addr != '')`),
		run, holder, addr, until, ms(now), ms(now))
	if err != nil {
		return RunLease{}, err
	}
	return s.leaseRow(ctx, s.db, run)
}

// RenewRunLeases extends, for ttl, every lease holder still holds (live), and returns them: a
// lease missing from the answer lapsed or was taken, and the caller must stop sequencing it.
func (s *SQL) RenewRunLeases(ctx context.Context, holder string, ttl time.Duration) ([]RunLease, error) {
	now := time.Now()
	// One statement (RETURNING, in SQLite and PostgreSQL alike): a lease taken by another
	// gateway between an update and a read could not be reported as held.
	rows, err := s.db.QueryContext(ctx, s.q(`UPDATE run_leases SET until = ? WHERE holder = ? AND until >= ?
		RETURNING run_id, addr, epoch, until`), ms(now.Add(ttl)), holder, ms(now))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []RunLease
	for rows.Next() {
		l := RunLease{Holder: holder}
		var u int64
		if err := rows.Scan(&l.Run, &l.Addr, &l.Epoch, &u); err != nil {
			return nil, err
		}
		l.Until = fromMS(u)
		out = append(out, l)
	}
	return out, rows.Err()
}

// ReleaseRunLease ends holder's lease of a run at epoch at once (a graceful handover), keeping
// the row so that the epoch goes on growing. Another holder's, or another epoch's, is left.
func (s *SQL) ReleaseRunLease(ctx context.Context, run, holder string, epoch int64) error {
	_, err := s.db.ExecContext(ctx, s.q(`UPDATE run_leases SET until = 0 WHERE run_id = ? AND holder = ? AND epoch = ?`), run, holder, epoch)
	return err
}

// RunLeaseOf reads a run's lease (ErrNotFound: never held).
func (s *SQL) RunLeaseOf(ctx context.Context, run string) (RunLease, error) {
	return s.leaseRow(ctx, s.db, run)
}

// FinishFutureFenced is FinishFuture for a run's op: the result is stored only while fence's
// holder still holds the run at fence's epoch (lapsed but not taken counts: nobody replaced its
// view). Otherwise ErrFenced, and the future stays pending for the run's new holder to run.
func (s *SQL) FinishFutureFenced(ctx context.Context, id, state string, result []byte, category string, fence Fence) (bool, error) {
	if state != FutureComplete && state != FutureFailed {
		return false, fmt.Errorf("store: %q is not a terminal state", state)
	}
	res, err := s.db.ExecContext(ctx, s.q(`UPDATE futures SET state = ?, result = ?, category = ?, request = NULL WHERE id = ? AND state = ?
		AND EXISTS (SELECT 1 FROM run_leases WHERE run_id = ? AND holder = ? AND epoch = ?)`),
		state, result, category, id, FuturePending, fence.Run, fence.Holder, fence.Epoch)
	if err != nil {
		return false, err
	}
	if n, _ := res.RowsAffected(); n == 1 {
		return true, s.notifyFinished(ctx, id)
	}
	l, err := s.leaseRow(ctx, s.db, fence.Run)
	if err != nil && !errors.Is(err, ErrNotFound) {
		return false, err
	}
	if l.Holder != fence.Holder || l.Epoch != fence.Epoch {
		return false, fmt.Errorf("%w: %s holds run %s at epoch %d, not %s at %d", ErrFenced, l.Holder, fence.Run, l.Epoch, fence.Holder, fence.Epoch)
	}
	return false, nil // already terminal
}

// PutRunFenced is PutRun for a run's sequencer: the row is written only while fence's holder
// still holds the run at fence's epoch (else ErrFenced), so a gateway that lost the run cannot
// write its stale view of it over the new holder's.
func (s *SQL) PutRunFenced(ctx context.Context, r Run, fence Fence) error {
	res, err := s.db.ExecContext(ctx, s.q(`UPDATE runs SET last_request = ?, live = ?, data = ? WHERE id = ?
		AND EXISTS (SELECT 1 FROM run_leases WHERE run_id = ? AND holder = ? AND epoch = ?)`),
		ms(r.LastRequest), r.Live, r.Data, r.ID, fence.Run, fence.Holder, fence.Epoch)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 1 {
		return nil
	}
	if _, err := s.GetRun(ctx, r.ID); errors.Is(err, ErrNotFound) {
		return s.PutRun(ctx, r) // not written yet (or forgotten): nothing to overwrite
	}
	return fmt.Errorf("%w: not writing run %s at epoch %d", ErrFenced, r.ID, fence.Epoch)
}

// PendingOps lists a run's pending futures that carry their request (so that the run's new
// holder can run them), in no particular order.
func (s *SQL) PendingOps(ctx context.Context, run string) ([]Future, error) {
	rows, err := s.db.QueryContext(ctx, s.q(futureCols+` WHERE run_id = ? AND state = ? AND request IS NOT NULL`), run, FuturePending)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Future
	for rows.Next() {
		f, err := s.scanFutureRow(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, f)
	}
	return out, rows.Err()
}

// OrphanedRuns lists (at most limit) runs that have pending futures carrying their request and
// no live lease: their gateway died, and one must take them over so that no future waits forever.
func (s *SQL) OrphanedRuns(ctx context.Context, limit int) ([]string, error) {
	return s.ids(ctx, `SELECT DISTINCT run_id FROM futures WHERE state = ? AND request IS NOT NULL
		AND run_id IS NOT NULL AND run_id NOT IN (SELECT run_id FROM run_leases WHERE until >= ?) LIMIT ?`,
		FuturePending, ms(time.Now()), limit)
}

// AdoptFuture makes owner the gateway that runs a pending future (a run's new holder running
// what its old one acknowledged). false: it is no longer pending.
func (s *SQL) AdoptFuture(ctx context.Context, id, owner string) (bool, error) {
	res, err := s.db.ExecContext(ctx, s.q(`UPDATE futures SET owner = ? WHERE id = ? AND state = ?`), owner, id, FuturePending)
	if err != nil {
		return false, err
	}
	n, _ := res.RowsAffected()
	return n == 1, nil
}

// GetRun reads one run (ErrNotFound if none).
func (s *SQL) GetRun(ctx context.Context, id string) (Run, error) {
	var r Run
	var c, l int64
	err := s.db.QueryRowContext(ctx, s.q(`SELECT id, tenant, session_id, base_model, created, last_request, live, data FROM runs WHERE id = ?`), id).
		Scan(&r.ID, &r.Tenant, &r.SessionID, &r.BaseModel, &c, &l, &r.Live, &r.Data)
	if errors.Is(err, sql.ErrNoRows) {
		return Run{}, ErrNotFound
	}
	r.Created, r.LastRequest = fromMS(c), fromMS(l)
	return r, err
}

// GetSampler reads one sampler (ErrNotFound if none): a gateway finds a sampler another one
// made.
func (s *SQL) GetSampler(ctx context.Context, id string) (Sampler, error) {
	var x Sampler
	err := s.db.QueryRowContext(ctx, s.q(`SELECT id, tenant, session_id, data FROM samplers WHERE id = ?`), id).
		Scan(&x.ID, &x.Tenant, &x.SessionID, &x.Data)
	if errors.Is(err, sql.ErrNoRows) {
		return Sampler{}, ErrNotFound
	}
	return x, err
}

// GetCheckpoint reads one checkpoint (ErrNotFound if none): a gateway finds a checkpoint another
// one saved.
func (s *SQL) GetCheckpoint(ctx context.Context, path string) (Checkpoint, error) {
	var c Checkpoint
	var created int64
	var exp sql.NullInt64
	err := s.db.QueryRowContext(ctx, s.q(`SELECT path, owner, model_id, created, expires_at, public, data FROM checkpoints WHERE path = ?`), path).
		Scan(&c.Path, &c.Owner, &c.ModelID, &created, &exp, &c.Public, &c.Data)
	if errors.Is(err, sql.ErrNoRows) {
		return Checkpoint{}, ErrNotFound
	}
	if err != nil {
		return Checkpoint{}, err
	}
	c.Created = fromMS(created)
	if exp.Valid {
		t := fromMS(exp.Int64)
		c.ExpiresAt = &t
	}
	return c, nil
}

// GetSession reads one session (ErrNotFound if none): a gateway finds a session another one
// created after it started.
func (s *SQL) GetSession(ctx context.Context, id string) (Session, error) {
	var x Session
	var c, h int64
	err := s.db.QueryRowContext(ctx, s.q(`SELECT id, tenant, created, heartbeat, closed, data FROM sessions WHERE id = ?`), id).
		Scan(&x.ID, &x.Tenant, &c, &h, &x.Closed, &x.Data)
	if errors.Is(err, sql.ErrNoRows) {
		return Session{}, ErrNotFound
	}
	x.Created, x.Heartbeat = fromMS(c), fromMS(h)
	return x, err
}

// SessionMembers lists the runs (oldest first) and samplers of a session by their rows.
func (s *SQL) SessionMembers(ctx context.Context, id string) (runs, samplers []string, err error) {
	if runs, err = s.ids(ctx, `SELECT id FROM runs WHERE session_id = ? ORDER BY created, id`, id); err != nil {
		return nil, nil, err
	}
	samplers, err = s.ids(ctx, `SELECT id FROM samplers WHERE session_id = ? ORDER BY id`, id)
	return runs, samplers, err
}

// ids runs a query whose rows are one string each.
func (s *SQL) ids(ctx context.Context, query string, args ...any) ([]string, error) {
	rows, err := s.db.QueryContext(ctx, s.q(query), args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		out = append(out, id)
	}
	return out, rows.Err()
}
