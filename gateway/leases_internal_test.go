package gateway

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/skein-ai/skein/storage"
	"github.com/skein-ai/skein/store"
)

// A gateway that lost a run cannot make its replica the state's writer again: the pointer
// carries the epoch of the last claim, and a claim below it is refused (a 412, as a stale
// replica's save); at the pointer's epoch or above it goes through and writes its own. Without
// leases (a single gateway) no epoch is checked or written, as before.
func TestStateClaimBelowThePointersEpochIsRefused(t *testing.T) {
	dir, err := storage.NewDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	s := &Server{storage: dir, leases: newLeaseTable(true, time.Minute, "")}
	run := "sess:train:0"
	pk := pointerKey(run)
	if _, err := storage.SwapPointerEpoch(ctx, dir, pk, stateName(run)+"@v1", "", 2); err != nil {
		t.Fatal(err)
	}
	hold := func(epoch int64) {
		s.leases.mu.Lock()
		s.leases.hold(run, epoch, time.Now(), true)
		s.leases.mu.Unlock()
	}
	hold(1)
	var stale *storage.StaleError
	if _, err := s.claimSavedState(ctx, run); !errors.As(err, &stale) || !errors.Is(err, storage.ErrPrecondition) {
		t.Fatalf("a claim at epoch 1 over a pointer at 2: %v, want a stale (412) error", err)
	}
	hold(3)
	if _, err := s.claimSavedState(ctx, run); err != nil {
		t.Fatalf("a claim at epoch 3: %v", err)
	}
	if v, _, e, err := storage.ReadPointerEpoch(ctx, dir, pk); err != nil || e != 3 || v != stateName(run)+"@v1" {
		t.Fatalf("pointer %q at epoch %d (%v), want the same version at 3", v, e, err)
	}
	hold(2)
	if _, err := s.claimSavedState(ctx, run); err == nil {
		t.Fatal("a claim at epoch 2 after one at 3 went through")
	}
	// Without leases (the only gateway): no epoch checked, none written.
	s.leases = newLeaseTable(false, 0, "")
	if _, err := s.claimSavedState(ctx, run); err != nil {
		t.Fatalf("a claim without leases: %v", err)
	}
	if _, _, e, _ := storage.ReadPointerEpoch(ctx, dir, pk); e != 0 {
		t.Fatalf("a claim without leases wrote epoch %d", e)
	}
}

// A result written after the run moved to another gateway is refused: a future whose request
// the store keeps stays pending for the new holder (waited on as a remote one), and one whose
// request is not kept (an op without a seq_id) ends as a server error saying to submit it again,
// rather than pending forever on a gateway that stays alive.
func TestARefusedResultIsLeftToTheNewHolderOrEnds(t *testing.T) {
	st, err := store.OpenSQLite(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	ft := newFutureTable("g1", time.Hour, time.Hour, st, slog.New(slog.DiscardHandler))
	l, _ := st.AcquireRunLease(ctx, "r", "g1", "", time.Minute)
	fence := &store.Fence{Run: "r", Holder: "g1", Epoch: l.Epoch}
	kept, _, err := ft.createOp("t", "ForwardBackward", "r#1", "r", []byte(`{"path":"/x"}`), fence, "")
	if err != nil || !kept.stored {
		t.Fatalf("a sequenced op: %+v %v", kept, err)
	}
	loose, _, err := ft.createOp("t", "ForwardBackward", "", "r", []byte(`{"path":"/x"}`), fence, "")
	if err != nil || loose.stored {
		t.Fatalf("an op without a seq_id: %+v %v", loose, err)
	}
	_, _ = st.AcquireRunLease(ctx, "r", "g1", "", -time.Second)
	if l2, _ := st.AcquireRunLease(ctx, "r", "g2", "", time.Minute); l2.Holder != "g2" {
		t.Fatalf("lease %+v", l2)
	}
	ft.complete(kept, map[string]int{"x": 1})
	ft.complete(loose, map[string]int{"x": 1})
	if row, _ := st.GetFuture(ctx, kept.id); row.State != store.FuturePending {
		t.Fatalf("the kept op's future is %s, want pending for the new holder", row.State)
	}
	select {
	case <-kept.done:
		t.Fatal("the kept op's waiters were answered with the refused result")
	default:
	}
	row, _ := st.GetFuture(ctx, loose.id)
	if row.State != store.FutureFailed || row.Category != "server" || string(row.Result) != movedMsg {
		t.Fatalf("the loose op's future: %+v", row)
	}
	select {
	case <-loose.done:
		if loose.errMsg != movedMsg {
			t.Fatalf("its waiters got %q", loose.errMsg)
		}
	default:
		t.Fatal("the loose op's waiters were never answered")
	}
}
