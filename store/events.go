package store

import (
	"context"
	"database/sql"
	"time"
)

// AddEvent appends an audit-log entry or a usage record.
func (s *SQL) AddEvent(ctx context.Context, e Event) error {
	_, err := s.db.ExecContext(ctx, s.q(`INSERT INTO events (tenant, at, kind, name, model_id, tinker_path, session_id,
		base_model, detail, amount, seconds) VALUES (?,?,?,?,?,?,?,?,?,?,?)`),
		e.Tenant, ms(e.At), e.Kind, e.Name, e.ModelID, e.TinkerPath, e.SessionID, e.BaseModel, e.Detail, e.Amount, e.Seconds)
	return err
}

// Events lists events of a kind in [from, to), oldest first.
func (s *SQL) Events(ctx context.Context, kind, tenant string, from, to time.Time, limit int) ([]Event, error) {
	rows, err := s.db.QueryContext(ctx, s.q(`SELECT tenant, at, kind, name, model_id, tinker_path, session_id, base_model,
		detail, amount, seconds FROM events WHERE kind = ? AND (? = '' OR tenant = ?) AND at >= ? AND at < ?
		ORDER BY at LIMIT ?`), kind, tenant, tenant, ms(from), ms(to), limit)
	if err != nil {
		return nil, err
	}
	return scanEvents(rows)
}

func scanEvents(rows *sql.Rows) ([]Event, error) {
	defer rows.Close()
	var out []Event
	for rows.Next() {
		var e Event
		var at int64
		if err := rows.Scan(&e.Tenant, &at, &e.Kind, &e.Name, &e.ModelID, &e.TinkerPath, &e.SessionID, &e.BaseModel,
			&e.Detail, &e.Amount, &e.Seconds); err != nil {
			return nil, err
		}
		e.At = fromMS(at)
		out = append(out, e)
	}
	return out, rows.Err()
}

// EventPage lists one page of events, oldest first, for keyset paging: rows at q.From's
// millisecond come in a fixed order (ties broken by every column, so rows that still tie are
// identical), and q.Skip of them are left out: those a previous page already returned.
func (s *SQL) EventPage(ctx context.Context, q EventQuery) ([]Event, error) {
	rows, err := s.db.QueryContext(ctx, s.q(`SELECT tenant, at, kind, name, model_id, tinker_path, session_id, base_model,
		detail, amount, seconds FROM events WHERE kind = ? AND (? = '' OR tenant = ?) AND (? = '' OR substr(name, 1, ?) = ?)
		AND at >= ? AND at < ? ORDER BY at, tenant, name, model_id, tinker_path, detail LIMIT ? OFFSET ?`),
		q.Kind, q.Tenant, q.Tenant, q.NamePrefix, len(q.NamePrefix), q.NamePrefix, ms(q.From), ms(q.To), q.Limit, q.Skip)
	if err != nil {
		return nil, err
	}
	return scanEvents(rows)
}

// UsageBuckets sums usage by hour (integer division of the millisecond time), tenant, name,
// session and base model.
func (s *SQL) UsageBuckets(ctx context.Context, tenant string, from, to time.Time, limit int) ([]UsageBucket, error) {
	const hour = int64(time.Hour / time.Millisecond)
	rows, err := s.db.QueryContext(ctx, s.q(`SELECT (at / ?) * ? AS hour, tenant, name, session_id, base_model,
		SUM(amount), SUM(seconds) FROM events WHERE kind = ? AND (? = '' OR tenant = ?) AND at >= ? AND at < ?
		GROUP BY hour, tenant, name, session_id, base_model ORDER BY hour, SUM(amount) DESC, tenant, name, session_id, base_model LIMIT ?`),
		hour, hour, EventUsage, tenant, tenant, ms(from), ms(to), limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []UsageBucket
	for rows.Next() {
		var b UsageBucket
		var h int64
		if err := rows.Scan(&h, &b.Tenant, &b.Name, &b.SessionID, &b.BaseModel, &b.Amount, &b.Seconds); err != nil {
			return nil, err
		}
		b.Hour = fromMS(h)
		out = append(out, b)
	}
	return out, rows.Err()
}

// SweepEvents deletes events older than the cutoff.
func (s *SQL) SweepEvents(ctx context.Context, before time.Time) (int, error) {
	res, err := s.db.ExecContext(ctx, s.q(`DELETE FROM events WHERE at < ?`), ms(before))
	if err != nil {
		return 0, err
	}
	n, err := res.RowsAffected()
	return int(n), err
}
