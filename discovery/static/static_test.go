package static_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/skein-ai/skein/discovery/discoverytest"
	"github.com/skein-ai/skein/discovery/static"
)

func TestNew(t *testing.T) {
	cases := []struct {
		list string
		want []string // IDs
		bad  bool
	}{
		{list: "10.0.0.2:8001,10.0.0.1:8001", want: []string{"10.0.0.2:8001", "10.0.0.1:8001"}},
		{list: " http://w0:1 , ,w1:2", want: []string{"w0:1", "w1:2"}},
		{list: "w0:1,http://w0:1", bad: true}, // the same worker twice
		{list: "", bad: true},
		{list: "w0", bad: true},
	}
	for _, c := range cases {
		s, err := static.New(c.list)
		if c.bad {
			if err == nil {
				t.Errorf("%q accepted", c.list)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%q: %v", c.list, err)
		}
		var ids []string
		for _, ep := range s.Endpoints() {
			ids = append(ids, ep.ID)
		}
		if !slices.Equal(ids, c.want) {
			t.Errorf("%q: ids %v, want %v", c.list, ids, c.want)
		}
	}
}

func TestStartUpsertsEveryWorkerReadyInOrder(t *testing.T) {
	s, err := static.New("w1:2,w0:1")
	if err != nil {
		t.Fatal(err)
	}
	var rec discoverytest.Recorder
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- s.Start(ctx, &rec) }()
	deadline := time.After(10 * time.Second)
	for {
		ch := rec.Changed() // taken before looking, so an event between the two is not missed
		if len(rec.Members()) >= 2 {
			break
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatal("not notified")
		}
	}
	cancel()
	<-done
	if got := rec.Events(); !slices.Equal(got, []string{"+w0:1", "+w1:2"}) {
		t.Fatalf("events %v", got)
	}
}
