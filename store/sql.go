package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"
)

// SQL is the Store over database/sql, for SQLite (embedded default) and PostgreSQL (shared by
// several gateways). The two differ only in placeholders, a few type names, and notifications.
type SQL struct {
	db      *sql.DB
	dialect string // "sqlite" or "postgres"
	notify  bool   // pg_notify on future completion
}

// migrations are applied in order, each once, recorded in skein_schema. {{BLOB}}, {{INT}} and
// {{BOOL}} are replaced by the dialect's type names.
var migrations = []string{
	`CREATE TABLE sessions (id TEXT PRIMARY KEY, tenant TEXT NOT NULL, created {{INT}} NOT NULL,
		heartbeat {{INT}} NOT NULL, closed {{BOOL}} NOT NULL DEFAULT FALSE, data {{BLOB}});
	CREATE TABLE runs (id TEXT PRIMARY KEY, tenant TEXT NOT NULL, session_id TEXT NOT NULL, base_model TEXT NOT NULL,
		created {{INT}} NOT NULL, last_request {{INT}} NOT NULL, live {{BOOL}} NOT NULL, data {{BLOB}});
	CREATE TABLE samplers (id TEXT PRIMARY KEY, tenant TEXT NOT NULL, session_id TEXT NOT NULL, data {{BLOB}});
	CREATE TABLE checkpoints (path TEXT PRIMARY KEY, owner TEXT NOT NULL, model_id TEXT NOT NULL, created {{INT}} NOT NULL,
		expires_at {{INT}}, public {{BOOL}} NOT NULL, data {{BLOB}});
	CREATE TABLE futures (id TEXT PRIMARY KEY, tenant TEXT NOT NULL, kind TEXT NOT NULL, op_key TEXT,
		owner TEXT NOT NULL DEFAULT '', state TEXT NOT NULL, result {{BLOB}}, category TEXT NOT NULL DEFAULT '',
		created {{INT}} NOT NULL);
	CREATE UNIQUE INDEX futures_op_key ON futures(op_key) WHERE op_key IS NOT NULL;
	CREATE INDEX futures_state ON futures(state, created);
	CREATE TABLE gateways (id TEXT PRIMARY KEY, heartbeat {{INT}} NOT NULL);
	CREATE TABLE leases (name TEXT PRIMARY KEY, holder TEXT NOT NULL, until {{INT}} NOT NULL);`,
	// 2: tenants (API keys are kept only as hashes) and the router's placements.
	`CREATE TABLE tenants (id TEXT PRIMARY KEY, first_seen {{INT}} NOT NULL, last_seen {{INT}} NOT NULL);
	CREATE TABLE placements (adapter TEXT PRIMARY KEY, replica TEXT NOT NULL, updated {{INT}} NOT NULL);`,
	// 3: issued API keys (`--auth keys`), found by id; only the key's SHA-256 is kept.
	`CREATE TABLE api_keys (id TEXT PRIMARY KEY, name TEXT NOT NULL, hash {{BLOB}} NOT NULL,
		admin {{BOOL}} NOT NULL, created {{INT}} NOT NULL, revoked {{INT}});`,
	// 4: the audit log and the usage ledger, one row per event, found by tenant and time.
	`CREATE TABLE events (tenant TEXT NOT NULL, at {{INT}} NOT NULL, kind TEXT NOT NULL, name TEXT NOT NULL,
		model_id TEXT NOT NULL, tinker_path TEXT NOT NULL, session_id TEXT NOT NULL, base_model TEXT NOT NULL,
		detail TEXT NOT NULL, amount DOUBLE PRECISION NOT NULL, seconds DOUBLE PRECISION NOT NULL);
	CREATE INDEX events_kind_at ON events(kind, at);
	CREATE INDEX events_tenant_at ON events(tenant, kind, at);`,
	// 5: per-step training metrics, a bounded window per run (see AddStepMetric).
	`CREATE TABLE run_metrics (run_id TEXT NOT NULL, step {{INT}} NOT NULL, at {{INT}} NOT NULL, data {{BLOB}},
		PRIMARY KEY (run_id, step));`,
	// 6: run leases (issue 38): one sequencer per run among several gateways, fenced by an epoch
	// that only grows; a sequenced future keeps its run and its request, so that the run's next
	// holder can run it when its gateway died.
	`CREATE TABLE run_leases (run_id TEXT PRIMARY KEY, holder TEXT NOT NULL, addr TEXT NOT NULL, epoch {{INT}} NOT NULL,
		until {{INT}} NOT NULL);
	CREATE INDEX run_leases_holder ON run_leases(holder, until);
	ALTER TABLE futures ADD COLUMN run_id TEXT;
	ALTER TABLE futures ADD COLUMN request {{BLOB}};
	CREATE INDEX futures_run ON futures(run_id, state) WHERE run_id IS NOT NULL;`,
	// 7: a session's runs and samplers read by their rows' session_id (SessionMembers): with
	// several gateways, the list in the session's row is only its last writer's.
	`CREATE INDEX runs_session ON runs(session_id);
	CREATE INDEX samplers_session ON samplers(session_id);`,
	// 8: secrets every gateway of a cluster must agree on (the workers' token, the key that signs
	// download links), so that a gateway needs no data directory of its own (issue 38).
	`CREATE TABLE cluster_secrets (name TEXT PRIMARY KEY, value {{BLOB}} NOT NULL, created {{INT}} NOT NULL);`,
	// 9: listings of one tenant (what it owns, and what is published) read only its rows, with
	// several gateways (each listing reads the store).
	`CREATE INDEX sessions_tenant ON sessions(tenant);
	CREATE INDEX runs_tenant ON runs(tenant);
	CREATE INDEX checkpoints_owner ON checkpoints(owner);
	CREATE INDEX checkpoints_public ON checkpoints(model_id) WHERE public;`,
}

func (s *SQL) ddl(q string) string {
	r := strings.NewReplacer("{{BLOB}}", "BLOB", "{{INT}}", "INTEGER", "{{BOOL}}", "BOOLEAN")
	if s.dialect == "postgres" {
		r = strings.NewReplacer("{{BLOB}}", "BYTEA", "{{INT}}", "BIGINT", "{{BOOL}}", "BOOLEAN")
	}
	return r.Replace(q)
}

// q rewrites ? placeholders to $n for PostgreSQL.
func (s *SQL) q(query string) string {
	if s.dialect != "postgres" {
		return query
	}
	var b strings.Builder
	n := 0
	for _, r := range query {
		if r == '?' {
			n++
			fmt.Fprintf(&b, "$%d", n)
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

func (s *SQL) migrate(ctx context.Context) error {
	if _, err := s.db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS skein_schema (version INTEGER NOT NULL)`); err != nil {
		return err
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if s.dialect == "postgres" {
		// Gateways starting together must not migrate twice.
		if _, err := tx.ExecContext(ctx, `LOCK TABLE skein_schema IN EXCLUSIVE MODE`); err != nil {
			return err
		}
	}
	var version int
	if err := tx.QueryRowContext(ctx, `SELECT COALESCE(MAX(version), 0) FROM skein_schema`).Scan(&version); err != nil {
		return err
	}
	for i := version; i < len(migrations); i++ {
		for _, stmt := range strings.Split(s.ddl(migrations[i]), ";") {
			if strings.TrimSpace(stmt) == "" {
				continue
			}
			if _, err := tx.ExecContext(ctx, stmt); err != nil {
				return fmt.Errorf("migration %d: %w", i+1, err)
			}
		}
		if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO skein_schema (version) VALUES (?)`), i+1); err != nil {
			return err
		}
	}
	return tx.Commit()
}

// Close closes the database.
func (s *SQL) Close() error { return s.db.Close() }

func ms(t time.Time) int64 { return t.UnixMilli() }
func fromMS(v int64) time.Time {
	return time.UnixMilli(v).UTC()
}

func (s *SQL) PutSession(ctx context.Context, x Session) error {
	_, err := s.db.ExecContext(ctx, s.q(`INSERT INTO sessions (id, tenant, created, heartbeat, closed, data) VALUES (?,?,?,?,?,?)
		ON CONFLICT(id) DO UPDATE SET heartbeat=excluded.heartbeat, closed=excluded.closed, data=excluded.data`),
		x.ID, x.Tenant, ms(x.Created), ms(x.Heartbeat), x.Closed, x.Data)
	return err
}

func (s *SQL) TouchSession(ctx context.Context, id string, heartbeat time.Time) error {
	_, err := s.db.ExecContext(ctx, s.q(`UPDATE sessions SET heartbeat = ? WHERE id = ? AND heartbeat < ?`), ms(heartbeat), id, ms(heartbeat))
	return err
}

func (s *SQL) Sessions(ctx context.Context) ([]Session, error) { return s.sessionsWhere(ctx, "") }

// SessionsOf lists one tenant's sessions, oldest first.
func (s *SQL) SessionsOf(ctx context.Context, tenant string) ([]Session, error) {
	return s.sessionsWhere(ctx, "WHERE tenant = ?", tenant)
}

func (s *SQL) sessionsWhere(ctx context.Context, where string, args ...any) ([]Session, error) {
	rows, err := s.db.QueryContext(ctx, s.q(`SELECT id, tenant, created, heartbeat, closed, data FROM sessions `+where+` ORDER BY created`), args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Session
	for rows.Next() {
		var x Session
		var c, h int64
		if err := rows.Scan(&x.ID, &x.Tenant, &c, &h, &x.Closed, &x.Data); err != nil {
			return nil, err
		}
		x.Created, x.Heartbeat = fromMS(c), fromMS(h)
		out = append(out, x)
	}
	return out, rows.Err()
}

func (s *SQL) PutRun(ctx context.Context, r Run) error {
	_, err := s.db.ExecContext(ctx, s.q(`INSERT INTO runs (id, tenant, session_id, base_model, created, last_request, live, data)
		VALUES (?,?,?,?,?,?,?,?) ON CONFLICT(id) DO UPDATE SET last_request=excluded.last_request, live=excluded.live, data=excluded.data`),
		r.ID, r.Tenant, r.SessionID, r.BaseModel, ms(r.Created), ms(r.LastRequest), r.Live, r.Data)
	return err
}

func (s *SQL) Runs(ctx context.Context) ([]Run, error) { return s.runsWhere(ctx, "") }

// RunsVisibleTo lists a tenant's runs and the runs with a published checkpoint, oldest first.
func (s *SQL) RunsVisibleTo(ctx context.Context, tenant string) ([]Run, error) {
	return s.runsWhere(ctx, "WHERE tenant = ? OR id IN (SELECT model_id FROM checkpoints WHERE public)", tenant)
}

func (s *SQL) runsWhere(ctx context.Context, where string, args ...any) ([]Run, error) {
	rows, err := s.db.QueryContext(ctx, s.q(`SELECT id, tenant, session_id, base_model, created, last_request, live, data FROM runs `+where+` ORDER BY created`), args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Run
	for rows.Next() {
		var r Run
		var c, l int64
		if err := rows.Scan(&r.ID, &r.Tenant, &r.SessionID, &r.BaseModel, &c, &l, &r.Live, &r.Data); err != nil {
			return nil, err
		}
		r.Created, r.LastRequest = fromMS(c), fromMS(l)
		out = append(out, r)
	}
	return out, rows.Err()
}

func (s *SQL) PutSampler(ctx context.Context, x Sampler) error {
	_, err := s.db.ExecContext(ctx, s.q(`INSERT INTO samplers (id, tenant, session_id, data) VALUES (?,?,?,?)
		ON CONFLICT(id) DO UPDATE SET data=excluded.data`), x.ID, x.Tenant, x.SessionID, x.Data)
	return err
}

func (s *SQL) DeleteSession(ctx context.Context, id string) error {
	_, err := s.db.ExecContext(ctx, s.q(`DELETE FROM sessions WHERE id = ?`), id)
	return err
}

func (s *SQL) DeleteRun(ctx context.Context, id string) error {
	_, err := s.db.ExecContext(ctx, s.q(`DELETE FROM runs WHERE id = ?`), id)
	return err
}

func (s *SQL) DeleteSampler(ctx context.Context, id string) error {
	_, err := s.db.ExecContext(ctx, s.q(`DELETE FROM samplers WHERE id = ?`), id)
	return err
}

func (s *SQL) Samplers(ctx context.Context) ([]Sampler, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT id, tenant, session_id, data FROM samplers`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Sampler
	for rows.Next() {
		var x Sampler
		if err := rows.Scan(&x.ID, &x.Tenant, &x.SessionID, &x.Data); err != nil {
			return nil, err
		}
		out = append(out, x)
	}
	return out, rows.Err()
}

func (s *SQL) PutCheckpoint(ctx context.Context, c Checkpoint) error {
	var exp *int64
	if c.ExpiresAt != nil {
		v := ms(*c.ExpiresAt)
		exp = &v
	}
	_, err := s.db.ExecContext(ctx, s.q(`INSERT INTO checkpoints (path, owner, model_id, created, expires_at, public, data)
		VALUES (?,?,?,?,?,?,?) ON CONFLICT(path) DO UPDATE SET owner=excluded.owner, created=excluded.created,
		expires_at=excluded.expires_at, public=excluded.public, data=excluded.data`),
		c.Path, c.Owner, c.ModelID, ms(c.Created), exp, c.Public, c.Data)
	return err
}

func (s *SQL) DeleteCheckpoint(ctx context.Context, path string) error {
	_, err := s.db.ExecContext(ctx, s.q(`DELETE FROM checkpoints WHERE path = ?`), path)
	return err
}

func (s *SQL) Checkpoints(ctx context.Context) ([]Checkpoint, error) {
	return s.checkpointsWhere(ctx, "")
}

// CheckpointsVisibleTo lists a tenant's checkpoints and the published ones, oldest first.
func (s *SQL) CheckpointsVisibleTo(ctx context.Context, tenant string) ([]Checkpoint, error) {
	return s.checkpointsWhere(ctx, "WHERE owner = ? OR public", tenant)
}

func (s *SQL) checkpointsWhere(ctx context.Context, where string, args ...any) ([]Checkpoint, error) {
	rows, err := s.db.QueryContext(ctx, s.q(`SELECT path, owner, model_id, created, expires_at, public, data FROM checkpoints `+where+` ORDER BY created`), args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Checkpoint
	for rows.Next() {
		var c Checkpoint
		var created int64
		var exp sql.NullInt64
		if err := rows.Scan(&c.Path, &c.Owner, &c.ModelID, &created, &exp, &c.Public, &c.Data); err != nil {
			return nil, err
		}
		c.Created = fromMS(created)
		if exp.Valid {
			t := fromMS(exp.Int64)
			c.ExpiresAt = &t
		}
		out = append(out, c)
	}
	return out, rows.Err()
}

func nullable(s string) any {
	if s == "" {
		return nil
	}
	return s
}

func (s *SQL) CreateFuture(ctx context.Context, f Future) (Future, bool, error) {
	if f.State == "" {
		f.State = FuturePending
	}
	res, err := s.db.ExecContext(ctx, s.q(`INSERT INTO futures (id, tenant, kind, op_key, owner, state, result, category, created, run_id, request)
		VALUES (?,?,?,?,?,?,?,?,?,?,?) ON CONFLICT DO NOTHING`),
		f.ID, f.Tenant, f.Kind, nullable(f.OpKey), f.Owner, f.State, f.Result, f.Category, ms(f.Created), nullable(f.Run), f.Request)
	if err != nil {
		return Future{}, false, err
	}
	if n, _ := res.RowsAffected(); n == 1 {
		return f, true, nil
	}
	if f.OpKey == "" {
		return Future{}, false, fmt.Errorf("store: future %s already exists", f.ID)
	}
	existing, err := s.scanFuture(s.db.QueryRowContext(ctx, s.q(futureCols+` WHERE op_key = ?`), f.OpKey))
	if err != nil {
		return Future{}, false, err
	}
	return existing, false, nil
}

const futureCols = `SELECT id, tenant, kind, COALESCE(op_key, ''), owner, state, result, category, created,
	COALESCE(run_id, ''), request FROM futures`

func (s *SQL) scanFuture(row *sql.Row) (Future, error) { return s.scanFutureRow(row) }

func (s *SQL) scanFutureRow(row interface{ Scan(...any) error }) (Future, error) {
	var f Future
	var created int64
	if err := row.Scan(&f.ID, &f.Tenant, &f.Kind, &f.OpKey, &f.Owner, &f.State, &f.Result, &f.Category, &created, &f.Run, &f.Request); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return Future{}, ErrNotFound
		}
		return Future{}, err
	}
	f.Created = fromMS(created)
	return f, nil
}

func (s *SQL) FinishFuture(ctx context.Context, id, state string, result []byte, category string) (bool, error) {
	if state != FutureComplete && state != FutureFailed {
		return false, fmt.Errorf("store: %q is not a terminal state", state)
	}
	// A finished op's request is never run again: it is not kept (it may be megabytes).
	res, err := s.db.ExecContext(ctx, s.q(`UPDATE futures SET state = ?, result = ?, category = ?, request = NULL WHERE id = ? AND state = ?`),
		state, result, category, id, FuturePending)
	if err != nil {
		return false, err
	}
	n, _ := res.RowsAffected()
	if n == 1 {
		return true, s.notifyFinished(ctx, id)
	}
	return false, nil
}

// notifyFinished wakes retrieve_future long-polls waiting on other gateways.
func (s *SQL) notifyFinished(ctx context.Context, id string) error {
	if !s.notify {
		return nil
	}
	_, err := s.db.ExecContext(ctx, `SELECT pg_notify('skein_futures', $1)`, id)
	return err
}

func (s *SQL) GetFuture(ctx context.Context, id string) (Future, error) {
	return s.scanFuture(s.db.QueryRowContext(ctx, s.q(futureCols+` WHERE id = ?`), id))
}

func (s *SQL) FailOrphaned(ctx context.Context, self string, liveWithin time.Duration, msg string) (int, error) {
	cutoff := ms(time.Now().Add(-liveWithin))
	res, err := s.db.ExecContext(ctx, s.q(`UPDATE futures SET state = ?, result = ?, category = 'server'
		WHERE state = ? AND request IS NULL AND owner != ? AND owner NOT IN (SELECT id FROM gateways WHERE heartbeat > ? AND id != ?)`),
		FutureFailed, []byte(msg), FuturePending, self, cutoff, self)
	if err != nil {
		return 0, err
	}
	n, _ := res.RowsAffected()
	return int(n), nil
}

func (s *SQL) SweepFutures(ctx context.Context, before time.Time) (int, error) {
	res, err := s.db.ExecContext(ctx, s.q(`DELETE FROM futures WHERE state != ? AND created < ?`), FuturePending, ms(before))
	if err != nil {
		return 0, err
	}
	n, _ := res.RowsAffected()
	return int(n), nil
}

func (s *SQL) GatewayHeartbeat(ctx context.Context, id string) error {
	_, err := s.db.ExecContext(ctx, s.q(`INSERT INTO gateways (id, heartbeat) VALUES (?, ?)
		ON CONFLICT(id) DO UPDATE SET heartbeat = excluded.heartbeat`), id, ms(time.Now()))
	return err
}

func (s *SQL) TryLease(ctx context.Context, name, holder string, ttl time.Duration) (bool, error) {
	now := time.Now()
	res, err := s.db.ExecContext(ctx, s.q(`INSERT INTO leases (name, holder, until) VALUES (?, ?, ?)
		ON CONFLICT(name) DO UPDATE SET holder = excluded.holder, until = excluded.until
		WHERE leases.holder = excluded.holder OR leases.until < ?`), name, holder, ms(now.Add(ttl)), ms(now))
	if err != nil {
		return false, err
	}
	n, _ := res.RowsAffected()
	return n == 1, nil
}

// ClusterSecret stores candidate as the secret called name unless one is stored already, and
// returns the stored one: the first gateway to ask decides, every later one reads its answer.
func (s *SQL) ClusterSecret(ctx context.Context, name string, candidate []byte) ([]byte, error) {
	if len(candidate) == 0 {
		return nil, errors.New("store: an empty cluster secret")
	}
	if _, err := s.db.ExecContext(ctx, s.q(`INSERT INTO cluster_secrets (name, value, created) VALUES (?, ?, ?)
		ON CONFLICT(name) DO NOTHING`), name, candidate, ms(time.Now())); err != nil {
		return nil, err
	}
	var v []byte
	if err := s.db.QueryRowContext(ctx, s.q(`SELECT value FROM cluster_secrets WHERE name = ?`), name).Scan(&v); err != nil {
		return nil, err
	}
	return v, nil
}

func (s *SQL) TouchTenant(ctx context.Context, id string) error {
	now := ms(time.Now())
	_, err := s.db.ExecContext(ctx, s.q(`INSERT INTO tenants (id, first_seen, last_seen) VALUES (?, ?, ?)
		ON CONFLICT(id) DO UPDATE SET last_seen = excluded.last_seen`), id, now, now)
	return err
}

func (s *SQL) Tenants(ctx context.Context) ([]string, error) {
	return s.ids(ctx, `SELECT id FROM tenants ORDER BY first_seen`)
}

func (s *SQL) PutPlacement(ctx context.Context, adapter, replica string) error {
	_, err := s.db.ExecContext(ctx, s.q(`INSERT INTO placements (adapter, replica, updated) VALUES (?, ?, ?)
		ON CONFLICT(adapter) DO UPDATE SET replica = excluded.replica, updated = excluded.updated`), adapter, replica, ms(time.Now()))
	return err
}

func (s *SQL) DeletePlacement(ctx context.Context, adapter string) error {
	_, err := s.db.ExecContext(ctx, s.q(`DELETE FROM placements WHERE adapter = ?`), adapter)
	return err
}

func (s *SQL) Placements(ctx context.Context) (map[string]string, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT adapter, replica FROM placements`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var a, r string
		if err := rows.Scan(&a, &r); err != nil {
			return nil, err
		}
		out[a] = r
	}
	return out, rows.Err()
}

func (s *SQL) AddStepMetric(ctx context.Context, m StepMetric, keep int) error {
	if keep < 1 {
		return fmt.Errorf("store: keep must be positive, not %d", keep)
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO run_metrics (run_id, step, at, data) VALUES (?,?,?,?)
		ON CONFLICT(run_id, step) DO UPDATE SET at = excluded.at, data = excluded.data`), m.RunID, m.Step, ms(m.At), m.Data); err != nil {
		return err
	}
	// The window follows the newest step stored, so a step replayed out of order cannot drop newer ones.
	if _, err := tx.ExecContext(ctx, s.q(`DELETE FROM run_metrics WHERE run_id = ?
		AND step <= (SELECT MAX(step) FROM run_metrics WHERE run_id = ?) - ?`), m.RunID, m.RunID, keep); err != nil {
		return err
	}
	return tx.Commit()
}

func (s *SQL) StepMetrics(ctx context.Context, runID string, afterStep int64, limit int) ([]StepMetric, error) {
	rows, err := s.db.QueryContext(ctx, s.q(`SELECT run_id, step, at, data FROM run_metrics
		WHERE run_id = ? AND step > ? ORDER BY step LIMIT ?`), runID, afterStep, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []StepMetric
	for rows.Next() {
		var m StepMetric
		var at int64
		if err := rows.Scan(&m.RunID, &m.Step, &at, &m.Data); err != nil {
			return nil, err
		}
		m.At = fromMS(at)
		out = append(out, m)
	}
	return out, rows.Err()
}

func (s *SQL) DeleteStepMetrics(ctx context.Context, runID string) error {
	_, err := s.db.ExecContext(ctx, s.q(`DELETE FROM run_metrics WHERE run_id = ?`), runID)
	return err
}
