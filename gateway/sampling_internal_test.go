package gateway

import (
	"context"
	"testing"
)

// A sampling batch's context ends only once every request in it has a client that has gone; a
// request polled through a future (no client context) keeps the batch running.
func TestBatchContextEndsWhenEveryClientHasGone(t *testing.T) {
	cases := []struct {
		name    string
		clients []bool // per request: has a client context (false: a future)
		gone    []int  // the clients that go
		ended   bool
	}{
		{"one client gone", []bool{true}, []int{0}, true},
		{"one client stays", []bool{true}, nil, false},
		{"all of two gone", []bool{true, true}, []int{0, 1}, true},
		{"one of two gone", []bool{true, true}, []int{1}, false},
		{"a future keeps it", []bool{true, false}, []int{0}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			batch := make([]pendingSample, len(c.clients))
			cancels := make([]context.CancelFunc, len(c.clients))
			for i, has := range c.clients {
				if has {
					batch[i].ctx, cancels[i] = context.WithCancel(context.Background())
					defer cancels[i]()
				}
			}
			ctx, stop := batchContext(batch)
			defer stop()
			for _, i := range c.gone {
				cancels[i]()
			}
			if c.ended {
				<-ctx.Done() // AfterFunc runs on its own goroutine: wait (the test hangs if it never ends)
				return
			}
			if ctx.Err() != nil {
				t.Fatal("the batch ended while a request still waits for it")
			}
		})
	}
}
