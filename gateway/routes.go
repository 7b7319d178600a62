package gateway

// Every route the gateway serves, in one list; the handlers live in files named for their resource.

import (
	"fmt"
	"net/http"

	"github.com/skein-ai/skein/api"
)

const v1 = "/api/v1/"

func (s *Server) routes() {
	s.mux = http.NewServeMux()
	s.mux.HandleFunc("GET /metrics", s.auth.adminHTTP(s.serveMetrics))
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no such endpoint: %s %s", r.Method, r.URL.Path))
	})
	s.routeConsole() // GET / and /console/: gateway/console.go
	s.handle("POST "+v1+"client/config", false, s.clientConfig)
	s.handle("POST "+v1+"client/dynamic_config", false, func(http.ResponseWriter, *http.Request, string) (any, error) {
		return api.DynamicConfigResponse{RefreshIntervalSec: 300}, nil
	})
	s.handle("GET "+v1+"healthz", false, func(http.ResponseWriter, *http.Request, string) (any, error) {
		return api.StatusResponse{Status: "ok"}, nil
	})
	s.handle("GET "+v1+"get_server_capabilities", false, s.capabilities)
	s.handle("GET "+v1+"models/{rest...}", true, s.modelTokenizer) // gateway/tokenizer.go
	s.handle("POST "+v1+"create_session", true, s.createSession)
	s.handle("POST "+v1+"session_heartbeat", true, s.heartbeat)
	s.handle("POST "+v1+"telemetry", true, func(w http.ResponseWriter, r *http.Request, _ string) (any, error) {
		_, err := s.readBody(r)
		return api.StatusResponse{Status: "accepted"}, err
	})
	s.handle("POST "+v1+"create_model", true, s.createModel)
	// Requests acting on one run go to the gateway sequencing it (leases.go); the sequenced
	// ones among them are what a gateway taking a run over runs again.
	s.replayable = map[string]handlerFunc{
		v1 + "forward_backward":         s.forwardBackward,
		v1 + "forward":                  s.forwardBackward,
		v1 + "optim_step":               s.optimStep,
		v1 + "save_weights":             s.saveWeights,
		v1 + "save_weights_for_sampler": s.saveWeightsForSampler,
		v1 + "load_weights":             s.loadWeights,
	}
	s.handle("POST "+v1+"get_info", true, s.runScoped(s.getInfo))
	s.handle("POST "+v1+"unload_model", true, s.runScoped(s.unloadModel))
	for _, path := range []string{"forward_backward", "forward", "optim_step", "save_weights", "save_weights_for_sampler", "load_weights"} {
		s.handle("POST "+v1+path, true, s.runScoped(s.replayable[v1+path]))
	}
	s.handle("POST "+v1+"weights_info", true, s.weightsInfo)
	s.handle("POST "+v1+"create_sampling_session", true, s.createSamplingSession)
	s.handle("POST "+v1+"asample", true, s.asample)
	s.handle("GET "+v1+"samplers/{id}", true, s.getSampler)
	s.handle("POST "+v1+"retrieve_future", true, s.retrieveFuture)
	s.handle("GET "+v1+"training_runs", true, s.listRuns)
	s.handle("GET "+v1+"training_runs/{id}", true, s.runReadScoped(s.getRun))
	s.handle("GET "+v1+"training_runs/{id}/checkpoints", true, s.listRunCheckpoints)
	s.handle("GET "+v1+"training_runs/{id}/metrics", true, s.runReadScoped(s.getRunMetrics)) // gateway/metrics_api.go
	s.handle("DELETE "+v1+"training_runs/{id}/checkpoints/{kind}/{name}", true, s.checkpointScoped(s.deleteCheckpoint))
	s.handle("GET "+v1+"training_runs/{id}/checkpoints/{kind}/{name}/archive", true, s.archiveCheckpoint)
	s.handle("GET "+v1+"archives/{token}", false, s.downloadArchive)
	s.handle("POST "+v1+"training_runs/{id}/checkpoints/{kind}/{name}/publish", true, s.checkpointScoped(s.publish(true)))
	s.handle("DELETE "+v1+"training_runs/{id}/checkpoints/{kind}/{name}/publish", true, s.checkpointScoped(s.publish(false)))
	s.handle("PUT "+v1+"training_runs/{id}/checkpoints/{kind}/{name}/ttl", true, s.checkpointScoped(s.setTTL))
	s.handle("GET "+v1+"checkpoints", true, s.listAllCheckpoints)
	s.handle("GET "+v1+"sessions", true, s.listSessions)
	s.handle("GET "+v1+"sessions/{id}", true, s.getSession)
	s.handle("PUT "+v1+"sessions/{id}/project", true, s.assignSessionProject)
	s.handle("GET "+v1+"sessions/{id}/trace_export", true, s.exportSessionTrace)
	s.handle("GET "+v1+"traces/{token}", false, s.downloadTrace)
	s.handle("GET "+v1+"audit", true, s.trail.getAuditLog)
	s.handle("GET "+v1+"billing/usage/events", true, s.getBillingUsage)
	s.handle("GET "+v1+"skein/replicas", true, s.auth.adminOnly(s.listReplicas))
	s.handle("GET "+v1+"skein/capacity", true, s.capacityFor)
	s.handle("POST "+v1+"skein/workers/hello", false, s.workerHello)
	s.handle("POST "+v1+"skein/workers/register", false, s.registerWorker)
	s.handle("POST "+v1+"skein/workers/heartbeat", false, s.workerHeartbeat)
	// Remote key management, for admin keys in keys mode.
	s.handle("POST "+v1+"skein/keys", true, s.auth.keysOnly(s.auth.createKey))
	s.handle("GET "+v1+"skein/keys", true, s.auth.keysOnly(s.auth.listKeys))
	s.handle("DELETE "+v1+"skein/keys/{id}", true, s.auth.keysOnly(s.auth.revokeKey))
	s.oai = &openAI{srv: s, mux: s.mux, auth: s.auth, metrics: &s.metrics, log: s.log,
		writeTimeout: s.opts.WriteTimeout, templateTimeout: s.opts.ChatTemplateTimeout}
	s.oai.routes()
}
