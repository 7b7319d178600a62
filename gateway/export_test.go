package gateway

import "github.com/skein-ai/skein/replica"

// AdapterOf is the replica's view of a run (what the router hands a replica), for tests that
// drive a replica behind the router's back.
func (s *Server) AdapterOf(runID string) replica.Adapter { return s.adapterOf(s.runs.get(runID)) }
