package store

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
)

// Postgres is the shared store for several gateways: the SQL store plus LISTEN/NOTIFY, so that a
// future completed through one gateway wakes a retrieve_future waiting on another.
type Postgres struct {
	*SQL
	dsn string
}

// OpenPostgres connects (postgres://… URL or key=value DSN) and migrates.
func OpenPostgres(dsn string) (*Postgres, error) {
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(16)
	s := &SQL{db: db, dialect: "postgres", notify: true}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("store: connecting to PostgreSQL: %w", err)
	}
	if err := s.migrate(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("store: migrating PostgreSQL: %w", err)
	}
	return &Postgres{SQL: s, dsn: dsn}, nil
}

// ListenFutures calls fn with the id of every future finished (by any gateway) until ctx ends,
// reconnecting if the connection drops; listening (if not nil) runs after each LISTEN, since
// notifications sent while no connection listened are gone.
func (p *Postgres) ListenFutures(ctx context.Context, fn func(id string), listening func()) {
	for ctx.Err() == nil {
		conn, err := pgx.Connect(ctx, p.dsn)
		if err == nil {
			if _, err = conn.Exec(ctx, "LISTEN skein_futures"); err == nil {
				if listening != nil {
					listening()
				}
				for {
					n, err := conn.WaitForNotification(ctx)
					if err != nil {
						break
					}
					fn(n.Payload)
				}
			}
			conn.Close(context.Background())
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}
