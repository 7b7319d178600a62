package gateway

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/skein-ai/skein/storage"
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
