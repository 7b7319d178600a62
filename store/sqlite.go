package store

import (
	"context"
	"database/sql"
	"fmt"

	_ "modernc.org/sqlite" // pure-Go SQLite driver: no cgo
)

// OpenSQLite opens (creating if needed) the embedded store: one file, WAL journal.
func OpenSQLite(path string) (*SQL, error) {
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)&_pragma=synchronous(NORMAL)")
	if err != nil {
		return nil, err
	}
	// One writer at a time is SQLite's model; a single connection also keeps it free of SQLITE_BUSY.
	db.SetMaxOpenConns(1)
	s := &SQL{db: db, dialect: "sqlite"}
	if err := s.migrate(context.Background()); err != nil {
		db.Close()
		return nil, fmt.Errorf("store: migrating %s: %w", path, err)
	}
	return s, nil
}
