// Package discoverytest records a discovery source's notifications, for the sources' tests.
package discoverytest

import (
	"sync"

	"github.com/skein-ai/skein/discovery"
)

// Recorder is a Notifier that keeps every event as "+id", "+id(draining)" or "-id", and the
// current membership.
type Recorder struct {
	mu      sync.Mutex
	events  []string
	members map[string]discovery.Endpoint
	changed chan struct{}
}

func (r *Recorder) Upsert(ep discovery.Endpoint) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ev := "+" + ep.ID
	if !ep.Ready {
		ev += "(draining)"
	}
	r.events = append(r.events, ev)
	if r.members == nil {
		r.members = map[string]discovery.Endpoint{}
	}
	r.members[ep.ID] = ep
	r.signal()
}

func (r *Recorder) Delete(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, "-"+id)
	delete(r.members, id)
	r.signal()
}

func (r *Recorder) signal() {
	if r.changed != nil {
		close(r.changed)
		r.changed = nil
	}
}

// Events returns the events so far and forgets them.
func (r *Recorder) Events() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	ev := r.events
	r.events = nil
	return ev
}

// Members returns the current membership.
func (r *Recorder) Members() map[string]discovery.Endpoint {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]discovery.Endpoint, len(r.members))
	for k, v := range r.members {
		out[k] = v
	}
	return out
}

// Changed returns a channel closed at the next event.
func (r *Recorder) Changed() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.changed == nil {
		r.changed = make(chan struct{})
	}
	return r.changed
}
