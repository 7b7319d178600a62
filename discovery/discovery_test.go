package discovery_test

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/skein-ai/skein/discovery"
	"github.com/skein-ai/skein/discovery/discoverytest"
)

func TestSetApplyNotifiesTheDifferenceInOrder(t *testing.T) {
	a := discovery.Endpoint{ID: "a", URL: "http://10.0.0.1:1", Ready: true}
	b := discovery.Endpoint{ID: "b", URL: "http://10.0.0.2:1", Ready: true}
	c := discovery.Endpoint{ID: "c", URL: "http://10.0.0.3:1", Ready: true}
	bDraining := b
	bDraining.Ready = false
	steps := []struct {
		name string
		eps  []discovery.Endpoint
		want []string
	}{
		{"first snapshot: all upserted, sorted", []discovery.Endpoint{c, a}, []string{"+a", "+c"}},
		{"same again: nothing", []discovery.Endpoint{a, c}, nil},
		{"one gone, one new: delete first", []discovery.Endpoint{a, b}, []string{"-c", "+b"}},
		{"a change of readiness is an upsert", []discovery.Endpoint{a, bDraining}, []string{"+b(draining)"}},
		{"empty: everything deleted", nil, []string{"-a", "-b"}},
	}
	var set discovery.Set
	for _, st := range steps {
		var rec discoverytest.Recorder
		if err := set.Apply(st.eps, &rec); err != nil {
			t.Fatal(err)
		}
		if got := rec.Events(); !slices.Equal(got, st.want) {
			t.Errorf("%s: got %v, want %v", st.name, got, st.want)
		}
	}
}

func TestSetRefusesTooManyWhole(t *testing.T) {
	eps := make([]discovery.Endpoint, discovery.MaxEndpoints+1)
	for i := range eps {
		eps[i] = discovery.Endpoint{ID: fmt.Sprint(i), URL: "http://x:1"}
	}
	var set discovery.Set
	var rec discoverytest.Recorder
	if err := set.Apply(eps, &rec); !errors.Is(err, discovery.ErrTooMany) {
		t.Fatalf("err = %v, want ErrTooMany", err)
	}
	if len(rec.Events()) != 0 {
		t.Fatalf("a refused snapshot notified %d events", len(rec.Events()))
	}
}

func TestParseWorkerURL(t *testing.T) {
	cases := []struct {
		in, id, url string
		bad         bool
	}{
		{in: "10.0.0.1:8001", id: "10.0.0.1:8001", url: "http://10.0.0.1:8001"},
		{in: "http://w-0.svc:8001/", id: "w-0.svc:8001", url: "http://w-0.svc:8001"},
		{in: "https://[fd00::1]:443", id: "[fd00::1]:443", url: "https://[fd00::1]:443"},
		{in: "10.0.0.1", bad: true},              // no port
		{in: "ftp://10.0.0.1:21", bad: true},     // scheme
		{in: "http://u:p@10.0.0.1:1", bad: true}, // credentials
		{in: "http://10.0.0.1:1/x", bad: true},   // a path
		{in: "http://10.0.0.1:70000", bad: true}, // port range
		{in: "http://10.0.0.1:1?a=b", bad: true}, // query
		{in: " ", bad: true},
	}
	for _, c := range cases {
		ep, err := discovery.ParseWorkerURL(c.in)
		if c.bad {
			if err == nil {
				t.Errorf("%q: accepted as %+v", c.in, ep)
			}
			continue
		}
		if err != nil || ep.ID != c.id || ep.URL != c.url || !ep.Ready {
			t.Errorf("%q: got %+v, %v; want id %s url %s", c.in, ep, err, c.id, c.url)
		}
	}
}
