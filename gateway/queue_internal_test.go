package gateway

import (
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/skein-ai/skein/store"
)

// recorder hands out ops that record their labels, and returns the labels in the order they
// ran once n have.
type recorder struct {
	mu   sync.Mutex
	ran  []string
	done chan struct{}
	n    int
}

func newRecorder(n int) *recorder { return &recorder{done: make(chan struct{}), n: n} }

func (r *recorder) op(label string) func() {
	return func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.ran = append(r.ran, label)
		if len(r.ran) == r.n {
			close(r.done)
		}
	}
}

func (r *recorder) wait(t *testing.T) []string {
	t.Helper()
	<-r.done // the test hangs (and times out) if an op never runs
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.ran)
}

// A run's ops run in seq_id order whatever order they arrive in; ops without a seq_id run in
// arrival order; a queue created after a restart (next -1) starts at the first to arrive.
func TestRunQueueRunsInSeqOrder(t *testing.T) {
	cases := []struct {
		name    string
		next    int
		arrival []int // seq_ids, ≤ 0: none
		want    []int
	}{
		{"in order", 1, []int{1, 2, 3}, []int{1, 2, 3}},
		{"reversed", 1, []int{3, 2, 1}, []int{1, 2, 3}},
		{"shuffled", 1, []int{2, 4, 1, 3}, []int{1, 2, 3, 4}},
		{"from 5", 5, []int{6, 5, 7}, []int{5, 6, 7}},
		{"after a restart", -1, []int{9, 10}, []int{9, 10}},
		{"no seq_ids", 1, []int{0, 0, 0}, []int{0, 0, 0}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			q := newRunQueue(c.next)
			r := newRecorder(len(c.arrival))
			for i, seq := range c.arrival {
				if err := q.reserve(seq, 1); err != nil {
					t.Fatal(err)
				}
				label := fmt.Sprint(seq)
				if seq <= 0 {
					label = fmt.Sprintf("0#%d", i)
				}
				if err := q.submit(seq, 1, r.op(label)); err != nil {
					t.Fatal(err)
				}
			}
			var want []string
			for i, seq := range c.want {
				if seq <= 0 {
					want = append(want, fmt.Sprintf("0#%d", i))
				} else {
					want = append(want, fmt.Sprint(seq))
				}
			}
			if got := r.wait(t); !slices.Equal(got, want) {
				t.Fatalf("ran %v, want %v", got, want)
			}
		})
	}
}

// Early arrivals are buffered up to the queue's bounds (count and bytes); past them a request
// is refused with errQueueFull and reserves nothing. The next seq_id is always let in, since it
// is what frees the buffer.
func TestRunQueueBoundsWhatItBuffers(t *testing.T) {
	cases := []struct {
		name             string
		maxOps           int
		maxBytes         int64
		early            []int // buffered first (next is 1): all must fit
		refused          int   // then refused
		cost             int64
		nextFitsAnyway   bool
		wantOpsAfterFail int
	}{
		{"count", 2, 0, []int{2, 3}, 4, 1, true, 2},
		{"bytes", 0, 10, []int{2}, 3, 6, true, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			q := newRunQueue(1)
			q.maxOps, q.maxBytes = c.maxOps, c.maxBytes
			r := newRecorder(len(c.early) + 1)
			for _, seq := range c.early {
				if err := q.reserve(seq, c.cost); err != nil {
					t.Fatalf("seq %d: %v", seq, err)
				}
				if err := q.submit(seq, c.cost, r.op(fmt.Sprint(seq))); err != nil {
					t.Fatal(err)
				}
			}
			err := q.reserve(c.refused, c.cost)
			if !errors.Is(err, errQueueFull) {
				t.Fatalf("seq %d past the bound: err = %v, want errQueueFull", c.refused, err)
			}
			q.mu.Lock()
			ops := q.ops
			q.mu.Unlock()
			if ops != c.wantOpsAfterFail {
				t.Fatalf("a refused request reserved room: %d ops reserved, want %d", ops, c.wantOpsAfterFail)
			}
			if err := q.reserve(1, c.cost); err != nil {
				t.Fatalf("the next seq_id was refused: %v", err)
			}
			if err := q.submit(1, c.cost, r.op("1")); err != nil {
				t.Fatal(err)
			}
			want := []string{"1"}
			for _, seq := range c.early {
				want = append(want, fmt.Sprint(seq))
			}
			if got := r.wait(t); !slices.Equal(got, want) {
				t.Fatalf("ran %v, want %v", got, want)
			}
		})
	}
}

// A seq_id that already ran or is already queued is refused and gives its reservation back; a
// skipped seq_id (its request failed before queueing) lets the later ones run.
func TestRunQueueRefusesRepeatsAndSkips(t *testing.T) {
	q := newRunQueue(1)
	r := newRecorder(2)
	if err := q.reserve(3, 1); err != nil {
		t.Fatal(err)
	}
	if err := q.submit(3, 1, r.op("3")); err != nil {
		t.Fatal(err)
	}
	if err := q.reserve(3, 1); err != nil {
		t.Fatal(err)
	}
	if err := q.submit(3, 1, r.op("3 again")); err == nil {
		t.Fatal("a seq_id queued twice was accepted")
	}
	if err := q.reserve(1, 1); err != nil {
		t.Fatal(err)
	}
	if err := q.submit(1, 1, r.op("1")); err != nil {
		t.Fatal(err)
	}
	if err := q.reserve(2, 1); err != nil {
		t.Fatal(err)
	}
	q.skip(2, 1) // 2 failed validation: 3 must not wait for it
	if got := r.wait(t); !slices.Equal(got, []string{"1", "3"}) {
		t.Fatalf("ran %v, want [1 3]", got)
	}
	if err := q.reserve(1, 1); err != nil {
		t.Fatal(err)
	}
	if err := q.submit(1, 1, func() {}); err == nil {
		t.Fatal("a seq_id that already ran was accepted")
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.ops != 0 || q.bytes != 0 {
		t.Fatalf("%d ops and %d bytes still reserved after everything ran or was refused", q.ops, q.bytes)
	}
}

func newTestFutures(t *testing.T) *futureTable {
	t.Helper()
	st, err := store.OpenSQLite(filepath.Join(t.TempDir(), "futures.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return newFutureTable("gw", time.Hour, time.Hour, st, slog.Default())
}

// A future reaches one terminal state and keeps it: finishing wakes every waiter at once, a
// second finish changes nothing, and another tenant cannot see it.
func TestFutureTableWakesWaitersOnce(t *testing.T) {
	ft := newTestFutures(t)
	f, fresh, err := ft.create("tenant-a", "Sample", "")
	if err != nil || !fresh {
		t.Fatalf("create: %v, fresh %v", err, fresh)
	}
	const waiters = 3
	woke := make(chan bool, waiters)
	never := make(chan struct{})
	for range waiters {
		go func() { woke <- ft.wait(f, time.Hour, never) }()
	}
	for ft.waiters(f) < waiters { // every waiter parked before the finish
		time.Sleep(time.Millisecond)
	}
	ft.complete(f, map[string]int{"n": 1})
	for range waiters {
		if !<-woke {
			t.Fatal("a waiter woke without the future being done")
		}
	}
	ft.fail(f, "server", "too late")
	if f.errMsg != "" || f.result == nil {
		t.Fatalf("a second finish changed the state: err %q, result %v", f.errMsg, f.result)
	}
	if other, _ := ft.get("tenant-b", f.id); other != nil {
		t.Fatal("another tenant's future was visible")
	}
	if got, _ := ft.get("tenant-a", f.id); got != f {
		t.Fatal("the owner could not get its future")
	}
}

// A wait ends without the future when cancelled (the client left), and the same key returns the
// same future (a retried request).
func TestFutureTableCancelAndOpKey(t *testing.T) {
	ft := newTestFutures(t)
	f, _, err := ft.create("tenant-a", "ForwardBackward", "key-1")
	if err != nil {
		t.Fatal(err)
	}
	again, fresh, err := ft.create("tenant-a", "ForwardBackward", "key-1")
	if err != nil || fresh || again != f {
		t.Fatalf("same op key: %v, fresh %v, same future %v", err, fresh, again == f)
	}
	cancel := make(chan struct{})
	close(cancel)
	if ft.wait(f, time.Hour, cancel) {
		t.Fatal("a cancelled wait reported the pending future done")
	}
	if ft.waiters(f) != 0 {
		t.Fatal("a cancelled wait stayed parked")
	}
}

// A request that failed before it was queued gives its bytes back at once, not when its empty
// slot drains: the client's next request is not refused for bytes nothing holds (the drain may be
// busy with an earlier op, or just not scheduled yet, as under load in CI).
func TestRunQueueSkipGivesItsBytesBackAtOnce(t *testing.T) {
	q := newRunQueue(1)
	q.maxBytes = 10
	release, started := make(chan struct{}), make(chan struct{})
	ran := make(chan int, 3)
	if err := q.reserve(1, 1); err != nil {
		t.Fatal(err)
	}
	if err := q.submit(1, 1, func() { close(started); <-release; ran <- 1 }); err != nil {
		t.Fatal(err)
	}
	<-started // the drain is busy with op 1 until released
	// Alone in the queue: let in over the bound.
	if err := q.reserve(2, 100); err != nil {
		t.Fatal(err)
	}
	q.skip(2, 100) // its validation failed
	if err := q.reserve(3, 1); err != nil {
		t.Fatalf("the next request after a skipped one of 100 bytes: %v", err)
	}
	if err := q.submit(3, 1, func() { ran <- 3 }); err != nil {
		t.Fatal(err)
	}
	close(release)
	if a, b := <-ran, <-ran; a != 1 || b != 3 {
		t.Fatalf("ran %d then %d, want 1 then 3", a, b)
	}
	for {
		q.mu.Lock()
		ops, bytes, running := q.ops, q.bytes, q.running
		q.mu.Unlock()
		if !running {
			if ops != 0 || bytes != 0 {
				t.Fatalf("after every op ran: %d ops and %d bytes reserved, want none", ops, bytes)
			}
			return
		}
		time.Sleep(time.Millisecond)
	}
}
