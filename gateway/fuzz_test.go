package gateway_test

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/skein-ai/skein/gateway"
)

var fuzzPaths = []string{"create_session", "session_heartbeat", "create_model", "get_info", "unload_model",
	"forward_backward", "forward", "optim_step", "save_weights", "save_weights_for_sampler", "load_weights",
	"weights_info", "create_sampling_session", "asample", "retrieve_future", "telemetry"}

// No body, of any shape, makes a handler panic or answer 5xx, and every error has a message.
func FuzzHandlersJSON(f *testing.F) {
	ts := newServer(f, gateway.Options{MaxBodyBytes: 1 << 16})
	f.Add(uint8(0), []byte(`{"tags":[],"user_metadata":{}}`))
	f.Add(uint8(2), []byte(`{"session_id":"x","model_seq_id":-1,"base_model":"tiny-qwen3","lora_config":{"rank":-3}}`))
	f.Add(uint8(5), []byte(`{"model_id":"a:train:0","forward_backward_input":{"data":[{"model_input":{"chunks":[{"tokens":[1e99]}]}}]}}`))
	f.Add(uint8(7), []byte(`{"adam_params":{"learning_rate":"x"}}`))
	f.Add(uint8(13), []byte(`{"prompt":{"chunks":[{"type":"encoded_text","tokens":[-1]}]},"base_model":"tiny-qwen3","num_samples":-2}`))
	f.Add(uint8(13), []byte(`{"prompt":{"chunks":[{"type":"encoded_text","tokens":[1]}]},"base_model":"tiny-qwen3","sampling_params":{"stop":{"a":1},"top_p":7}}`))
	f.Add(uint8(14), []byte(`{"request_id":null}`))
	f.Add(uint8(10), []byte(`{"model_id":"","path":"tinker://a/b/c/d"}`))
	f.Add(uint8(3), []byte(`[1,2,3]`))
	f.Add(uint8(6), []byte("\x00\x01\x02"))
	f.Fuzz(func(t *testing.T, which uint8, body []byte) {
		path := fuzzPaths[int(which)%len(fuzzPaths)]
		req := httptest.NewRequest("POST", "/api/v1/"+path, bytes.NewReader(body))
		req.Host = "localhost" // open mode answers loopback names only
		req.Header.Set("X-API-Key", "tml-fuzz")
		if path == "forward_backward" && len(body)%2 == 0 {
			req.Header.Set("Content-Type", "application/x-protobuf")
		}
		rec := httptest.NewRecorder()
		ts.gw.ServeHTTP(rec, req)
		if rec.Code >= 500 {
			t.Fatalf("%s %q: %d %s", path, body, rec.Code, rec.Body)
		}
		if rec.Code >= 400 && (rec.Body.Len() == 0 || !strings.Contains(rec.Body.String(), "detail")) {
			t.Fatalf("%s %q: %d without a message", path, body, rec.Code)
		}
		if rec.Code == http.StatusConflict {
			t.Fatalf("%s: 409 is retried by the SDK; never use it for a permanent error", path)
		}
	})
}
