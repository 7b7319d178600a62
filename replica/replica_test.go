package replica

import (
	"context"
	"sync"
	"testing"
)

// Ops of one adapter run in seq_id order whatever order they arrive in; another adapter's ops
// are not held up by a gap in the first one's sequence.
func TestRunOrderedBuffersEarlyArrivals(t *testing.T) {
	r := New("r", "m", nil)
	defer r.Close()
	var mu sync.Mutex
	var got []int
	var wg sync.WaitGroup
	record := func(n int) func() {
		wg.Add(1)
		return func() { mu.Lock(); got = append(got, n); mu.Unlock(); wg.Done() }
	}
	for _, seq := range []int{3, 2, 5} {
		if err := r.RunOrdered("a", seq, record(seq)); err != nil {
			t.Fatal(err)
		}
	}
	if r.Waiting("a") != 3 {
		t.Fatalf("%d ops waiting, want 3", r.Waiting("a"))
	}
	if err := r.RunOrdered("b", 1, record(100)); err != nil { // another adapter runs at once
		t.Fatal(err)
	}
	if err := r.RunOrdered("a", 1, record(1)); err != nil {
		t.Fatal(err)
	}
	if err := r.RunOrdered("a", 4, record(4)); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	var a []int
	for _, n := range got {
		if n != 100 {
			a = append(a, n)
		}
	}
	for i, n := range a {
		if n != i+1 {
			t.Fatalf("adapter a ran in order %v", a)
		}
	}
	if err := r.RunOrdered("a", 2, func() {}); err == nil {
		t.Fatal("a seq_id that already ran was accepted again")
	}
}

func TestResumeContinuesFromFirstArrival(t *testing.T) {
	r := New("r", "m", nil)
	defer r.Close()
	r.Resume("a")
	ran := make(chan int, 2)
	_ = r.RunOrdered("a", 42, func() { ran <- 42 })
	_ = r.RunOrdered("a", 43, func() { ran <- 43 })
	if a, b := <-ran, <-ran; a != 42 || b != 43 {
		t.Fatalf("ran %d then %d", a, b)
	}
	done := false
	if err := r.Do(context.Background(), func() { done = true }); err != nil || !done {
		t.Fatal("Do did not run")
	}
}
