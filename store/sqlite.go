package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	_ "modernc.org/sqlite" // pure-Go SQLite driver: no cgo
)

// SQLite is the embedded store: one file in the data directory, WAL journal.
type SQLite struct {
	db *sql.DB
}

// migrations are applied in order, each once; the schema version is PRAGMA user_version.
var migrations = []string{
	`CREATE TABLE sessions (id TEXT PRIMARY KEY, tenant TEXT NOT NULL, created INTEGER NOT NULL,
		heartbeat INTEGER NOT NULL, closed INTEGER NOT NULL DEFAULT 0, data BLOB);
	CREATE TABLE runs (id TEXT PRIMARY KEY, tenant TEXT NOT NULL, session_id TEXT NOT NULL, base_model TEXT NOT NULL,
		created INTEGER NOT NULL, last_request INTEGER NOT NULL, live INTEGER NOT NULL, data BLOB);
	CREATE TABLE samplers (id TEXT PRIMARY KEY, tenant TEXT NOT NULL, session_id TEXT NOT NULL, data BLOB);
	CREATE TABLE checkpoints (path TEXT PRIMARY KEY, owner TEXT NOT NULL, model_id TEXT NOT NULL, created INTEGER NOT NULL,
		expires_at INTEGER, public INTEGER NOT NULL, data BLOB);
	CREATE TABLE futures (id TEXT PRIMARY KEY, tenant TEXT NOT NULL, kind TEXT NOT NULL, op_key TEXT,
		state TEXT NOT NULL, result BLOB, category TEXT NOT NULL DEFAULT '', created INTEGER NOT NULL);
	CREATE UNIQUE INDEX futures_op_key ON futures(op_key) WHERE op_key IS NOT NULL;
	CREATE INDEX futures_state ON futures(state, created);`,
}

// OpenSQLite opens (creating if needed) a database file and migrates it.
func OpenSQLite(path string) (*SQLite, error) {
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)&_pragma=synchronous(NORMAL)&_pragma=foreign_keys(1)")
	if err != nil {
		return nil, err
	}
	// One writer at a time is SQLite's model; a single connection also keeps it free of SQLITE_BUSY.
	db.SetMaxOpenConns(1)
	s := &SQLite{db: db}
	if err := s.migrate(); err != nil {
		db.Close()
		return nil, fmt.Errorf("store: migrating %s: %w", path, err)
	}
	return s, nil
}

func (s *SQLite) migrate() error {
	var version int
	if err := s.db.QueryRow(`PRAGMA user_version`).Scan(&version); err != nil {
		return err
	}
	for i := version; i < len(migrations); i++ {
		tx, err := s.db.Begin()
		if err != nil {
			return err
		}
		if _, err := tx.Exec(migrations[i]); err != nil {
			tx.Rollback()
			return fmt.Errorf("migration %d: %w", i+1, err)
		}
		if _, err := tx.Exec(fmt.Sprintf(`PRAGMA user_version = %d`, i+1)); err != nil {
			tx.Rollback()
			return err
		}
		if err := tx.Commit(); err != nil {
			return err
		}
	}
	return nil
}

// Close closes the database.
func (s *SQLite) Close() error { return s.db.Close() }

func ms(t time.Time) int64 { return t.UnixMilli() }
func fromMS(v int64) time.Time {
	return time.UnixMilli(v).UTC()
}

func (s *SQLite) PutSession(ctx context.Context, x Session) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO sessions (id, tenant, created, heartbeat, closed, data) VALUES (?,?,?,?,?,?)
		ON CONFLICT(id) DO UPDATE SET heartbeat=excluded.heartbeat, closed=excluded.closed, data=excluded.data`,
		x.ID, x.Tenant, ms(x.Created), ms(x.Heartbeat), x.Closed, x.Data)
	return err
}

func (s *SQLite) Sessions(ctx context.Context) ([]Session, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT id, tenant, created, heartbeat, closed, data FROM sessions ORDER BY created`)
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

func (s *SQLite) PutRun(ctx context.Context, r Run) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO runs (id, tenant, session_id, base_model, created, last_request, live, data)
		VALUES (?,?,?,?,?,?,?,?) ON CONFLICT(id) DO UPDATE SET last_request=excluded.last_request, live=excluded.live, data=excluded.data`,
		r.ID, r.Tenant, r.SessionID, r.BaseModel, ms(r.Created), ms(r.LastRequest), r.Live, r.Data)
	return err
}

func (s *SQLite) Runs(ctx context.Context) ([]Run, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT id, tenant, session_id, base_model, created, last_request, live, data FROM runs ORDER BY created`)
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

func (s *SQLite) PutSampler(ctx context.Context, x Sampler) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO samplers (id, tenant, session_id, data) VALUES (?,?,?,?)
		ON CONFLICT(id) DO UPDATE SET data=excluded.data`, x.ID, x.Tenant, x.SessionID, x.Data)
	return err
}

func (s *SQLite) DeleteSampler(ctx context.Context, id string) error {
	_, err := s.db.ExecContext(ctx, `DELETE FROM samplers WHERE id = ?`, id)
	return err
}

func (s *SQLite) Samplers(ctx context.Context) ([]Sampler, error) {
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

func (s *SQLite) PutCheckpoint(ctx context.Context, c Checkpoint) error {
	var exp *int64
	if c.ExpiresAt != nil {
		v := ms(*c.ExpiresAt)
		exp = &v
	}
	_, err := s.db.ExecContext(ctx, `INSERT INTO checkpoints (path, owner, model_id, created, expires_at, public, data)
		VALUES (?,?,?,?,?,?,?) ON CONFLICT(path) DO UPDATE SET owner=excluded.owner, created=excluded.created,
		expires_at=excluded.expires_at, public=excluded.public, data=excluded.data`,
		c.Path, c.Owner, c.ModelID, ms(c.Created), exp, c.Public, c.Data)
	return err
}

func (s *SQLite) DeleteCheckpoint(ctx context.Context, path string) error {
	_, err := s.db.ExecContext(ctx, `DELETE FROM checkpoints WHERE path = ?`, path)
	return err
}

func (s *SQLite) Checkpoints(ctx context.Context) ([]Checkpoint, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT path, owner, model_id, created, expires_at, public, data FROM checkpoints ORDER BY created`)
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

func (s *SQLite) CreateFuture(ctx context.Context, f Future) (Future, bool, error) {
	if f.State == "" {
		f.State = FuturePending
	}
	res, err := s.db.ExecContext(ctx, `INSERT INTO futures (id, tenant, kind, op_key, state, result, category, created)
		VALUES (?,?,?,?,?,?,?,?) ON CONFLICT DO NOTHING`,
		f.ID, f.Tenant, f.Kind, nullable(f.OpKey), f.State, f.Result, f.Category, ms(f.Created))
	if err != nil {
		return Future{}, false, err
	}
	if n, _ := res.RowsAffected(); n == 1 {
		return f, true, nil
	}
	if f.OpKey == "" {
		return Future{}, false, fmt.Errorf("store: future %s already exists", f.ID)
	}
	existing, err := s.scanFuture(s.db.QueryRowContext(ctx, futureCols+` WHERE op_key = ?`, f.OpKey))
	if err != nil {
		return Future{}, false, err
	}
	return existing, false, nil
}

const futureCols = `SELECT id, tenant, kind, COALESCE(op_key, ''), state, result, category, created FROM futures`

func (s *SQLite) scanFuture(row *sql.Row) (Future, error) {
	var f Future
	var created int64
	if err := row.Scan(&f.ID, &f.Tenant, &f.Kind, &f.OpKey, &f.State, &f.Result, &f.Category, &created); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return Future{}, ErrNotFound
		}
		return Future{}, err
	}
	f.Created = fromMS(created)
	return f, nil
}

func (s *SQLite) FinishFuture(ctx context.Context, id, state string, result []byte, category string) (bool, error) {
	if state != FutureComplete && state != FutureFailed {
		return false, fmt.Errorf("store: %q is not a terminal state", state)
	}
	res, err := s.db.ExecContext(ctx, `UPDATE futures SET state = ?, result = ?, category = ? WHERE id = ? AND state = ?`,
		state, result, category, id, FuturePending)
	if err != nil {
		return false, err
	}
	n, _ := res.RowsAffected()
	return n == 1, nil
}

func (s *SQLite) GetFuture(ctx context.Context, id string) (Future, error) {
	return s.scanFuture(s.db.QueryRowContext(ctx, futureCols+` WHERE id = ?`, id))
}

func (s *SQLite) FailPending(ctx context.Context, msg string) (int, error) {
	res, err := s.db.ExecContext(ctx, `UPDATE futures SET state = ?, result = ?, category = 'server' WHERE state = ?`,
		FutureFailed, []byte(msg), FuturePending)
	if err != nil {
		return 0, err
	}
	n, _ := res.RowsAffected()
	return int(n), nil
}

func (s *SQLite) SweepFutures(ctx context.Context, before time.Time) (int, error) {
	res, err := s.db.ExecContext(ctx, `DELETE FROM futures WHERE state != ? AND created < ?`, FuturePending, ms(before))
	if err != nil {
		return 0, err
	}
	n, _ := res.RowsAffected()
	return int(n), nil
}
