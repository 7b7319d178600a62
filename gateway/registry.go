package gateway

// The server's in-memory state, one registry per resource (sessions, training runs, samplers,
// checkpoints), each with its own lock: a request on one resource never waits for another's.
// A registry's lock guards its map and the mutable fields of its entries. Code that needs two at
// once takes them in this order, never the other way round: sessions, runs, samplers, ckpts.
//
// Store writes (a network round trip on PostgreSQL) are made after the lock is released: a change
// takes a snapshot of its row under the lock (rowVersion.bump numbers it) and writes it after.
// rowVersion.write then keeps a later snapshot from being overtaken by an earlier one of the same
// row: writes of one row are serialized by a lock held only across the store call, and a snapshot
// older than the one already written is dropped (the newer one holds everything it had).

import (
	"context"
	"sync"
)

type registry[T any] struct {
	mu sync.Mutex
	m  map[string]*T
}

func newRegistry[T any]() *registry[T] { return &registry[T]{m: map[string]*T{}} }

// get is the entry of id, or nil.
func (r *registry[T]) get(id string) *T {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.m[id]
}

// add registers v as the entry of id.
func (r *registry[T]) add(id string, v *T) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.m[id] = v
}

// remove forgets the entry of id.
func (r *registry[T]) remove(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.m, id)
}

// rowVersion orders the store writes of one row (a session, run or checkpoint).
type rowVersion struct {
	taken   uint64     // snapshots taken; guarded by the lock of the row's registry
	writeMu sync.Mutex // held across one store write of the row, never across a state change
	written uint64     // the newest snapshot stored; guarded by writeMu
}

// bump numbers a new snapshot of the row; call with the row's registry lock held.
func (v *rowVersion) bump() uint64 {
	v.taken++
	return v.taken
}

// write stores snapshot n with put, unless a newer snapshot of the row is stored already. When it
// returns, the store holds snapshot n or a newer one (or put failed and said so).
func (v *rowVersion) write(n uint64, put func() error) error {
	v.writeMu.Lock()
	defer v.writeMu.Unlock()
	if n <= v.written {
		return nil
	}
	if err := put(); err != nil {
		return err
	}
	v.written = n
	return nil
}

// rowWrite is a snapshot of a row taken under its registry's lock, to be stored after the lock
// is released.
type rowWrite struct {
	what string // for the log, on failure
	ver  *rowVersion
	n    uint64
	put  func(ctx context.Context) error
}

// store writes the snapshot (see rowVersion.write).
func (w rowWrite) store() error {
	return w.ver.write(w.n, func() error { return w.put(context.Background()) })
}

// persist stores snapshots taken under a registry's lock, in order, logging failures: the
// in-memory state stays authoritative, as it was when these writes were made under the lock.
func (s *Server) persist(writes ...rowWrite) {
	for _, w := range writes {
		s.logErr(w.what, w.store())
	}
}
