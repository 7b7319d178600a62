package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

func (s *SQL) CreateKey(ctx context.Context, k APIKey) error {
	res, err := s.db.ExecContext(ctx, s.q(`INSERT INTO api_keys (id, name, hash, admin, created, revoked)
		VALUES (?,?,?,?,?,NULL) ON CONFLICT(id) DO NOTHING`), k.ID, k.Name, k.Hash, k.Admin, ms(k.Created))
	if err != nil {
		return fmt.Errorf("store: creating key %s: %w", k.ID, err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return fmt.Errorf("store: key %s: %w", k.ID, ErrExists)
	}
	return nil
}

const keyCols = `SELECT id, name, hash, admin, created, revoked FROM api_keys`

type rowScanner interface{ Scan(dest ...any) error }

func scanKey(row rowScanner) (APIKey, error) {
	var k APIKey
	var created int64
	var revoked sql.NullInt64
	if err := row.Scan(&k.ID, &k.Name, &k.Hash, &k.Admin, &created, &revoked); err != nil {
		return APIKey{}, err
	}
	k.Created = fromMS(created)
	if revoked.Valid {
		t := fromMS(revoked.Int64)
		k.Revoked = &t
	}
	return k, nil
}

func (s *SQL) GetKey(ctx context.Context, id string) (APIKey, error) {
	k, err := scanKey(s.db.QueryRowContext(ctx, s.q(keyCols+` WHERE id = ?`), id))
	if errors.Is(err, sql.ErrNoRows) {
		return APIKey{}, ErrNotFound
	}
	return k, err
}

func (s *SQL) Keys(ctx context.Context) ([]APIKey, error) {
	rows, err := s.db.QueryContext(ctx, keyCols+` ORDER BY created, id`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []APIKey
	for rows.Next() {
		k, err := scanKey(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, k)
	}
	return out, rows.Err()
}

func (s *SQL) RevokeKey(ctx context.Context, id string, at time.Time) error {
	res, err := s.db.ExecContext(ctx, s.q(`UPDATE api_keys SET revoked = ? WHERE id = ? AND revoked IS NULL`), ms(at), id)
	if err != nil {
		return fmt.Errorf("store: revoking key %s: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 1 {
		return nil
	}
	_, err = s.GetKey(ctx, id) // not updated: already revoked (nil) or missing (ErrNotFound)
	return err
}
