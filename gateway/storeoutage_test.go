package gateway_test

import (
	"context"
	"errors"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/client"
	"github.com/skein-ai/skein/gateway"
	"github.com/skein-ai/skein/store"
)

// outageStore fails the next n result writes, as a store that is restarting does.
type outageStore struct {
	store.Store
	failing atomic.Int32
	refused atomic.Int32
	down    atomic.Bool // every read of a future fails
}

func (s *outageStore) GetFuture(ctx context.Context, id string) (store.Future, error) {
	if s.down.Load() {
		return store.Future{}, errStoreDown
	}
	return s.Store.GetFuture(ctx, id)
}

var errStoreDown = errors.New("connection refused (the store is restarting)")

func (s *outageStore) FinishFuture(ctx context.Context, id, state string, result []byte, category string) (bool, error) {
	if s.failing.Add(-1) >= 0 {
		s.refused.Add(1)
		return false, errStoreDown
	}
	return s.Store.FinishFuture(ctx, id, state, result, category)
}

// A result whose write fails while the store restarts is written when it is back, before the
// client sees it: the client's answer and the stored one agree, and nothing is left pending for a
// restarted gateway (or another one) to run again.
func TestAResultIsStoredThroughAStoreOutage(t *testing.T) {
	sq, err := store.OpenSQLite(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	st := &outageStore{Store: sq}
	ts := newServer(t, gateway.Options{Store: st})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, tc := newRun(t, ts.URL, "tml-outage", 4)
	st.failing.Store(2)
	f, err := tc.ForwardBackward(ctx, []api.Datum{datum(ts.eng.Tokenizer.Encode("through an outage"), true)}, "cross_entropy", nil, false)
	if err != nil {
		t.Fatal(err)
	}
	var out api.ForwardBackwardOutput
	if err := f.Result(ctx, &out); err != nil {
		t.Fatal(err)
	}
	if n := st.refused.Load(); n != 2 {
		t.Fatalf("%d result writes refused, want 2 (the test would see nothing)", n)
	}
	row, err := sq.GetFuture(ctx, f.RequestID)
	if err != nil || row.State != store.FutureComplete {
		t.Fatalf("the stored future after the outage: %+v %v, want complete", row.State, err)
	}
}

// A future this gateway does not hold in memory, asked for while the store does not answer, is
// a 503 to retry, not a 404: the client would give up on a request that may well exist.
func TestAFutureAskedForInAnOutageIsNotNotFound(t *testing.T) {
	sq, err := store.OpenSQLite(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	st := &outageStore{Store: sq}
	ts := newServer(t, gateway.Options{Store: st})
	c := client.New(ts.URL, "tml-outage")
	st.down.Store(true)
	err = c.Future("another-gateways-request-7").Result(context.Background(), &map[string]any{})
	if !isStatus(err, 503) {
		t.Fatalf("a future read in a store outage: %v, want 503", err)
	}
	st.down.Store(false)
	if err := c.Future("another-gateways-request-7").Result(context.Background(), &map[string]any{}); !isStatus(err, 404) {
		t.Fatalf("a future that is not in the store: %v, want 404", err)
	}
}
