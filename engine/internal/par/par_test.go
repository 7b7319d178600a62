package par

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Every index is visited once, in parts that cover [0, n) whatever GOMAXPROCS and n are.
func TestRowsVisitsEachIndexOnce(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	for _, procs := range []int{1, 2, 3, 8} {
		runtime.GOMAXPROCS(procs)
		for _, n := range []int{0, 1, 2, 5, 64, 1001} {
			seen := make([]atomic.Int32, n)
			Rows(n, func(lo, hi int) {
				for i := lo; i < hi; i++ {
					seen[i].Add(1)
				}
			})
			for i := range seen {
				if c := seen[i].Load(); c != 1 {
					t.Fatalf("GOMAXPROCS %d, n %d: index %d visited %d times", procs, n, i, c)
				}
			}
		}
	}
}

// A panic in any part (the caller's own, or another goroutine's) reaches the caller, and only
// after every part has ended: the parts write into what the caller owns.
func TestRowsRaisesAPanicAfterEveryPartEnds(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	runtime.GOMAXPROCS(4)
	for _, bad := range []int{0, 3} { // the caller's part, the last goroutine's
		var ended atomic.Int32
		func() {
			defer func() {
				if r := recover(); r != "boom" {
					t.Fatalf("part %d panicked: recovered %v, want boom", bad, r)
				}
				if got := ended.Load(); got != 3 {
					t.Fatalf("part %d panicked: the caller resumed with %d of the other 3 parts ended", bad, got)
				}
			}()
			Rows(4, func(lo, hi int) {
				if lo == bad {
					panic("boom")
				}
				time.Sleep(20 * time.Millisecond)
				ended.Add(1)
			})
		}()
	}
}

// Many callers at once, more parts than the queue holds, and parts that call Rows themselves:
// every call ends with each of its indices visited once (no deadlock, no part lost).
func TestRowsFromManyCallersAndNested(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	runtime.GOMAXPROCS(8)
	var wg sync.WaitGroup
	for range 300 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var inner atomic.Int32
			seen := make([]atomic.Int32, 16)
			Rows(16, func(lo, hi int) {
				for i := lo; i < hi; i++ {
					seen[i].Add(1)
				}
				time.Sleep(time.Millisecond)
				Rows(4, func(lo, hi int) { inner.Add(int32(hi - lo)) })
			})
			for i := range seen {
				if c := seen[i].Load(); c != 1 {
					t.Errorf("index %d visited %d times", i, c)
				}
			}
			if got := inner.Load(); got != 8*4 {
				t.Errorf("nested calls visited %d indices, want %d", got, 8*4)
			}
		}()
	}
	wg.Wait()
}
