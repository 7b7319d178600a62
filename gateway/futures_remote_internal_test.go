package gateway

import (
	"context"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/skein-ai/skein/store"
)

// lateNotice is a store whose GetFuture, once, lets another gateway finish the future (and its
// notification arrive) after the row was read as pending but before the reader registers it:
// the window between a waiter's read and its registration.
type lateNotice struct {
	store.Store
	once   sync.Once
	notify func(id string)
}

func (s *lateNotice) GetFuture(ctx context.Context, id string) (store.Future, error) {
	row, err := s.Store.GetFuture(ctx, id)
	s.once.Do(func() {
		if _, err := s.Store.FinishFuture(ctx, id, store.FutureComplete, []byte(`{}`), ""); err != nil {
			panic(err)
		}
		s.notify(id)
	})
	return row, err
}

func remoteFutureTable(t *testing.T) (*futureTable, *lateNotice, string) {
	t.Helper()
	sq, err := store.OpenSQLite(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sq.Close() })
	st := &lateNotice{Store: sq}
	// remotePoll of an hour: only notifications (or re-reads they cause) may wake a waiter.
	ft := newFutureTable("gw-b", time.Hour, time.Hour, st, slog.Default())
	st.notify = ft.remoteDone
	row, _, err := sq.CreateFuture(context.Background(), store.Future{ID: "gw-a-1", Tenant: "t", Kind: "forward_backward",
		Owner: "gw-a", Created: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	return ft, st, row.ID
}

// A notification that lands between a waiter's read of a pending row and its registration must
// not be lost: get re-reads the row once the future is registered.
func TestRemoteFutureFinishedWhileBeingRegisteredWakesItsWaiter(t *testing.T) {
	ft, _, id := remoteFutureTable(t)
	f, _ := ft.get("t", id)
	if f == nil {
		t.Fatal("the other gateway's future is not found")
	}
	if !ft.wait(f, 2*time.Second, nil) {
		t.Fatal("the waiter missed the completion that arrived while it registered the future")
	}
	if f.errMsg != "" {
		t.Fatalf("completed future reads as failed: %s", f.errMsg)
	}
}

// Futures finished while the notification connection was down (or before it first connected)
// are completed when it listens again.
func TestRemoteFuturesAreRecheckedWhenTheListenerConnects(t *testing.T) {
	ft, st, id := remoteFutureTable(t)
	st.once.Do(func() {}) // no late notice: the row stays pending for get
	f, _ := ft.get("t", id)
	if f == nil || !f.remote {
		t.Fatal("the other gateway's future is not registered as remote")
	}
	if _, err := st.Store.FinishFuture(context.Background(), id, store.FutureComplete, []byte(`{}`), ""); err != nil {
		t.Fatal(err)
	}
	if ft.wait(f, 50*time.Millisecond, nil) {
		t.Fatal("woken without a notification or a re-read")
	}
	ft.recheckRemote()
	if !ft.wait(f, time.Second, nil) {
		t.Fatal("the re-read on listening did not complete the future")
	}
}
