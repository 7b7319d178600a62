// Package discovery finds the workers a gateway sends work to, behind one interface, in the
// style of llm-d's EndpointDiscovery: a source is started with a Notifier and tells it, in
// order, which worker endpoints appeared, changed (ready or draining) and went away. The same
// gateway therefore runs with workers that register themselves (the default, no source at all),
// a fixed list (discovery/static), a headless Service's DNS records (discovery/dns), or the
// EndpointSlices of a Kubernetes Service (discovery/kubernetes).
//
// A source only says who is a member. Whether a member is alive is the gateway's own
// one-second check of each worker, which stays the fast failure path: a source's view can lag
// by seconds (DNS TTLs, informer resyncs), a dead worker's calls fail at once.
package discovery

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"sort"
	"strconv"
	"strings"
)

// Endpoint is one worker as a source sees it.
type Endpoint struct {
	// ID names the endpoint stably within its source (a pod name, host:port): an Upsert of a
	// known ID is a change of that endpoint, not a new one.
	ID string
	// URL is the worker's base URL (http://host:port), where the gateway calls it.
	URL string
	// Ready: the worker may take new work. A member that is not ready (failing its readiness
	// probe, or terminating) is drained: no new adapters go to it, and it is dropped once gone.
	Ready bool
}

// Notifier receives a source's changes, in the order they happened. Calls come from one
// goroutine of the source at a time.
type Notifier interface {
	// Upsert adds an endpoint or changes a known one (by ID).
	Upsert(Endpoint)
	// Delete removes an endpoint (by ID); unknown IDs are ignored.
	Delete(id string)
}

// Discovery is a source of worker endpoints.
type Discovery interface {
	// Start runs until ctx ends, notifying every change; it returns ctx's error then, or an
	// error that stops the source for good (bad configuration).
	Start(ctx context.Context, n Notifier) error
}

// MaxEndpoints bounds how many endpoints one source may report: each is a goroutine and a
// connection at the gateway, so a misconfigured selector or a hostile DNS answer cannot make
// the gateway follow millions.
const MaxEndpoints = 4096

// ErrTooMany is returned (wrapped) when a source reports more than MaxEndpoints endpoints.
var ErrTooMany = fmt.Errorf("discovery: more than %d worker endpoints", MaxEndpoints)

// Set is the last snapshot a polling source (static, dns) reported; Apply turns a new snapshot
// into the ordered upserts and deletes that lead from the old one to it.
type Set struct {
	known map[string]Endpoint
}

// Apply notifies n of the difference between the last snapshot and eps: deletes of endpoints
// gone first (sorted by ID), then upserts of those new or changed (sorted by ID), so that one
// snapshot's changes arrive in a reproducible order. A snapshot of more than MaxEndpoints is
// refused whole (nothing is notified).
func (s *Set) Apply(eps []Endpoint, n Notifier) error {
	if len(eps) > MaxEndpoints {
		return fmt.Errorf("%w (%d)", ErrTooMany, len(eps))
	}
	next := make(map[string]Endpoint, len(eps))
	for _, ep := range eps {
		next[ep.ID] = ep
	}
	var gone, changed []string
	for id := range s.known {
		if _, ok := next[id]; !ok {
			gone = append(gone, id)
		}
	}
	for id, ep := range next {
		if old, ok := s.known[id]; !ok || old != ep {
			changed = append(changed, id)
		}
	}
	sort.Strings(gone)
	sort.Strings(changed)
	for _, id := range gone {
		n.Delete(id)
	}
	for _, id := range changed {
		n.Upsert(next[id])
	}
	s.known = next
	return nil
}

// HostPortURL is the worker URL of host and port (IPv6 literals bracketed).
func HostPortURL(host string, port int) string {
	return "http://" + net.JoinHostPort(host, strconv.Itoa(port))
}

// ParseWorkerURL checks one worker address: host:port or an http(s):// URL with a host and a
// port, nothing else (no user, query or fragment). It returns the URL in the form the gateway
// calls and an ID (host:port).
func ParseWorkerURL(s string) (Endpoint, error) {
	raw := strings.TrimSpace(s)
	if raw == "" {
		return Endpoint{}, errors.New("discovery: empty worker address")
	}
	if !strings.Contains(raw, "://") {
		raw = "http://" + raw
	}
	u, err := url.Parse(raw)
	if err != nil {
		return Endpoint{}, fmt.Errorf("discovery: worker address %q: %v", s, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return Endpoint{}, fmt.Errorf("discovery: worker address %q: scheme must be http or https", s)
	}
	if u.User != nil || u.RawQuery != "" || u.Fragment != "" || (u.Path != "" && u.Path != "/") {
		return Endpoint{}, fmt.Errorf("discovery: worker address %q: only scheme://host:port", s)
	}
	host, port := u.Hostname(), u.Port()
	if host == "" || port == "" {
		return Endpoint{}, fmt.Errorf("discovery: worker address %q needs a host and a port", s)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 1 || p > 65535 {
		return Endpoint{}, fmt.Errorf("discovery: worker address %q: bad port", s)
	}
	hp := net.JoinHostPort(host, port)
	return Endpoint{ID: hp, URL: u.Scheme + "://" + hp, Ready: true}, nil
}
