package gateway_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/skein-ai/skein/client"
	"github.com/skein-ai/skein/gateway"
	"github.com/skein-ai/skein/store"
)

// stallingStore holds every PutSession, once armed, until released: a PostgreSQL round trip that
// takes its time.
type stallingStore struct {
	store.Store
	mu      sync.Mutex
	armed   bool
	entered chan struct{} // one signal per held write
	release chan struct{}
}

func (s *stallingStore) PutSession(ctx context.Context, x store.Session) error {
	s.mu.Lock()
	armed := s.armed
	s.mu.Unlock()
	if armed {
		s.entered <- struct{}{}
		<-s.release
	}
	return s.Store.PutSession(ctx, x)
}

// A slow store write of one session does not stall requests that only read the gateway's
// memory: the write is made after the registry's lock is released.
func TestSlowStoreWriteHoldsNoLock(t *testing.T) {
	sq, err := store.OpenSQLite(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer sq.Close()
	st := &stallingStore{Store: sq, entered: make(chan struct{}, 1), release: make(chan struct{})}
	gw, err := gateway.New(gateway.Options{DataDir: t.TempDir(), Store: st})
	if err != nil {
		t.Fatal(err)
	}
	defer gw.Close()
	ts := httptest.NewServer(gw)
	defer ts.Close()
	call := func(method, path, body string) int {
		req, _ := http.NewRequest(method, ts.URL+"/api/v1/"+path, strings.NewReader(body))
		req.Header.Set("X-API-Key", "tml-slow-store")
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Error(err)
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := call("POST", "create_session", `{}`); code != http.StatusOK {
		t.Fatalf("create_session: %d", code)
	}
	st.mu.Lock()
	st.armed = true
	st.mu.Unlock()
	// A second session's creation: its row write is held in the store.
	held := make(chan int, 1)
	go func() { held <- call("POST", "create_session", `{}`) }()
	<-st.entered
	reads := make(chan [2]int, 1)
	go func() { reads <- [2]int{call("GET", "sessions", ""), call("GET", "training_runs", "")} }()
	stalled := false
	select {
	case got := <-reads:
		if got != [2]int{http.StatusOK, http.StatusOK} {
			t.Errorf("listings while a write was held: %v", got)
		}
	case <-time.After(30 * time.Second):
		t.Error("listing sessions waited for another session's store write: a lock is held across it")
		stalled = true
	}
	st.mu.Lock()
	st.armed = false
	st.mu.Unlock()
	close(st.release)
	if code := <-held; code != http.StatusOK {
		t.Fatalf("the held create_session: %d", code)
	}
	if stalled {
		<-reads // the listings end once the write does, on a server that held the lock
	}
}

// countingStore counts the session rows written in full.
type countingStore struct {
	store.Store
	puts atomic.Int64
}

func (s *countingStore) PutSession(ctx context.Context, x store.Session) error {
	s.puts.Add(1)
	return s.Store.PutSession(ctx, x)
}

// A heartbeat stores only the heartbeat time: the session's row (tags, metadata, runs) is not
// encoded and written again, however often a client heartbeats. The time is stored all the same.
func TestHeartbeatsWriteOnlyTheHeartbeat(t *testing.T) {
	sq, err := store.OpenSQLite(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer sq.Close()
	st := &countingStore{Store: sq}
	gw, err := gateway.New(gateway.Options{DataDir: t.TempDir(), Store: st})
	if err != nil {
		t.Fatal(err)
	}
	defer gw.Close()
	ts := httptest.NewServer(gw)
	defer ts.Close()
	ctx := context.Background()
	c := client.New(ts.URL, "tml-beat")
	sess, err := c.CreateSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	before := st.puts.Load()
	rows, _ := sq.Sessions(ctx)
	if len(rows) != 1 {
		t.Fatalf("%d session rows", len(rows))
	}
	created := rows[0].Heartbeat
	time.Sleep(5 * time.Millisecond) // the store keeps milliseconds
	for range 20 {
		if err := c.Do(ctx, "POST", "session_heartbeat", map[string]any{"session_id": sess}, nil); err != nil {
			t.Fatal(err)
		}
	}
	if n := st.puts.Load() - before; n != 0 {
		t.Fatalf("20 heartbeats wrote the whole session row %d times", n)
	}
	rows, _ = sq.Sessions(ctx)
	if len(rows) != 1 || !rows[0].Heartbeat.After(created) || string(rows[0].Data) == "" {
		t.Fatalf("after the heartbeats the row is %+v (created with heartbeat %v)", rows, created)
	}
}
