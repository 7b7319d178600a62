// Package dns is a discovery source that polls a headless Service's DNS records (--discover dns
// --discover-dns NAME:PORT): every address the name resolves to is a ready worker at that port.
// Kubernetes publishes only ready pods in a headless Service's A/AAAA records (unless
// publishNotReadyAddresses is set), so a pod failing readiness leaves the answer and is dropped.
// Without a cluster any name with several A records works the same way.
package dns

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sort"
	"strconv"
	"time"

	"github.com/skein-ai/skein/discovery"
)

// Resolver is the part of *net.Resolver the source uses (a fake in tests).
type Resolver interface {
	LookupIPAddr(ctx context.Context, host string) ([]net.IPAddr, error)
}

// Source polls one name.
type Source struct {
	host     string
	port     int
	every    time.Duration
	resolver Resolver
	// OnError is told of lookups that failed (the last good answer stays in force); nil: ignored.
	OnError func(error)
}

var _ discovery.Discovery = (*Source)(nil)

// Bounds of the poll interval: faster would load the cluster DNS for nothing (membership is not
// the failure path), slower would leave a scaled-up pool unused for long.
const (
	MinInterval = 100 * time.Millisecond
	MaxInterval = 10 * time.Minute
)

// New makes a source for "host:port" polled every interval, through r (nil: net.DefaultResolver).
func New(hostPort string, every time.Duration, r Resolver) (*Source, error) {
	host, portStr, err := net.SplitHostPort(hostPort)
	if err != nil || host == "" {
		return nil, fmt.Errorf("dns discovery: %q must be host:port (the headless Service's name and the workers' port)", hostPort)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 1 || port > 65535 {
		return nil, fmt.Errorf("dns discovery: %q: bad port", hostPort)
	}
	if every < MinInterval || every > MaxInterval {
		return nil, fmt.Errorf("dns discovery: poll interval %s outside [%s, %s]", every, MinInterval, MaxInterval)
	}
	if r == nil {
		r = net.DefaultResolver
	}
	return &Source{host: host, port: port, every: every, resolver: r}, nil
}

// Start resolves at once, then every interval, until ctx ends. A failed lookup keeps the last
// answer (a DNS hiccup must not drain the whole pool); a name that does not exist (NXDOMAIN: the
// Service is gone or has no ready pod) empties it.
func (s *Source) Start(ctx context.Context, n discovery.Notifier) error {
	var set discovery.Set
	t := time.NewTicker(s.every)
	defer t.Stop()
	for {
		eps, err := s.lookup(ctx)
		if err == nil {
			err = set.Apply(eps, n)
		}
		if err != nil && s.OnError != nil && ctx.Err() == nil {
			s.OnError(err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// lookup resolves the name into endpoints, one per distinct address, sorted.
func (s *Source) lookup(ctx context.Context) ([]discovery.Endpoint, error) {
	lctx, cancel := context.WithTimeout(ctx, max(s.every, time.Second))
	defer cancel()
	addrs, err := s.resolver.LookupIPAddr(lctx, s.host)
	if err != nil {
		var dnsErr *net.DNSError
		if errors.As(err, &dnsErr) && dnsErr.IsNotFound {
			return nil, nil
		}
		return nil, fmt.Errorf("dns discovery: looking up %s: %w", s.host, err)
	}
	if len(addrs) > discovery.MaxEndpoints {
		return nil, fmt.Errorf("dns discovery: %s: %w (%d)", s.host, discovery.ErrTooMany, len(addrs))
	}
	seen := map[string]bool{}
	var eps []discovery.Endpoint
	for _, a := range addrs {
		ip := a.IP.String()
		if a.IP == nil || seen[ip] {
			continue
		}
		seen[ip] = true
		u := discovery.HostPortURL(ip, s.port)
		eps = append(eps, discovery.Endpoint{ID: net.JoinHostPort(ip, strconv.Itoa(s.port)), URL: u, Ready: true})
	}
	sort.Slice(eps, func(i, j int) bool { return eps[i].ID < eps[j].ID })
	return eps, nil
}
