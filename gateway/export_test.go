package gateway

import "github.com/skein-ai/skein/replica"

// AdapterOf is the replica's view of a run (what the router hands a replica), for tests that
// drive a replica behind the router's back.
func (s *Server) AdapterOf(runID string) replica.Adapter { return s.adapterOf(s.runs.get(runID)) }

// Crash stops this gateway as a killed process would stop: its loops (lease renewal, sweeps)
// end, and nothing is handed over (its leases are left to lapse). Ops it still runs go on, as
// a zombie's would: the fences must stop their effects.
func (s *Server) Crash() { s.closeOnce.Do(func() { close(s.stop); close(s.handedOver) }) }
