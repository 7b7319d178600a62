// Package routertest has a fake router.Endpoint for the plugins' table-driven tests.
package routertest

// Endpoint is a fixed-value router.Endpoint.
type Endpoint struct {
	Name, Base string
	Max        int
	Down       bool
	Queue      int
}

func (e Endpoint) ID() string        { return e.Name }
func (e Endpoint) BaseModel() string { return e.Base }
func (e Endpoint) MaxLoras() int     { return e.Max }
func (e Endpoint) Healthy() bool     { return !e.Down }
func (e Endpoint) QueueDepth() int   { return e.Queue }
