// Package gateway is skein's HTTP surface: the Tinker REST API (JSON and protobuf), tenants,
// sessions, futures with long-poll, and checkpoints. Compute goes to replicas.
package gateway

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"github.com/skein-ai/skein/discovery"

	"github.com/klauspost/compress/zstd"

	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/checkpoint"
	"github.com/skein-ai/skein/engine"
	"github.com/skein-ai/skein/replica"
	"github.com/skein-ai/skein/router"
	"github.com/skein-ai/skein/router/pipeline"
	"github.com/skein-ai/skein/storage"
	"github.com/skein-ai/skein/store"
	"github.com/skein-ai/skein/worker"
)

// Options configure a Server.
type Options struct {
	DataDir        string
	MaxBodyBytes   int64         // requests over this get 413 (default 64 MiB)
	LongPoll       time.Duration // how long retrieve_future holds a request (default 30 s)
	FutureTTL      time.Duration // how long results are kept (default 24 h)
	SessionTimeout time.Duration // sessions without heartbeat expire (default 5 min)
	Logger         *slog.Logger
	// Store holds durable state; nil opens SQLite at DataDir/state.db.
	Store store.Store
	// Storage holds adapter state (and, on the local backend, checkpoints and sampler weights);
	// nil is the data directory itself (storage.Dir at DataDir).
	Storage storage.Storage
	// QueueTimeout bounds how long an op waits for a LoRA slot (default 10 min).
	QueueTimeout time.Duration
	// Weights of the router's scorers (zero: defaults).
	Weights router.Weights
	// MaxQueuedSamples bounds the sampling requests waiting on one replica (default 4096); past
	// it asample answers 429.
	MaxQueuedSamples int
	// SamplerCopies bounds the read-only sampler weights each replica keeps in memory (default
	// replica.SamplerCopies); a sampling batch reads at most that many distinct copies.
	SamplerCopies int
	// Auth is AuthOpen (any key is a tenant; the default) or AuthKeys (issued keys only; fleet
	// endpoints need an admin key).
	Auth string
	// WorkerToken, if set, must come with worker registrations, heartbeats and calls.
	WorkerToken string
	// PublicURL is the base URL clients reach this server at (scheme and host, optionally a path
	// prefix), used in archive download links; empty: the loopback address a request came in on.
	PublicURL string
	// AcceptWorkers lets `skein worker` processes register (it needs WorkerToken).
	AcceptWorkers bool
	// WorkerTimeout: a worker silent for this long is removed (default 3 s).
	WorkerTimeout time.Duration
	// Discovery, if set, finds workers (discovery/static, dns, kubernetes) instead of, or beside,
	// their registrations: the gateway describes each one it is told of (with WorkerToken), checks
	// its status every second, and drains it while it is not ready.
	Discovery discovery.Discovery
	// MaxRunQueueOps and MaxRunQueueBytes bound what one training run may hold queued: requests
	// buffered ahead of the next seq_id or waiting their turn, and their request-body bytes
	// (defaults 1024 and 128 MiB; negative: unbounded). Past them a request gets 429.
	MaxRunQueueOps   int
	MaxRunQueueBytes int64
	// MaxTenantQueueBytes and MaxTotalQueueBytes bound the same bytes over all of one tenant's
	// runs and over the whole server (defaults 512 MiB and 2 GiB; negative: unbounded). Queued
	// bytes are the memory the decoded requests hold (heldBytes), not their bodies.
	MaxTenantQueueBytes int64
	MaxTotalQueueBytes  int64
	// MaxRequestDatums and MaxRequestTokens cap one request's size (defaults 1024 datums and
	// 512 Ki tokens); past them it gets a 400 naming the limit.
	MaxRequestDatums int
	MaxRequestTokens int
	// ImageDir is where image_asset_pointer chunks may name files (`--image-dir`); empty
	// refuses file pointers (data: URIs always work, URLs never).
	ImageDir string
	// MaxRequestPixelValues bounds the pixel_values elements of one request's images together
	// (default DefaultMaxRequestPixelValues); past it a request gets a 400.
	MaxRequestPixelValues int
	// MaxRequestImageBytes and MaxRequestImagePixels bound one request's images together: their
	// encoded bytes (a file by its size, before it is read; a file named twice counts once) and
	// their decoded pixels (from the headers, before any decode). Defaults
	// DefaultMaxRequestImageBytes and DefaultMaxRequestImagePixels; past them a 400.
	MaxRequestImageBytes  int
	MaxRequestImagePixels int
	// ImageDecoders is how many images the whole server decodes at once (default
	// DefaultImageDecoders: half the CPUs), so many handlers decoding cannot take every core.
	ImageDecoders int
	// ChatTemplateTimeout bounds how long a chat template's render is waited on (default
	// DefaultChatTemplateTimeout); past it the chat request gets a 400.
	ChatTemplateTimeout time.Duration
	// WriteTimeout bounds how long writing one answer may take, so a client that does not read
	// cannot hold a connection (default LongPoll + 1 min: a long-poll's answer included;
	// archive downloads get ArchiveWriteTimeout).
	WriteTimeout time.Duration
	// TenantCheckpointBytes is the checkpoint storage one tenant may hold (default
	// DefaultTenantCheckpointBytes; negative: unlimited); a save past it fails with a user error.
	TenantCheckpointBytes int64
	// SessionRetention is how long a closed (expired) session and its dead runs are kept before
	// the leftovers sweep forgets them (default DefaultSessionRetention).
	SessionRetention time.Duration
	// RemotePoll is how often a long-poll on another gateway's future re-reads the store as a
	// fallback for a lost notification (default 1 s).
	RemotePoll time.Duration
	// MaxSessionsPerTenant is how many live sessions one tenant may hold (default
	// DefaultMaxSessionsPerTenant); past it create_session gets a 429. Expired ones do not count.
	MaxSessionsPerTenant int
	// MaxAdaptersPerTenant is how many live adapters (training runs) one tenant may hold, all
	// replicas together (default DefaultMaxAdaptersPerTenant); not a replica's LoRA slots.
	MaxAdaptersPerTenant int
	// RunLeaseTTL is how long a run's lease lasts unrenewed when several gateways share the
	// store (default DefaultRunLeaseTTL; negative: no leases). A single gateway on SQLite has none.
	RunLeaseTTL time.Duration
	// AdvertiseURL is where the other gateways reach this one (its own address, not a load
	// balancer's), to forward requests for the runs it sequences (e.g. http://10.0.0.5:8000); a
	// gateway restarted at the same address takes its predecessor's leases at once. Empty: the
	// others answer 503 for its runs until their leases lapse.
	AdvertiseURL string
}

// Server serves the Tinker API over a set of base models.
type Server struct {
	opts     Options
	queued   *queueBudget // queued requests' bytes, per tenant and in total (runqueue.go)
	log      *slog.Logger
	archives archiveBuilds // archive builds on object storage (objects.go)
	exports  ggufSlots     // GGUF exports converting and downloading (gguf_export.go)
	modelsMu sync.RWMutex
	models   map[string][]*replica.Replica // base model name -> its replicas
	workers  map[string]*workerState       // registered worker processes, by replica id
	router   *router.Router
	metrics  metrics
	futures  *futureTable
	mux      *http.ServeMux
	st       store.Store
	ownsSt   bool
	storage  storage.Storage

	// One registry, with its own lock, per resource (see registry.go for the lock order).
	sessions *registry[session]
	runs     *registry[trainingRun]
	samplers *registry[sampler]
	ckpts    *registry[ckptMeta] // by tinker path
	stop     chan struct{}
	// handedOver closes after a stopping gateway handed its runs over: until then it keeps its
	// workers (discovery) and renews its leases, which its last ops and saves need.
	handedOver chan struct{}
	closeOnce  sync.Once

	secret []byte // signs download links (settleArchiveSecret)

	auth *keyring // authenticates callers, guards admin endpoints, serves the key endpoints (keys.go)
	oai  *openAI  // the OpenAI-compatible endpoints (openai.go)

	trail *auditTrail // the audit log (audit.go)

	// workersMu serializes changes of the worker fleet (register, drop, reap).
	workersMu sync.Mutex
	// gatewayID names this gateway in its handshakes with workers; workerSessions are the
	// handshakes of workers that register (worker/auth.go).
	gatewayID      string
	workerSessions *worker.Sessions
	visionCfgs     sync.Map // model directory or storage prefix -> imageproc.Config (preprocessor_config.json, read once)
	// remoteTokenizers: storage prefix -> *tokenizer.Tokenizer, a published tokenizer parsed once
	remoteTokenizers sync.Map
	// decodeSlots holds one token per image being decoded, server-wide (Options.ImageDecoders).
	decodeSlots chan struct{}

	// Run leases (leases.go): which runs this gateway sequences; requests for others go to
	// their holder through forwarder; replayable are the handlers of ops a takeover runs again.
	leases     *leaseTable
	forwarder  *http.Client
	replayable map[string]handlerFunc
}

type session struct {
	id, tenant string
	created    time.Time
	heartbeat  time.Time
	tags       []string
	metadata   api.UserMetadata
	runs       []string
	samplers   []string
	project    string // "" until assigned; its runs follow it
	ver        rowVersion
}

type trainingRun struct {
	id, tenant, session, baseModel string
	lora                           engine.LoraConfig
	step                           int // optimizer steps taken
	created, lastRequest           time.Time
	metadata                       map[string]string
	queue                          *runQueue // seq_id order of its ops
	ready                          bool      // live: created and not unloaded or expired
	lastCkpt, lastSamplerCkpt      string
	grads                          gradientLedger // forward_backwards since the last optim_step
	project                        string         // its session's project when it was last assigned
	pendingStep                    stepTally      // forward_backward metrics for the next step's record (metrics_api.go)
	ver                            rowVersion
}

type sampler struct {
	id, tenant, session, baseModel, modelPath string
	engineID                                  string // "" = base model
	dir                                       string // where its weights are on disk
	rep                                       *replica.Replica
}

type ckptMeta struct {
	Path      string            `json:"path"`
	Owner     string            `json:"owner"`
	BaseModel string            `json:"base_model"`
	Created   time.Time         `json:"created"`
	ExpiresAt *time.Time        `json:"expires_at,omitempty"`
	Public    bool              `json:"public"`
	Size      int64             `json:"size_bytes"`
	Lora      engine.LoraConfig `json:"lora"`
	// Generation is new at every write of the checkpoint (see versions.go).
	Generation string `json:"generation,omitempty"`
	parsed     checkpoint.Path
	ver        rowVersion
	// elsewhere: read from the store for one request (another gateway saved it), not kept in
	// this gateway's map.
	elsewhere bool
}

// New builds a server over replicas (several may serve one base model), restoring the state in
// the store.
func New(opts Options, replicas ...*replica.Replica) (*Server, error) {
	opts.fillDefaults()
	if err := checkOptions(&opts); err != nil {
		return nil, err
	}
	if opts.Storage == nil {
		d, err := storage.NewDir(opts.DataDir)
		if err != nil {
			return nil, fmt.Errorf("gateway: %w", err)
		}
		opts.Storage = d
	}
	st, owns, err := openStore(opts)
	if err != nil {
		return nil, err
	}
	s := &Server{opts: opts, log: opts.Logger, decodeSlots: make(chan struct{}, opts.ImageDecoders), models: map[string][]*replica.Replica{}, workers: map[string]*workerState{},
		gatewayID: "gw-" + randomHex(8), workerSessions: worker.NewSessions(maxWorkerSessions),
		st: st, ownsSt: owns, storage: opts.Storage,
		futures:  newFutureTable(randomHex(4), opts.FutureTTL, opts.RemotePoll, st, opts.Logger),
		sessions: newRegistry[session](), runs: newRegistry[trainingRun](), samplers: newRegistry[sampler](),
		ckpts: newRegistry[ckptMeta](), stop: make(chan struct{}), handedOver: make(chan struct{}),
		queued: newQueueBudget(opts.MaxTenantQueueBytes, opts.MaxTotalQueueBytes)}
	s.leases = newLeaseTable(s.shared() && opts.RunLeaseTTL > 0, opts.RunLeaseTTL, opts.AdvertiseURL)
	s.auth = &keyring{rows: st, mode: opts.Auth, log: opts.Logger, decode: s.decodeJSON}
	s.trail = &auditTrail{events: st, log: opts.Logger, scope: s.auth.scope}
	s.auth.audit = s.trail.record
	// Gateways forward to each other inside one cluster: a holder that does not take the
	// connection within 2 s is treated as unreachable (a partitioned host black-holes it).
	s.forwarder = &http.Client{Timeout: opts.LongPoll + time.Minute, Transport: &http.Transport{
		DialContext: (&net.Dialer{Timeout: 2 * time.Second}).DialContext, MaxIdleConnsPerHost: 16, IdleConnTimeout: time.Minute}}
	s.router = pipeline.New(opts.Weights, s.routerHooks())
	for _, r := range replicas {
		s.addReplica(r)
	}
	if s.secret, err = s.settleArchiveSecret(); err != nil {
		if owns {
			st.Close()
		}
		return nil, fmt.Errorf("gateway: %w", err)
	}
	if err := s.restore(); err != nil {
		if owns {
			st.Close()
		}
		return nil, fmt.Errorf("gateway: restoring state: %w", err)
	}
	s.routes()
	s.auth.warnWithoutAdminKey()
	go s.sweeper()
	if s.leases.on {
		go s.leaseLoop()
	}
	if opts.Discovery != nil {
		s.startDiscovery(opts.Discovery)
	}
	if l, ok := st.(store.FutureListener); ok {
		ctx, cancel := context.WithCancel(context.Background())
		go func() { <-s.stop; cancel() }()
		go l.ListenFutures(ctx, s.futures.remoteDone, s.futures.recheckRemote)
	}
	return s, nil
}

// fillDefaults gives every option left zero its default.
func (opts *Options) fillDefaults() {
	if opts.MaxBodyBytes == 0 {
		opts.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if opts.LongPoll == 0 {
		opts.LongPoll = DefaultLongPoll
	}
	if opts.WriteTimeout == 0 {
		opts.WriteTimeout = opts.LongPoll + time.Minute
	}
	if opts.FutureTTL == 0 {
		opts.FutureTTL = DefaultFutureTTL
	}
	if opts.SessionTimeout == 0 {
		opts.SessionTimeout = DefaultSessionTimeout
	}
	if opts.MaxSessionsPerTenant == 0 {
		opts.MaxSessionsPerTenant = DefaultMaxSessionsPerTenant
	}
	if opts.MaxAdaptersPerTenant == 0 {
		opts.MaxAdaptersPerTenant = DefaultMaxAdaptersPerTenant
	}
	if opts.QueueTimeout == 0 {
		opts.QueueTimeout = DefaultQueueTimeout
	}
	if opts.RunLeaseTTL == 0 {
		opts.RunLeaseTTL = DefaultRunLeaseTTL
	}
	if opts.MaxQueuedSamples == 0 {
		opts.MaxQueuedSamples = DefaultMaxQueuedSamples
	}
	if opts.MaxRunQueueOps == 0 {
		opts.MaxRunQueueOps = DefaultMaxRunQueueOps
	}
	if opts.MaxRunQueueBytes == 0 {
		opts.MaxRunQueueBytes = DefaultMaxRunQueueBytes
	}
	if opts.MaxTenantQueueBytes == 0 {
		opts.MaxTenantQueueBytes = DefaultMaxTenantQueueBytes
	}
	if opts.MaxTotalQueueBytes == 0 {
		opts.MaxTotalQueueBytes = DefaultMaxTotalQueueBytes
	}
	if opts.MaxRequestDatums == 0 {
		opts.MaxRequestDatums = DefaultMaxRequestDatums
	}
	if opts.MaxRequestTokens == 0 {
		opts.MaxRequestTokens = DefaultMaxRequestTokens
	}
	if opts.ChatTemplateTimeout <= 0 {
		opts.ChatTemplateTimeout = DefaultChatTemplateTimeout
	}
	if opts.ImageDecoders <= 0 {
		opts.ImageDecoders = DefaultImageDecoders()
	}
	if opts.TenantCheckpointBytes == 0 {
		opts.TenantCheckpointBytes = DefaultTenantCheckpointBytes
	}
	if opts.SessionRetention == 0 {
		opts.SessionRetention = DefaultSessionRetention
	}
	if opts.RemotePoll == 0 {
		opts.RemotePoll = time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler) // not a text handler into io.Discard: that formats every line
	}
}

// checkOptions refuses options that cannot work together (auth mode, public URL, workers) and
// fills what follows from them.
func checkOptions(opts *Options) error {
	if err := checkAuthMode(opts); err != nil {
		return err
	}
	if err := checkPublicURL(opts.PublicURL); err != nil {
		return fmt.Errorf("gateway: %w", err)
	}
	if err := checkWorkerOptions(opts); err != nil {
		return err
	}
	return nil
}

// openStore is the options' store, or SQLite in the data directory (then owned: the server
// closes it).
func openStore(opts Options) (store.Store, bool, error) {
	st, owns := opts.Store, false
	if st == nil {
		if err := os.MkdirAll(opts.DataDir, 0o755); err != nil {
			return nil, false, err
		}
		sq, err := store.OpenSQLite(filepath.Join(opts.DataDir, "state.db"))
		if err != nil {
			return nil, false, err
		}
		st, owns = sq, true
	}
	return st, owns, nil
}

// Close stops background work and closes a store the server opened itself.
func (s *Server) Close() {
	s.closeOnce.Do(func() {
		close(s.stop)
		if s.leases.on { // several gateways: what this one acknowledged ends here, not as orphans
			s.futures.drain(time.Now().Add(handoverWait))
		}
		s.releaseLeases()
		close(s.handedOver)
		if s.ownsSt {
			s.st.Close()
		}
	})
}

// sweeper heartbeats this gateway and, holding the sweep lease (one gateway at a time), expires
// futures, checkpoints and sessions and ends the requests of dead gateways.
func (s *Server) sweeper() {
	beat := time.NewTicker(gatewayHeartbeat)
	defer beat.Stop()
	reap := time.NewTicker(min(workerTimeout, s.opts.WorkerTimeout) / 3)
	defer reap.Stop()
	// Sweep often enough that a session expires within one sweep of its timeout.
	sweep := time.NewTicker(min(30*time.Second, max(s.opts.SessionTimeout/4, 10*time.Millisecond)))
	defer sweep.Stop()
	ctx := context.Background()
	s.sweepLeftovers(time.Now())
	leftovers := time.NewTicker(leftoversEvery(s.opts.SessionRetention))
	defer leftovers.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-beat.C:
			s.logErr("gateway heartbeat", s.st.GatewayHeartbeat(ctx, s.futures.prefix))
		case now := <-reap.C:
			s.reapWorkers(now)
		case now := <-leftovers.C:
			if ok, err := s.st.TryLease(ctx, "leftovers", s.futures.prefix, 2*time.Minute); err == nil && ok {
				s.sweepLeftovers(now)
			}
		case now := <-sweep.C:
			if ok, err := s.st.TryLease(ctx, "sweep", s.futures.prefix, 2*time.Minute); err != nil || !ok {
				s.logErr("sweep lease", err)
				// Session expiry stays local: each gateway holds its own sessions' adapters.
				s.futures.sweep(now, false)
				s.sweepSessions(now)
				continue
			}
			s.futures.sweep(now, true)
			s.sweepCheckpoints(now)
			s.trail.sweepEvents(now)
			s.trail.flushSuppressed("", now)
			s.sweepSessions(now)
			s.logErr("orphaned requests", s.failOrphans(ctx))
		}
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// serveRecovered serves a request with panic recovery: a panic is a bug, answered as a 500
// with a message, never a dropped connection.
func (s *Server) serveRecovered(w http.ResponseWriter, r *http.Request) {
	defer func() {
		if v := recover(); v != nil {
			s.log.Error("handler panic", "path", r.URL.Path, "request_id", RequestID(r.Context()), "panic", v, "stack", string(debug.Stack()))
			writeError(w, http.StatusInternalServerError, fmt.Sprintf("internal error: %v", v))
		}
	}()
	s.mux.ServeHTTP(w, r)
}

// --- HTTP helpers ---

type httpError struct {
	status int
	msg    string
}

func (e *httpError) Error() string { return e.msg }

func errf(status int, format string, args ...any) error {
	return &httpError{status: status, msg: fmt.Sprintf(format, args...)}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"detail":"encoding response failed"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// writeError sends a non-empty JSON error body; the SDK treats an empty 400 as a network glitch.
func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, api.ErrorResponse{Detail: msg, Message: msg})
}

// handler adapts a handler that returns (value, error) to http.HandlerFunc.
type handlerFunc func(w http.ResponseWriter, r *http.Request, tenant string) (any, error)

func (s *Server) handle(pattern string, authed bool, fn handlerFunc) {
	endpoint := pattern[strings.Index(pattern, " ")+1:]
	s.mux.HandleFunc(pattern, func(rw http.ResponseWriter, r *http.Request) {
		w := &statusRecorder{ResponseWriter: rw, status: http.StatusOK}
		s.writeWithin(w, s.opts.WriteTimeout)
		defer func() { s.metrics.request(endpoint, w.status) }()
		tenant := ""
		if authed {
			var c caller
			var err error
			if r, c, err = s.auth.withCaller(r); err != nil {
				noteResult(r, "", nil, err)
				writeAuthError(w, err)
				return
			}
			tenant = c.tenant
		}
		v, err := fn(w, r, tenant)
		noteResult(r, tenant, v, err)
		if err != nil {
			var he *httpError
			if errors.As(err, &he) {
				writeError(w, he.status, he.msg)
				return
			}
			writeError(w, http.StatusInternalServerError, err.Error())
			return
		}
		if v != nil {
			writeJSON(w, http.StatusOK, v)
		}
	})
}

// ArchiveWriteTimeout bounds the download of one checkpoint archive.
const ArchiveWriteTimeout = 30 * time.Minute

// writeWithin sets the deadline for writing the answer (not every ResponseWriter supports one:
// httptest's recorder does not, and needs none).
func (s *Server) writeWithin(w http.ResponseWriter, d time.Duration) {
	if err := http.NewResponseController(w).SetWriteDeadline(time.Now().Add(d)); err != nil && !errors.Is(err, http.ErrNotSupported) {
		s.log.Warn("setting the write deadline", "err", err)
	}
}

// tenantOf derives the tenant from the API key; only a hash of the key is ever kept.
func tenantOf(r *http.Request) (string, error) {
	key := apiKeyOf(r)
	if key == "" {
		return "", errors.New("missing API key: send X-API-Key (or Authorization: Bearer)")
	}
	sum := sha256.Sum256([]byte(key))
	return "t-" + hex.EncodeToString(sum[:8]), nil
}

// apiKeyOf is the key a request carries: X-API-Key (the tinker SDK), else a bearer token.
func apiKeyOf(r *http.Request) string {
	key := r.Header.Get("X-API-Key")
	if key == "" {
		if a := r.Header.Get("Authorization"); strings.HasPrefix(a, "Bearer ") {
			key = strings.TrimPrefix(a, "Bearer ")
		}
	}
	return strings.TrimSpace(key)
}

// readBody reads a request body within the size limit, undoing zstd if declared.
func (s *Server) readBody(r *http.Request) ([]byte, error) {
	return s.readBodyWithin(r, s.opts.MaxBodyBytes)
}

// readBodyWithin is readBody with a limit of its own (at most MaxBodyBytes).
func (s *Server) readBodyWithin(r *http.Request, limit int64) ([]byte, error) {
	limit = min(limit, s.opts.MaxBodyBytes)
	tooLarge := func() error {
		if r.ContentLength <= limit+MaxDiscardBytes { // past that the connection is closed anyway
			discardBody(r.Body)
		}
		return errf(http.StatusRequestEntityTooLarge, "request body over the %d-byte limit", limit)
	}
	if r.ContentLength > limit {
		return nil, tooLarge() // refused on its Content-Length: none of it is held
	}
	limited := http.MaxBytesReader(nil, r.Body, limit)
	b, err := io.ReadAll(limited)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, tooLarge()
		}
		return nil, errf(http.StatusBadRequest, "reading body: %v", err)
	}
	if strings.EqualFold(r.Header.Get("Content-Encoding"), "zstd") {
		dec, err := zstd.NewReader(bytes.NewReader(b), zstd.WithDecoderMaxMemory(uint64(limit)))
		if err != nil {
			return nil, errf(http.StatusBadRequest, "zstd: %v", err)
		}
		defer dec.Close()
		out, err := io.ReadAll(io.LimitReader(dec, limit+1))
		if err != nil {
			return nil, errf(http.StatusBadRequest, "zstd body: %v", err)
		}
		if int64(len(out)) > limit {
			return nil, errf(http.StatusRequestEntityTooLarge, "decompressed body over the %d-byte limit", limit)
		}
		b = out
	}
	return b, nil
}

// MaxDiscardBytes is how much of a body over its limit is read and thrown away before the 413 is
// sent. A server that answers and closes with the client's bytes still unread resets the
// connection, and a client that sends its whole body before reading (curl, most SDKs) then sees
// a reset instead of the 413, and retries blindly. Past this the connection is closed anyway.
// The reading is held to the server's minimum body rate like any other.
const MaxDiscardBytes = 64 << 20

// discardBody reads and drops what is left of a refused body, up to MaxDiscardBytes.
func discardBody(body io.Reader) {
	_, _ = io.CopyN(io.Discard, body, MaxDiscardBytes)
}

// decodeJSON reads a JSON body into v; wrong types are a 400 naming the field.
func (s *Server) decodeJSON(r *http.Request, v any) error {
	b, err := s.readBody(r)
	if err != nil {
		return err
	}
	return decodeJSONBytes(b, v)
}

// decodeJSONBytes decodes a JSON body (empty means {}); unknown fields are allowed, since clients
// add keys, but a known field of the wrong type is a 400 that names it.
func decodeJSONBytes(b []byte, v any) error {
	if len(bytes.TrimSpace(b)) == 0 {
		b = []byte("{}")
	}
	if err := json.Unmarshal(b, v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return errf(http.StatusBadRequest, "field %q: expected %s, got JSON %s", te.Field, te.Type, te.Value)
		}
		return errf(http.StatusBadRequest, "malformed JSON body: %v", err)
	}
	return nil
}

func fileSize(dir string) int64 {
	var n int64
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if info, err := e.Info(); err == nil {
			n += info.Size()
		}
	}
	return n
}
