// Package static is a discovery source of a fixed list of worker addresses (--discover static
// --workers host:port,...): every listed worker is a ready member for the gateway's whole life.
package static

import (
	"context"
	"fmt"
	"strings"

	"github.com/skein-ai/skein/discovery"
)

// Source reports a fixed set of endpoints once, then waits for ctx to end.
type Source struct {
	eps []discovery.Endpoint
}

var _ discovery.Discovery = (*Source)(nil)

// New parses a comma-separated list of worker addresses (host:port or http://host:port).
// Duplicates (the same host:port twice) are an error: they would be one worker counted twice.
func New(list string) (*Source, error) {
	var eps []discovery.Endpoint
	seen := map[string]bool{}
	for _, item := range strings.Split(list, ",") {
		if strings.TrimSpace(item) == "" {
			continue
		}
		ep, err := discovery.ParseWorkerURL(item)
		if err != nil {
			return nil, err
		}
		if seen[ep.ID] {
			return nil, fmt.Errorf("static discovery: %s is listed twice", ep.ID)
		}
		seen[ep.ID] = true
		eps = append(eps, ep)
		if len(eps) > discovery.MaxEndpoints {
			return nil, fmt.Errorf("static discovery: %w", discovery.ErrTooMany)
		}
	}
	if len(eps) == 0 {
		return nil, fmt.Errorf("static discovery needs at least one worker address (--workers host:port,...)")
	}
	return &Source{eps: eps}, nil
}

// Endpoints returns the parsed list.
func (s *Source) Endpoints() []discovery.Endpoint { return append([]discovery.Endpoint(nil), s.eps...) }

// Start notifies every endpoint (in ID order) and waits.
func (s *Source) Start(ctx context.Context, n discovery.Notifier) error {
	var set discovery.Set
	if err := set.Apply(s.eps, n); err != nil {
		return err
	}
	<-ctx.Done()
	return ctx.Err()
}
