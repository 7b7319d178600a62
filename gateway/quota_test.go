package gateway_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/client"
	"github.com/skein-ai/skein/gateway"
)

// savedCheckpoints lists a run's checkpoints.
func savedCheckpoints(t *testing.T, c *client.Client, modelID string) []api.Checkpoint {
	t.Helper()
	var list struct {
		Checkpoints []api.Checkpoint `json:"checkpoints"`
	}
	if err := c.Do(context.Background(), "GET", "training_runs/"+modelID+"/checkpoints", nil, &list); err != nil {
		t.Fatal(err)
	}
	return list.Checkpoints
}

// A tenant's checkpoints are held to its storage quota: a save that would pass it fails with a
// user error naming the quota and leaves nothing behind, and once the tenant is at its quota a
// save is refused up front with a 400; another tenant is not affected.
func TestTenantCheckpointQuota(t *testing.T) {
	ctx := context.Background()
	// The size of one checkpoint of this model and rank, from a server without a quota.
	free := newServer(t, gateway.Options{TenantCheckpointBytes: -1})
	c0, tc0 := newRun(t, free.URL, "tml-measure", 4)
	f, err := tc0.SaveState(ctx, "one")
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Result(ctx, nil); err != nil {
		t.Fatal(err)
	}
	size := savedCheckpoints(t, c0, tc0.ModelID)[0].SizeBytes
	if size <= 0 {
		t.Fatalf("checkpoint size %d", size)
	}

	// A quota one byte short of a checkpoint: the save fails after writing, and leaves nothing.
	short := newServer(t, gateway.Options{TenantCheckpointBytes: size - 1})
	c1, tc1 := newRun(t, short.URL, "tml-short", 4)
	f, err = tc1.SaveState(ctx, "one")
	if err != nil {
		t.Fatal(err)
	}
	var failed *client.RequestFailed
	if err := f.Result(ctx, nil); !errors.As(err, &failed) || failed.Category != "user" || !strings.Contains(failed.Message, "quota") {
		t.Fatalf("a save past the quota: want a user error naming the quota, got %v", err)
	}
	if got := savedCheckpoints(t, c1, tc1.ModelID); len(got) != 0 {
		t.Fatalf("a refused save left checkpoints %+v", got)
	}

	// A quota of exactly one checkpoint: the first save fits, the next is refused up front.
	exact := newServer(t, gateway.Options{TenantCheckpointBytes: size})
	c2, tc2 := newRun(t, exact.URL, "tml-exact", 4)
	f, err = tc2.SaveState(ctx, "one")
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Result(ctx, nil); err != nil {
		t.Fatalf("a save within the quota: %v", err)
	}
	if _, err := tc2.SaveState(ctx, "two"); !isStatus(err, 400) || !strings.Contains(err.Error(), "quota") {
		t.Fatalf("a save at the quota: want 400 naming the quota, got %v", err)
	}
	if got := savedCheckpoints(t, c2, tc2.ModelID); len(got) != 1 {
		t.Fatalf("checkpoints after the refusal: %+v", got)
	}
	// The run goes on (the refused save consumed its seq_id), and other tenants have their own quota.
	f, err = tc2.OptimStep(ctx, 1e-3)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Result(ctx, nil); err != nil {
		t.Fatal(err)
	}
	_, other := newRun(t, exact.URL, "tml-other", 4)
	if f, err = other.SaveState(ctx, "one"); err != nil {
		t.Fatal(err)
	}
	if err := f.Result(ctx, nil); err != nil {
		t.Fatalf("another tenant's save: %v", err)
	}
}
