package gateway

// What a client asks before it starts: its config, the server's capabilities, health.

import (
	"net/http"

	"github.com/skein-ai/skein/api"
)

func (s *Server) clientConfig(w http.ResponseWriter, r *http.Request, _ string) (any, error) {
	_, _ = s.readBody(r)
	return api.ClientConfigResponse{
		UsePyqwestTransport: false, PjwtAuthEnabled: false, CredentialDefaultSource: "api_key",
		ProtoCompressFwdbwd: false, ParallelFwdbwdChunks: true,
		// SDK 0.22.3–0.24: send forward_backward (and forward) as protobuf.
		ProtoWriteFwdbwd: true, FwdViaFwdbwd: true,
		SampleEnableStuckDetection: true,
	}, nil
}

func (s *Server) capabilities(http.ResponseWriter, *http.Request, string) (any, error) {
	var models []api.SupportedModel
	for _, name := range s.baseModels() {
		info, err := s.infoOf(name)
		if err != nil {
			continue
		}
		models = append(models, api.SupportedModel{ModelName: name, MaxContextLength: info.Config.MaxPositionEmbeddings,
			TakesImages: info.TakesImages()})
	}
	return api.ServerCapabilities{SupportedModels: models}, nil
}
