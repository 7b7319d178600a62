package dns_test

import (
	"context"
	"errors"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/skein-ai/skein/discovery/discoverytest"
	"github.com/skein-ai/skein/discovery/dns"
)

// fakeResolver answers from a script, one answer per lookup (the last one repeats).
type fakeResolver struct {
	mu      sync.Mutex
	answers []answer
	asked   chan struct{}
}

type answer struct {
	ips []string
	err error
}

func (f *fakeResolver) LookupIPAddr(ctx context.Context, host string) ([]net.IPAddr, error) {
	f.mu.Lock()
	a := f.answers[0]
	if len(f.answers) > 1 {
		f.answers = f.answers[1:]
	}
	f.mu.Unlock()
	defer func() { f.asked <- struct{}{} }()
	if host != "skein-workers.ns.svc" {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	var out []net.IPAddr
	for _, s := range a.ips {
		out = append(out, net.IPAddr{IP: net.ParseIP(s)})
	}
	return out, a.err
}

func TestNewChecksItsArguments(t *testing.T) {
	cases := []struct {
		hostPort string
		every    time.Duration
		ok       bool
	}{
		{"skein-workers:8001", time.Second, true},
		{"skein-workers", time.Second, false},
		{":8001", time.Second, false},
		{"w:0", time.Second, false},
		{"w:x", time.Second, false},
		{"w:8001", time.Millisecond, false}, // would hammer the cluster DNS
		{"w:8001", time.Hour, false},
	}
	for _, c := range cases {
		_, err := dns.New(c.hostPort, c.every, nil)
		if (err == nil) != c.ok {
			t.Errorf("New(%q, %s): err %v, want ok=%v", c.hostPort, c.every, err, c.ok)
		}
	}
}

func TestPollsTurnAnswersIntoOrderedChanges(t *testing.T) {
	temporary := &net.DNSError{Err: "server misbehaving", IsTemporary: true}
	steps := []struct {
		name string
		ans  answer
		want []string
	}{
		{"first answer, duplicates folded", answer{ips: []string{"10.0.0.2", "10.0.0.1", "10.0.0.2"}}, []string{"+10.0.0.1:8001", "+10.0.0.2:8001"}},
		{"a scale-up adds one", answer{ips: []string{"10.0.0.1", "10.0.0.2", "10.0.0.3"}}, []string{"+10.0.0.3:8001"}},
		{"a failed lookup keeps the last answer", answer{err: temporary}, nil},
		{"a pod that left is deleted", answer{ips: []string{"10.0.0.1", "10.0.0.3", "fd00::7"}}, []string{"-10.0.0.2:8001", "+[fd00::7]:8001"}},
		{"nxdomain empties the pool", answer{err: &net.DNSError{Err: "no such host", IsNotFound: true}}, []string{"-10.0.0.1:8001", "-10.0.0.3:8001", "-[fd00::7]:8001"}},
	}
	f := &fakeResolver{asked: make(chan struct{})}
	for _, st := range steps {
		f.answers = append(f.answers, st.ans)
	}
	s, err := dns.New("skein-workers.ns.svc:8001", dns.MinInterval, f)
	if err != nil {
		t.Fatal(err)
	}
	var errMu sync.Mutex
	var errs []error
	s.OnError = func(err error) { errMu.Lock(); errs = append(errs, err); errMu.Unlock() }
	var rec discoverytest.Recorder
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() { _ = s.Start(ctx, &rec); close(done) }()
	for _, st := range steps {
		<-f.asked
		// The source notifies after the lookup returns; the next lookup waits for the tick, so
		// by the next answer this one's events are in. Wait for them here.
		deadline := time.Now().Add(5 * time.Second)
		var got []string
		for time.Now().Before(deadline) {
			got = append(got, rec.Events()...)
			if len(got) >= len(st.want) {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		if !slices.Equal(got, st.want) {
			t.Errorf("%s: events %v, want %v", st.name, got, st.want)
		}
	}
	cancel()
	go func() {
		for range f.asked {
		}
	}()
	<-done
	// Only the temporary failure is an error (NXDOMAIN is an empty pool, not a failure).
	errMu.Lock()
	defer errMu.Unlock()
	if len(errs) != 1 || !errors.Is(errs[0], temporary) {
		t.Errorf("OnError got %v, want the one temporary failure", errs)
	}
}
