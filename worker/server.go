package worker

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/skein-ai/skein/engine"
)

// Server exposes a local engine to a gateway. Calls run one at a time: the gateway already sends
// a replica's work in order, one op at a time.
type Server struct {
	e        engine.Compute
	token    string
	mu       sync.Mutex
	inflight atomic.Int64
}

// Status is the worker's heartbeat payload (its id filled in by the caller).
func (s *Server) Status(maxLoras int) Heartbeat {
	var training []string
	for _, id := range s.e.AdapterIDs() {
		if strings.Contains(id, ":train:") { // sampler snapshots do not take LoRA slots
			training = append(training, id)
		}
	}
	return Heartbeat{Adapters: training, FreeSlots: maxLoras - len(training), QueueDepth: int(s.inflight.Load())}
}

// NewServer wraps an engine; token, if set, must come with every call.
func NewServer(e engine.Compute, token string) *Server { return &Server{e: e, token: token} }

// ServeHTTP handles POST /worker/v1/{method}.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	write := func(status int, v any) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(v)
	}
	if s.token != "" && r.Header.Get(TokenHeader) != s.token {
		write(http.StatusUnauthorized, callResponse{Error: "bad worker token"})
		return
	}
	const prefix = "/worker/v1/"
	if r.Method != http.MethodPost || len(r.URL.Path) <= len(prefix) || r.URL.Path[:len(prefix)] != prefix {
		write(http.StatusNotFound, callResponse{Error: "no such worker call"})
		return
	}
	var req callRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		write(http.StatusBadRequest, callResponse{Error: "malformed call: " + err.Error()})
		return
	}
	s.inflight.Add(1)
	s.mu.Lock()
	resp, err := s.call(r.URL.Path[len(prefix):], req)
	s.mu.Unlock()
	s.inflight.Add(-1)
	if err != nil {
		resp = encodeErr(err)
	}
	write(http.StatusOK, resp)
}

var errUnknownCall = errors.New("unknown worker call")

func (s *Server) call(method string, q callRequest) (callResponse, error) {
	var r callResponse
	var err error
	switch method {
	case "info":
		info := s.e.Info()
		r.Info = &info
	case "has_adapter":
		r.Bool = s.e.HasAdapter(q.ID)
	case "adapter_ids":
		r.IDs = s.e.AdapterIDs()
	case "create":
		if q.Lora == nil {
			return r, errors.New("create needs lora")
		}
		err = s.e.CreateLora(q.ID, *q.Lora)
	case "load":
		err = s.e.LoadAdapter(q.ID, q.Dir, q.WithOptimizer)
	case "save":
		err = s.e.SaveAdapter(q.ID, q.Dir, q.WithOptimizer)
	case "delete":
		r.Bool = s.e.DeleteAdapter(q.ID)
	case "adapter_info":
		var cfg engine.LoraConfig
		cfg, r.Step, err = s.e.AdapterInfo(q.ID)
		r.Lora = &cfg
	case "forward":
		r.Forward, err = s.e.Forward(q.ID, q.Data, q.Loss, q.LossConfig)
	case "forward_backward":
		r.Forward, err = s.e.ForwardBackward(q.ID, q.Data, q.Loss, q.LossConfig)
	case "optim_step":
		if q.Adam == nil {
			return r, errors.New("optim_step needs adam")
		}
		r.Metrics, err = s.e.OptimStep(q.ID, *q.Adam)
	case "sample":
		var res []*engine.SampleResult
		if res, err = s.e.SampleBatch(q.ID, q.Samples); err == nil {
			for _, x := range res {
				r.Samples = append(r.Samples, toWireSample(x))
			}
		}
	default:
		return r, errUnknownCall
	}
	return r, err
}
