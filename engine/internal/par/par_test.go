package par

import (
	"runtime"
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
