package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync/atomic"

	"github.com/skein-ai/skein/engine"
	"github.com/skein-ai/skein/replica"
	"github.com/skein-ai/skein/storage"
)

// Server exposes a local engine to a gateway. Calls run one at a time (the gateway already sends
// a replica's work in order, one op at a time), except that sampling calls arriving during a
// forward or forward_backward run between its layers (turns.go).
type Server struct {
	e       engine.Compute
	token   string
	dataDir string // load and save directories must lie inside it
	stored  bool   // s.e copies adapters from and to object storage (UseStorage)
	// gate lets one call at a time hold the engine, and forward and forward_backward serve the
	// sampling calls that arrive meanwhile between their layers (turns.go). The maps below are
	// read and written holding it (a turn runs on the holder's goroutine).
	gate     *turnGate
	inflight atomic.Int64
	draining atomic.Bool

	// What discovery's describe call answers (SetIdentity); a registering worker sends the same
	// in its Registration.
	baseModel string
	maxLoras  int
	// instance is this process's random id: its handshakes name it, so a gateway that finds one
	// worker at two addresses joins it once. sessions are the gateways' handshakes (auth.go).
	instance string
	sessions *Sessions
	// dirty: adapters that may hold gradients accumulated since their last optim_step, load or
	// create (holding the gate). A gateway that restarted adopts only clean adapters: gradients of a
	// forward_backward it never recorded must not ride along into a step.
	dirty map[string]bool
	// epochs: per adapter, the highest run-lease epoch a call carried (holding the gate; issue 38). A
	// call of a lower epoch comes from a gateway that lost the run (a zombie, or its call was
	// still in flight when it died) and is refused: it must not touch the adapter the run's
	// new gateway drives. Calls without an epoch (a single gateway, no leases) are not checked.
	epochs map[string]int64
}

// maxEpochs bounds the adapters whose epoch a worker remembers; past it, those not resident
// are forgotten (a call for one reloads or recreates it, and carries its epoch again).
const maxEpochs = 1 << 16

// ErrStaleEpoch is a call refused because a newer gateway of the run has called since.
var ErrStaleEpoch = errors.New("stale run epoch: another gateway sequences this run now")

// fenced lists the calls that change an adapter (and so are fenced by its epoch).
var fenced = map[string]bool{"create": true, "load": true, "save": true, "delete": true, "forward_backward": true, "optim_step": true}

// fence checks a call's epoch against its adapter's and records a higher one (the gate held).
func (s *Server) fence(method string, q callRequest) error {
	if q.Epoch <= 0 || q.ID == "" || !fenced[method] {
		return nil
	}
	if have := s.epochs[q.ID]; q.Epoch < have {
		return fmt.Errorf("%w: %s of %s carries epoch %d, and epoch %d has called", ErrStaleEpoch, method, q.ID, q.Epoch, have)
	}
	if _, ok := s.epochs[q.ID]; !ok && len(s.epochs) >= maxEpochs {
		resident := map[string]bool{}
		for _, id := range s.e.AdapterIDs(context.Background()) {
			resident[id] = true
		}
		for id := range s.epochs {
			if !resident[id] {
				delete(s.epochs, id)
			}
		}
	}
	s.epochs[q.ID] = q.Epoch
	return nil
}

// SetIdentity names the base model the worker serves and its LoRA slots, for the gateway's
// describe call (discovered workers do not register).
func (s *Server) SetIdentity(baseModel string, maxLoras int) {
	s.baseModel, s.maxLoras = baseModel, maxLoras
}

// Status is the worker's heartbeat payload (its id filled in by the caller).
func (s *Server) Status(maxLoras int) Heartbeat {
	// The engine knows which adapters train (and take a slot) and which are sampler snapshots.
	training := s.e.TrainingAdapterIDs(context.Background())
	hb := Heartbeat{Adapters: training, FreeSlots: maxLoras - len(training), QueueDepth: int(s.inflight.Load()), Draining: s.draining.Load()}
	if e, ok := s.e.(interface{ SamplerStats() engine.SamplerStats }); ok {
		st := e.SamplerStats()
		hb.Sampler = &st
	}
	return hb
}

// NewServer wraps an engine. Every call must be signed under a session whose handshake proved
// the token (with no token no call is served);
// the directories of load and save calls must lie inside dataDir (storage shared with the gateway).
func NewServer(e engine.Compute, token, dataDir string) *Server {
	return &Server{e: e, token: token, dataDir: dataDir, dirty: map[string]bool{}, epochs: map[string]int64{}, gate: newTurnGate(),
		instance: NewNonce()[:32], sessions: NewSessions(maxGatewaySessions)}
}

// maxGatewaySessions bounds the proven sessions a worker keeps (gateways, and their handshakes
// again after a restart); past it the least recently used is forgotten (its gateway shakes
// hands again).
const maxGatewaySessions = 64

// Instance is the worker's random instance id (sent in its registration).
func (s *Server) Instance() string { return s.instance }

// UseStorage makes the worker load and save adapters in st (object storage) rather than in its
// data directory: a call's key names the objects, copied through scratch, so the worker needs no
// directory shared with its gateway. Call before serving.
func (s *Server) UseStorage(st storage.Storage, scratch string) error {
	if storage.Local(st) != "" {
		return nil // a local directory: keys are paths in the data directory, as without it
	}
	c, err := replica.NewStored(s.e, st, s.dataDir, scratch)
	if err != nil {
		return err
	}
	s.e, s.stored = c, true
	return nil
}

// dirOf is the directory a load or save call names: its key under the data directory (checked:
// no key climbs out of it), or its path, which must lie inside the data directory.
func (s *Server) dirOf(q callRequest) (string, error) {
	if q.Key == "" {
		return inside(s.dataDir, q.Dir)
	}
	if err := storage.CheckKey(q.Key); err != nil {
		return "", fmt.Errorf("%w: %v", ErrOutsideDataDir, err)
	}
	dir := filepath.Join(s.dataDir, filepath.FromSlash(q.Key))
	if s.stored {
		return dir, nil // an object key: nothing on this disk to follow links in
	}
	return inside(s.dataDir, dir)
}

// maxCallBytes bounds one call's body: a gateway's request (64 MiB by default) re-encoded as JSON.
const maxCallBytes = 1 << 30

// ServeHTTP handles POST /worker/v1/{method}.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if s.serveProbe(w, r) {
		return
	}
	write := func(status int, v any) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(v)
	}
	if s.token == "" {
		write(http.StatusUnauthorized, callResponse{Error: "this worker has no cluster token"})
		return
	}
	const prefix = "/worker/v1/"
	if r.Method != http.MethodPost || len(r.URL.Path) <= len(prefix) || r.URL.Path[:len(prefix)] != prefix {
		write(http.StatusNotFound, callResponse{Error: "no such worker call"})
		return
	}
	if r.URL.Path == prefix+"hello" {
		var h Hello
		if err := json.NewDecoder(io.LimitReader(r.Body, maxHelloBytes)).Decode(&h); err != nil {
			write(http.StatusBadRequest, callResponse{Error: "malformed hello"})
			return
		}
		ans, err := answerWorkerHello(s.sessions, s.token, s.instance, h)
		if err != nil {
			write(http.StatusBadRequest, callResponse{Error: err.Error()})
			return
		}
		write(http.StatusOK, ans)
		return
	}
	// Authenticated before the body is read: a stranger's call costs its headers only.
	_, bodyHash, err := s.sessions.Check(r)
	if err != nil {
		write(http.StatusUnauthorized, callResponse{Error: err.Error()})
		return
	}
	body := NewVerifiedBody(http.MaxBytesReader(w, r.Body, maxCallBytes), bodyHash)
	req, err := decodeCall(body)
	if verr := body.Verify(); verr != nil {
		status := http.StatusBadRequest // too large, or cut
		if errors.Is(verr, ErrBadSession) {
			status = http.StatusUnauthorized
		}
		write(status, callResponse{Error: verr.Error()})
		return
	}
	if err != nil {
		write(http.StatusBadRequest, callResponse{Error: err.Error()})
		return
	}
	method := r.URL.Path[len(prefix):]
	// The status and describe calls answer at once, beside a call that computes for minutes:
	// they are the gateway's liveness check of a discovered worker.
	if method == "status" || method == "describe" {
		write(http.StatusOK, s.quickCall(method))
		return
	}
	s.inflight.Add(1)
	resp, err := s.safeCall(r.Context(), method, req)
	s.inflight.Add(-1)
	if err != nil {
		resp = encodeErr(err)
	}
	write(http.StatusOK, resp)
}

var errUnknownCall = errors.New("unknown worker call")

// decodeCall reads one call from the gateway.
func decodeCall(body io.Reader) (callRequest, error) {
	var q callRequest
	if err := json.NewDecoder(body).Decode(&q); err != nil {
		return callRequest{}, fmt.Errorf("malformed call: %w", err)
	}
	if len(q.ID) > maxIDLen {
		return callRequest{}, errors.New("malformed call: adapter id too long")
	}
	return q, nil
}

// safeCall runs one call at a time (a call that may take a turn runs inside the running call's
// next turn instead, when that call gives turns: turns.go) and turns a panic into that call's
// error. The request's ctx goes to the engine: a gateway that gives up on a call stops its pass.
func (s *Server) safeCall(ctx context.Context, method string, q callRequest) (r callResponse, err error) {
	if turnCalls[method] {
		inTurn := s.gate.acquire(false, func() bool {
			if !s.mayTakeTurn(ctx, method, q) {
				return false
			}
			r, err = s.protectedCall(ctx, method, q)
			return true
		})
		if inTurn {
			return r, err
		}
		defer s.gate.release()
		return s.protectedCall(ctx, method, q)
	}
	gives := givesTurns[method]
	s.gate.acquire(gives, nil)
	defer s.gate.release()
	if gives {
		ctx = engine.WithTurns(ctx, s.gate.give)
	}
	return s.protectedCall(ctx, method, q)
}

// protectedCall runs a call holding the engine (the gate, or a turn of its holder) and turns a
// panic into its error.
func (s *Server) protectedCall(ctx context.Context, method string, q callRequest) (r callResponse, err error) {
	defer func() {
		if v := recover(); v != nil {
			slog.Error("worker call panicked", "method", method, "panic", v, "stack", string(debug.Stack()))
			r, err = callResponse{}, fmt.Errorf("internal error in %s: %v", method, v)
		}
	}()
	return s.call(ctx, method, q)
}

// quickCall answers the calls that take no turn: status (the heartbeat's payload) and describe
// (what a registration says).
func (s *Server) quickCall(method string) callResponse {
	if method == "describe" {
		if s.baseModel == "" {
			return callResponse{Error: "this worker has no identity (SetIdentity)"}
		}
		return callResponse{Describe: &Description{BaseModel: s.baseModel, MaxLoras: s.maxLoras, Info: s.e.Info()}}
	}
	hb := s.Status(s.maxLoras)
	return callResponse{Status: &hb}
}

// track records what a call did to its adapter's accumulated gradients (the gate held).
func (s *Server) track(method, id string, err error) {
	switch method {
	case "forward_backward":
		s.dirty[id] = true // even when it failed: it may have accumulated part of its batch
	case "optim_step", "load", "create":
		if err == nil {
			delete(s.dirty, id)
		} else if method == "optim_step" {
			s.dirty[id] = true
		}
	case "delete":
		delete(s.dirty, id)
	}
}

func (s *Server) call(ctx context.Context, method string, q callRequest) (r callResponse, err error) {
	if err := s.fence(method, q); err != nil {
		return r, err // refused before it ran: nothing to track
	}
	defer func() { s.track(method, q.ID, err) }()
	switch method {
	case "adapter_states":
		for _, id := range s.e.TrainingAdapterIDs(ctx) {
			_, step, ierr := s.e.AdapterInfo(ctx, id)
			if ierr != nil {
				continue
			}
			r.States = append(r.States, AdapterState{ID: id, Step: step, Clean: !s.dirty[id]})
		}
	case "info":
		info := s.e.Info()
		r.Info = &info
	case "has_adapter":
		r.Bool = s.e.HasAdapter(ctx, q.ID)
	case "adapter_ids":
		r.IDs = s.e.AdapterIDs(ctx)
	case "training_adapter_ids":
		r.IDs = s.e.TrainingAdapterIDs(ctx)
	case "create":
		if q.Lora == nil {
			return r, errors.New("create needs lora")
		}
		err = s.e.CreateLora(ctx, q.ID, *q.Lora)
	case "load":
		var dir string
		if dir, err = s.dirOf(q); err == nil {
			err = s.e.LoadAdapter(ctx, q.ID, dir, q.WithOptimizer)
		}
	case "load_snapshot":
		var dir string
		if dir, err = s.dirOf(q); err == nil {
			err = s.e.LoadSnapshot(ctx, q.ID, dir)
		}
	case "save":
		var dir string
		if dir, err = s.dirOf(q); err == nil {
			err = s.e.SaveAdapter(ctx, q.ID, dir, q.WithOptimizer)
		}
	case "delete":
		r.Bool = s.e.DeleteAdapter(ctx, q.ID)
	case "adapter_info":
		var cfg engine.LoraConfig
		cfg, r.Step, err = s.e.AdapterInfo(ctx, q.ID)
		r.Lora = &cfg
	case "forward", "forward_backward":
		// An unprepared batch: the engine validates a peer's bytes itself, once.
		b := &engine.Batch{Data: q.Data, Loss: q.Loss, LossConfig: q.LossConfig}
		r.Forward, err = s.e.ForwardBatch(ctx, q.ID, b, method == "forward_backward")
	case "optim_step":
		if q.Adam == nil {
			return r, errors.New("optim_step needs adam")
		}
		r.Metrics, err = s.e.OptimStep(ctx, q.ID, *q.Adam)
	case "sample":
		var res []*engine.SampleResult
		if res, err = s.e.SampleBatch(ctx, q.ID, q.Samples); err == nil {
			for _, x := range res {
				r.Samples = append(r.Samples, toWireSample(x))
			}
		}
	default:
		return r, errUnknownCall
	}
	return r, err
}

// ErrOutsideDataDir: a load or save directory that does not resolve inside the worker's data directory.
var ErrOutsideDataDir = errors.New("directory outside the worker's data directory")

// inside resolves dir (absolute, or relative to the working directory, as the gateway wrote it)
// and checks that it lies inside root once symbolic links are followed: no "..", no absolute
// path elsewhere, no link out of root. The part of dir that does not exist yet (a save's new
// directory) is joined to its deepest existing ancestor after that ancestor's links are resolved.
func inside(root, dir string) (string, error) {
	if root == "" || dir == "" {
		return "", fmt.Errorf("%w: %q", ErrOutsideDataDir, dir)
	}
	for _, part := range strings.Split(filepath.ToSlash(dir), "/") {
		if part == ".." {
			return "", fmt.Errorf("%w: %q has a .. element", ErrOutsideDataDir, dir)
		}
	}
	realRoot, err := resolve(root)
	if err != nil {
		return "", fmt.Errorf("worker data directory: %w", err)
	}
	real, err := resolve(dir)
	if err != nil {
		return "", fmt.Errorf("%w: %q: %v", ErrOutsideDataDir, dir, err)
	}
	if rel, err := filepath.Rel(realRoot, real); err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) || filepath.IsAbs(rel) {
		return "", fmt.Errorf("%w: %q", ErrOutsideDataDir, dir)
	}
	return real, nil
}

// resolve makes p absolute with every symbolic link of its existing part followed.
func resolve(p string) (string, error) {
	abs, err := filepath.Abs(p)
	if err != nil {
		return "", err
	}
	var rest []string
	for cur := abs; ; {
		real, err := filepath.EvalSymlinks(cur)
		if err == nil {
			for i := len(rest) - 1; i >= 0; i-- {
				real = filepath.Join(real, rest[i])
			}
			return real, nil
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return "", err
		}
		if _, lerr := os.Lstat(cur); lerr == nil {
			return "", fmt.Errorf("%s is a dangling link", cur)
		}
		parent := filepath.Dir(cur)
		if parent == cur {
			return "", err
		}
		rest = append(rest, filepath.Base(cur))
		cur = parent
	}
}
