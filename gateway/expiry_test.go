package gateway_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/skein-ai/skein/client"
	"github.com/skein-ai/skein/gateway"
	"github.com/skein-ai/skein/store"
)

// When a session expires its ephemeral sampler weights go with it, and once its retention has
// passed its rows go from the store: the sweep follows the retention, not an hourly clock.
func TestExpiredSessionsLeaveNothingBehindForLong(t *testing.T) {
	data := t.TempDir()
	ts := newServer(t, gateway.Options{DataDir: data, SessionTimeout: 3 * time.Second, SessionRetention: 2 * time.Second})
	ctx := context.Background()
	c, tc := trainedModel(t, ts, "tml-expiry")
	trainOne(t, tc)
	f, err := tc.SaveWeightsForSampler(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	var out struct {
		SamplingSessionID string `json:"sampling_session_id"`
	}
	if err := f.Result(ctx, &out); err != nil || out.SamplingSessionID == "" {
		t.Fatalf("ephemeral sampler: %+v %v", out, err)
	}
	_ = c
	weights := filepath.Join(data, "ephemeral", out.SamplingSessionID)
	if _, err := os.Stat(weights); err != nil {
		t.Fatalf("the ephemeral sampler's weights are not where expected: %v", err)
	}
	st, err := store.OpenSQLite(filepath.Join(data, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	// No heartbeats: the session expires after 3 s; its weights must go then, its rows once the
	// 2 s retention has passed. 30 s is a generous bound next to the old hourly sweep.
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, statErr := os.Stat(weights)
		rows, err := st.Sessions(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if os.IsNotExist(statErr) && len(rows) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("30 s after the session expired: weights still there %v, %d session rows in the store", statErr == nil, len(rows))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// A tenant holds at most MaxSessionsPerTenant live sessions: one more is a 429 saying so, and
// expired sessions do not count (other tenants are not affected).
func TestSessionsPerTenantAreBounded(t *testing.T) {
	ts := newServer(t, gateway.Options{MaxSessionsPerTenant: 3, SessionTimeout: 2 * time.Second})
	ctx := context.Background()
	c := client.New(ts.URL, "tml-many")
	for i := range 3 {
		if _, err := c.CreateSession(ctx); err != nil {
			t.Fatalf("session %d within the bound: %v", i, err)
		}
	}
	_, err := c.CreateSession(ctx)
	if !isStatus(err, 429) || !strings.Contains(err.Error(), "limit 3") {
		t.Fatalf("a fourth live session: want 429 naming the limit, got %v", err)
	}
	if _, err := client.New(ts.URL, "tml-other").CreateSession(ctx); err != nil {
		t.Fatalf("another tenant: %v", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := c.CreateSession(ctx)
		if err == nil {
			break
		}
		if !isStatus(err, 429) || time.Now().After(deadline) {
			t.Fatalf("once the tenant's sessions expired: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
