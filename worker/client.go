package worker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/skein-ai/skein/engine"
	"github.com/skein-ai/skein/replica"
)

// Client is engine.Compute over HTTP to a worker.
type Client struct {
	URL   string
	Token string
	// Root, when set, is the gateway's data directory: the directories of load and save calls
	// (paths under it) are sent as storage keys relative to it, which the worker resolves in
	// its own storage (its data directory, or object storage), not as the gateway's paths.
	Root string
	// GatewayID names the gateway in its handshakes (bound into the worker's proof and the
	// session key); NewClient sets one per process.
	GatewayID string
	info      engine.ModelInfo
	http      *http.Client

	effects atomic.Int64 // calls that reached the worker and may have changed training state

	// The session with the worker (see auth.go): nil until a handshake succeeded; instance is
	// the worker's instance id, fixed by the first handshake (or ExpectInstance): a later
	// handshake answered by another instance (the worker restarted, or something else listens
	// there now) fails.
	hsMu     sync.Mutex // one handshake at a time
	mu       sync.Mutex
	sess     *signer
	instance string

	// dropped ends every call in flight and refuses new ones (Drop).
	dropped context.Context
	drop    context.CancelFunc
}

// effectful calls change an adapter's training state on the worker: one that reached the worker
// must not run again elsewhere.
var effectful = map[string]bool{"forward_backward": true, "optim_step": true}

// Effects counts the effectful calls (forward_backward, optim_step) that reached the worker,
// answered or not. The gateway compares it before and after an op to know whether an op that
// failed in transport may have run.
func (c *Client) Effects() int64 { return c.effects.Load() }

// ErrUnreachable: a call could not be delivered (the worker could not be dialled), so it did not
// run there; the op may safely go to another replica.
var ErrUnreachable = errors.New("worker unreachable")

// ErrLost: the call was sent but no answer came back (the worker died or the connection broke
// mid-call); it may have run.
var ErrLost = errors.New("worker lost during the call")

// NewClient talks to a worker whose model is described by info (from its registration).
// The token never leaves the process: calls are signed under a session the worker proved (see auth.go).
func NewClient(url, token string, info engine.ModelInfo) *Client {
	dropped, drop := context.WithCancel(context.Background())
	return &Client{URL: strings.TrimRight(url, "/"), Token: token, GatewayID: processGatewayID, info: info,
		http: &http.Client{Timeout: 30 * time.Minute}, dropped: dropped, drop: drop}
}

// processGatewayID names this process's gateway side in handshakes when the gateway sets none.
var processGatewayID = "gw-" + NewNonce()[:16]

// ExpectInstance makes the client accept only the worker instance id (from an authenticated
// registration): a handshake answered by another instance fails.
func (c *Client) ExpectInstance(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.instance = id
}

// Instance is the worker's instance id, once a handshake has succeeded (or as expected).
func (c *Client) Instance() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.instance
}

// Drop ends the client: its calls in flight end at once (an effectful one as lost, so it may
// have run: ErrLost) and later calls fail without being sent (ErrUnreachable). The gateway
// drops the client of a worker it declared dead, so that no op waits on a frozen worker.
func (c *Client) Drop() { c.drop() }

// Hello shakes hands with the worker unless a session is open: it fails unless the worker
// proves it holds the token (ErrUnproven, wrapped in ErrUnreachable).
func (c *Client) Hello(ctx context.Context) error {
	_, err := c.session(ctx)
	return err
}

// session is the open session, or a new one from a handshake.
func (c *Client) session(ctx context.Context) (*signer, error) {
	c.mu.Lock()
	s := c.sess
	c.mu.Unlock()
	if s != nil {
		return s, nil
	}
	c.hsMu.Lock()
	defer c.hsMu.Unlock()
	c.mu.Lock()
	s = c.sess
	c.mu.Unlock()
	if s != nil {
		return s, nil
	}
	return c.handshake(ctx)
}

// forget closes a session the worker refused (it restarted, or evicted it), unless a newer one
// replaced it already.
func (c *Client) forget(s *signer) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sess == s {
		c.sess = nil
	}
}

// withDrop is ctx that also ends when the client is dropped.
func (c *Client) withDrop(ctx context.Context) (context.Context, func()) {
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(c.dropped, cancel)
	return ctx, func() { stop(); cancel() }
}

// handshake sends a hello (a fresh nonce and the gateway's id, nothing derived from the token)
// and checks the worker's proof; nothing else is sent to a worker before it.
func (c *Client) handshake(ctx context.Context) (*signer, error) {
	mine := Hello{Nonce: NewNonce(), ID: c.GatewayID}
	b, _ := json.Marshal(mine)
	rctx, done := c.withDrop(ctx)
	defer done()
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, c.URL+"/worker/v1/hello", bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%w: worker %s hello: %w", engine.ErrCancelled, c.URL, ctx.Err())
		}
		return nil, fmt.Errorf("%w: %s: %v", ErrUnreachable, c.URL, err)
	}
	defer resp.Body.Close()
	var r HelloReply
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%w: %s answered the handshake with status %d: %w", ErrUnreachable, c.URL, resp.StatusCode, ErrUnproven)
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxHelloBytes)).Decode(&r); err != nil || !r.valid() {
		return nil, fmt.Errorf("%w: %s: malformed handshake answer: %w", ErrUnreachable, c.URL, ErrUnproven)
	}
	s, err := checkProof(c.Token, labelWorkerProof, labelCallKey, r, mine.Nonce, r.Nonce, c.GatewayID, r.ID)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrUnreachable, c.URL, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.instance != "" && c.instance != r.ID {
		return nil, fmt.Errorf("%w: %s is now worker instance %s, not %s (it restarted, or another worker took the address)", ErrUnreachable, c.URL, r.ID, c.instance)
	}
	c.instance, c.sess = r.ID, s
	return s, nil
}

// answerLimit bounds the answer the gateway reads for a call of reqBytes: results grow with the
// call (per-token values, top-k rows), so a fixed floor plus a generous multiple of it.
func answerLimit(reqBytes int) int64 { return 64<<20 + 256*int64(reqBytes) }

// do sends one call. ctx bounds it: once ctx ends the request is aborted and the call returns
// an error wrapping engine.ErrCancelled and ctx.Err() (the worker is not lost; an effectful
// call still counts as one that may have run).
func (c *Client) do(ctx context.Context, method string, q callRequest) (callResponse, error) {
	q.Epoch = EpochOf(ctx, q.ID)
	b, err := json.Marshal(q)
	if err != nil {
		return callResponse{}, err
	}
	for attempt := 0; ; attempt++ {
		if c.dropped.Err() != nil {
			return callResponse{}, fmt.Errorf("%w: %s: the worker was dropped", ErrUnreachable, c.URL)
		}
		sess, err := c.session(ctx)
		if err != nil {
			return callResponse{}, err
		}
		r, refused, err := c.send(ctx, method, sess, b)
		if refused && attempt == 0 {
			// The worker refused the session before reading the call (it restarted, or forgot
			// the session): shake hands again and send it once more.
			c.forget(sess)
			continue
		}
		return r, err
	}
}

// send sends one signed call; refused reports that the worker refused its authentication (401:
// nothing ran).
func (c *Client) send(ctx context.Context, method string, sess *signer, b []byte) (r callResponse, refused bool, err error) {
	rctx, done := c.withDrop(ctx)
	defer done()
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, c.URL+"/worker/v1/"+method, bytes.NewReader(b))
	if err != nil {
		return r, false, err
	}
	req.Header.Set("Content-Type", "application/json")
	sess.sign(req.Header, req.Method, req.URL.Path, b)
	resp, err := c.roundTrip(ctx, method, req)
	if err != nil && ctx.Err() != nil {
		if effectful[method] {
			c.effects.Add(1)
		}
		return r, false, fmt.Errorf("%w: worker %s %s: %w", engine.ErrCancelled, c.URL, method, ctx.Err())
	}
	if err != nil && c.dropped.Err() != nil {
		if effectful[method] {
			c.effects.Add(1)
		}
		return r, false, fmt.Errorf("%w: %s %s: the worker was dropped during the call", ErrLost, c.URL, method)
	}
	if err != nil {
		var op *net.OpError
		if errors.As(err, &op) && op.Op == "dial" {
			return r, false, fmt.Errorf("%w: %s: %v", ErrUnreachable, c.URL, err)
		}
		if effectful[method] {
			c.effects.Add(1)
		}
		return r, false, fmt.Errorf("%w: %s %s: %v", ErrLost, c.URL, method, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusUnauthorized {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
		return r, true, fmt.Errorf("%w: %s refused the call's authentication", ErrUnreachable, c.URL)
	}
	if effectful[method] {
		c.effects.Add(1)
	}
	r, err = decodeAnswer(resp.Body, answerLimit(len(b)))
	if err != nil {
		if c.dropped.Err() != nil && ctx.Err() == nil {
			return r, false, fmt.Errorf("%w: %s %s: the worker was dropped during the call", ErrLost, c.URL, method)
		}
		return r, false, fmt.Errorf("worker %s (%d): %w", c.URL, resp.StatusCode, err)
	}
	if r.Error != "" {
		return r, false, decodeErr(r)
	}
	if resp.StatusCode != http.StatusOK {
		return r, false, badAnswer("status %d without an error", resp.StatusCode)
	}
	return r, false, nil
}

// roundTrip sends req and waits for its answer. While a call that gives turns is in flight, the
// replica's signal that a sampling batch waits (engine.TurnWanted) gives it its turn here, on the
// caller's goroutine (the replica's worker): the batch's own calls go to the worker beside this
// one, and the worker runs them between the layers of this call (turnGate). A call that may run
// in a turn itself waits plainly: turns do not nest.
func (c *Client) roundTrip(ctx context.Context, method string, req *http.Request) (*http.Response, error) {
	wanted := engine.TurnWanted(ctx)
	if wanted == nil || turnCalls[method] {
		return c.http.Do(req)
	}
	type answer struct {
		resp *http.Response
		err  error
	}
	got := make(chan answer, 1)
	go func() {
		resp, err := c.http.Do(req)
		got <- answer{resp, err}
	}()
	for {
		select {
		case a := <-got:
			return a.resp, a.err
		case <-wanted:
			engine.GiveTurn(ctx)
		}
	}
}

// decodeAnswer reads one answer of at most limit bytes.
func decodeAnswer(body io.Reader, limit int64) (callResponse, error) {
	var r callResponse
	lr := &io.LimitedReader{R: body, N: limit + 1}
	if err := json.NewDecoder(lr).Decode(&r); err != nil {
		if lr.N <= 0 {
			return callResponse{}, badAnswer("answer larger than %d bytes", limit)
		}
		return callResponse{}, fmt.Errorf("%w: %v", ErrBadAnswer, err)
	}
	if len(r.Error) > 1<<16 || len(r.Msg) > 1<<16 || len(r.Field) > maxIDLen {
		return callResponse{}, badAnswer("error message too long")
	}
	return r, nil
}

func (c *Client) Info() engine.ModelInfo { return c.info }

func (c *Client) HasAdapter(ctx context.Context, id string) bool {
	r, err := c.do(ctx, "has_adapter", callRequest{ID: id})
	return err == nil && r.Bool
}

func (c *Client) AdapterIDs(ctx context.Context) []string {
	r, err := c.do(ctx, "adapter_ids", callRequest{})
	if err != nil || checkIDs(r.IDs) != nil {
		return nil
	}
	return r.IDs
}

func (c *Client) CreateLora(ctx context.Context, id string, cfg engine.LoraConfig) error {
	_, err := c.do(ctx, "create", callRequest{ID: id, Lora: &cfg})
	return err
}

// LoadSnapshot loads saved weights on the worker as a read-only sampler snapshot.
func (c *Client) LoadSnapshot(ctx context.Context, id, dir string) error {
	q, err := c.dirCall(callRequest{ID: id}, dir)
	if err != nil {
		return err
	}
	_, err = c.do(ctx, "load_snapshot", q)
	return err
}

// dirCall fills a call's directory: its key under Root, or its path when Root is unset.
func (c *Client) dirCall(q callRequest, dir string) (callRequest, error) {
	if c.Root == "" {
		q.Dir = dir
		return q, nil
	}
	key, err := replica.KeyOf(c.Root, dir)
	if err != nil {
		return q, err
	}
	q.Key = key
	return q, nil
}

// TrainingAdapterIDs lists the worker's adapters that take a LoRA slot.
func (c *Client) TrainingAdapterIDs(ctx context.Context) []string {
	r, err := c.do(ctx, "training_adapter_ids", callRequest{})
	if err != nil || checkIDs(r.IDs) != nil {
		return nil
	}
	return r.IDs
}

func (c *Client) LoadAdapter(ctx context.Context, id, dir string, withOptimizer bool) error {
	q, err := c.dirCall(callRequest{ID: id, WithOptimizer: withOptimizer}, dir)
	if err != nil {
		return err
	}
	_, err = c.do(ctx, "load", q)
	return err
}

func (c *Client) SaveAdapter(ctx context.Context, id, dir string, withOptimizer bool) error {
	q, err := c.dirCall(callRequest{ID: id, WithOptimizer: withOptimizer}, dir)
	if err != nil {
		return err
	}
	_, err = c.do(ctx, "save", q)
	return err
}

func (c *Client) DeleteAdapter(ctx context.Context, id string) bool {
	r, err := c.do(ctx, "delete", callRequest{ID: id})
	return err == nil && r.Bool
}

func (c *Client) AdapterInfo(ctx context.Context, id string) (engine.LoraConfig, int, error) {
	r, err := c.do(ctx, "adapter_info", callRequest{ID: id})
	if err != nil {
		return engine.LoraConfig{}, 0, err
	}
	if err := checkLora(r.Lora, r.Step, c.info); err != nil {
		return engine.LoraConfig{}, 0, fmt.Errorf("worker %s: %w", c.URL, err)
	}
	return *r.Lora, r.Step, nil
}

func (c *Client) forward(ctx context.Context, method, id string, data []engine.Datum, loss string, cfg map[string]float64) (*engine.ForwardResult, error) {
	r, err := c.do(ctx, method, callRequest{ID: id, Data: data, Loss: loss, LossConfig: cfg})
	if err != nil {
		return nil, err
	}
	if err := checkForward(r.Forward, data); err != nil {
		return nil, fmt.Errorf("worker %s: %w", c.URL, err)
	}
	return r.Forward, nil
}

func (c *Client) Forward(ctx context.Context, id string, data []engine.Datum, loss string, cfg map[string]float64) (*engine.ForwardResult, error) {
	return c.forward(ctx, "forward", id, data, loss, cfg)
}

func (c *Client) ForwardBackward(ctx context.Context, id string, data []engine.Datum, loss string, cfg map[string]float64) (*engine.ForwardResult, error) {
	return c.forward(ctx, "forward_backward", id, data, loss, cfg)
}

// ForwardBatch sends a batch's data to the worker, which validates it again (the gateway is its
// peer, not its caller in process).
func (c *Client) ForwardBatch(ctx context.Context, id string, b *engine.Batch, backward bool) (*engine.ForwardResult, error) {
	method := "forward"
	if backward {
		method = "forward_backward"
	}
	return c.forward(ctx, method, id, b.Data, b.Loss, b.LossConfig)
}

func (c *Client) OptimStep(ctx context.Context, id string, p engine.AdamParams) (map[string]float64, error) {
	r, err := c.do(ctx, "optim_step", callRequest{ID: id, Adam: &p})
	if err != nil {
		return nil, err
	}
	if err := checkMetrics(r.Metrics); err != nil {
		return nil, fmt.Errorf("worker %s: %w", c.URL, err)
	}
	return r.Metrics, nil
}

func (c *Client) SampleBatch(ctx context.Context, id string, reqs []engine.SampleRequest) ([]*engine.SampleResult, error) {
	r, err := c.do(ctx, "sample", callRequest{ID: id, Samples: reqs})
	if err != nil {
		return nil, err
	}
	if err := checkSamples(r.Samples, reqs, c.info); err != nil {
		return nil, fmt.Errorf("worker %s: %w", c.URL, err)
	}
	out := make([]*engine.SampleResult, len(reqs))
	for i, w := range r.Samples {
		out[i] = fromWireSample(w)
	}
	return out, nil
}

var _ engine.Compute = (*Client)(nil)

// Describe asks a discovered worker what it serves; the answer is checked as a registration
// would be (id and URL from discovery).
func (c *Client) Describe(ctx context.Context, id string) (Registration, error) {
	r, err := c.do(ctx, "describe", callRequest{})
	if err != nil {
		return Registration{}, err
	}
	if r.Describe == nil {
		return Registration{}, badAnswer("describe without a description")
	}
	reg := Registration{ID: id, URL: c.URL, Instance: c.Instance(), BaseModel: r.Describe.BaseModel, MaxLoras: r.Describe.MaxLoras, Info: r.Describe.Info}
	if err := reg.Validate(); err != nil {
		return Registration{}, fmt.Errorf("worker %s: %w: %v", c.URL, ErrBadAnswer, err)
	}
	c.info = reg.Info
	return reg, nil
}

// Status is a discovered worker's heartbeat, fetched by the gateway (the liveness check).
func (c *Client) Status(ctx context.Context) (Heartbeat, error) {
	r, err := c.do(ctx, "status", callRequest{})
	if err != nil {
		return Heartbeat{}, err
	}
	if r.Status == nil {
		return Heartbeat{}, badAnswer("status without a status")
	}
	hb := *r.Status
	if err := hb.Validate(); err != nil {
		return Heartbeat{}, fmt.Errorf("worker %s: %w: %v", c.URL, ErrBadAnswer, err)
	}
	return hb, nil
}

// AdapterStates lists the training adapters the worker holds, with their steps and whether they
// hold unstepped gradients. It waits for the worker's call in flight, if any.
func (c *Client) AdapterStates(ctx context.Context) ([]AdapterState, error) {
	r, err := c.do(ctx, "adapter_states", callRequest{})
	if err != nil {
		return nil, err
	}
	if len(r.States) > maxAdapterIDs {
		return nil, badAnswer("%d adapters", len(r.States))
	}
	seen := make(map[string]bool, len(r.States))
	for _, st := range r.States {
		if st.ID == "" || len(st.ID) > maxIDLen || seen[st.ID] || st.Step < 0 || st.Step > maxStep {
			return nil, badAnswer("adapter state %.64q step %d", st.ID, st.Step)
		}
		seen[st.ID] = true
	}
	return r.States, nil
}

type epochKey struct{}

type adapterEpoch struct {
	id    string
	epoch int64
}

// WithEpoch makes the calls for adapter id made under ctx carry its run lease's epoch (issue
// 38): the worker refuses, for that adapter, a later call of a lower epoch (from a gateway that
// lost the run). Calls for other adapters under ctx (an eviction the op's placement makes)
// carry none.
func WithEpoch(ctx context.Context, id string, epoch int64) context.Context {
	return context.WithValue(ctx, epochKey{}, adapterEpoch{id, epoch})
}

// EpochOf is the epoch ctx carries for adapter id (0: none).
func EpochOf(ctx context.Context, id string) int64 {
	e, _ := ctx.Value(epochKey{}).(adapterEpoch)
	if e.id != id || id == "" {
		return 0
	}
	return e.epoch
}
