package worker

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/skein-ai/skein/engine"
)

const trustToken = "cluster-token-that-must-never-travel"

// capturedRequest is one request a recorder received, as it came.
type capturedRequest struct {
	method, path string
	header       http.Header
	body         []byte
}

// recorder is an HTTP server that keeps every request it receives; next (if set) answers
// them, else answer does.
type recorder struct {
	mu     sync.Mutex
	reqs   []capturedRequest
	next   http.Handler
	answer func(w http.ResponseWriter, r *http.Request)
}

func (rc *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	rc.mu.Lock()
	rc.reqs = append(rc.reqs, capturedRequest{r.Method, r.URL.Path, r.Header.Clone(), b})
	rc.mu.Unlock()
	r.Body = io.NopCloser(bytes.NewReader(b))
	if rc.next != nil {
		rc.next.ServeHTTP(w, r)
		return
	}
	rc.answer(w, r)
}

func (rc *recorder) captured() []capturedRequest {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]capturedRequest(nil), rc.reqs...)
}

// carriesToken reports whether the token appears anywhere in a request (headers or body).
func (c capturedRequest) carriesToken(token string) bool {
	for k, vs := range c.header {
		if strings.Contains(k, token) {
			return true
		}
		for _, v := range vs {
			if strings.Contains(v, token) {
				return true
			}
		}
	}
	return bytes.Contains(c.body, []byte(token)) || strings.Contains(c.path, token)
}

// replay sends a captured request again, as it was, to url.
func (c capturedRequest) replay(t *testing.T, url string) int {
	t.Helper()
	req, err := http.NewRequest(c.method, url+c.path, bytes.NewReader(c.body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header = c.header.Clone()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// countingEngine counts the calls that change training state.
type countingEngine struct {
	fakeEngine
	n atomic.Int64
}

func (c *countingEngine) CreateLora(ctx context.Context, id string, cfg engine.LoraConfig) error {
	c.n.Add(1)
	return nil
}
func (c *countingEngine) ForwardBatch(ctx context.Context, id string, b *engine.Batch, bw bool) (*engine.ForwardResult, error) {
	c.n.Add(1)
	return c.fakeEngine.ForwardBatch(ctx, id, b, bw)
}
func (c *countingEngine) OptimStep(ctx context.Context, id string, p engine.AdamParams) (map[string]float64, error) {
	c.n.Add(1)
	return c.fakeEngine.OptimStep(ctx, id, p)
}
func (c *countingEngine) DeleteAdapter(context.Context, string) bool { c.n.Add(1); return true }

// everyCall makes each kind of call a gateway makes to a worker; errors are the caller's to judge.
func everyCall(c *Client) []error {
	ctx := context.Background()
	data := []engine.Datum{{Tokens: []int{1, 2}}}
	var errs []error
	_, err := c.Describe(ctx, "w")
	errs = append(errs, err)
	_, err = c.Status(ctx)
	errs = append(errs, err)
	_, err = c.AdapterStates(ctx)
	errs = append(errs, err)
	errs = append(errs, c.CreateLora(ctx, "a", engine.LoraConfig{Rank: 2}))
	_, err = c.ForwardBackward(ctx, "a", data, "cross_entropy", nil)
	errs = append(errs, err)
	_, err = c.OptimStep(ctx, "a", engine.AdamParams{LearningRate: 1e-3})
	errs = append(errs, err)
	c.DeleteAdapter(ctx, "a")
	return errs
}

// A plain HTTP server at a worker's address (a reused pod IP, a wrong DNS answer, a mistyped
// address) never receives the cluster token, nor any request a real worker would accept when it
// is replayed there: the client sends nothing derived from the token before the peer has proven
// it holds the token. Fakes: one answering {} to everything, one answering 404, one mimicking
// the handshake's answer with a made-up proof.
func TestAPlainServerAtAWorkersAddressNeverSeesTheToken(t *testing.T) {
	fakeHello := `{"nonce":"` + strings.Repeat("ab", 32) + `","id":"w1","proof":"` + strings.Repeat("cd", 32) + `"}`
	fakes := map[string]func(w http.ResponseWriter, r *http.Request){
		"ok":       func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, `{}`) },
		"notfound": func(w http.ResponseWriter, r *http.Request) { http.NotFound(w, r) },
		"hello":    func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, fakeHello) },
	}
	real := &countingEngine{}
	ws := NewServer(real, trustToken, t.TempDir())
	ws.SetIdentity("m", 2)
	worker := httptest.NewServer(ws)
	defer worker.Close()
	for name, answer := range fakes {
		rc := &recorder{answer: answer}
		fake := httptest.NewServer(rc)
		c := NewClient(fake.URL, trustToken, real.Info())
		for i, err := range everyCall(c) {
			if err == nil {
				t.Errorf("%s: call %d to the fake succeeded", name, i)
			}
		}
		fake.Close()
		reqs := rc.captured()
		if len(reqs) == 0 {
			t.Fatalf("%s: the fake saw nothing", name)
		}
		for _, q := range reqs {
			if q.carriesToken(trustToken) {
				t.Fatalf("%s: the fake received the cluster token: %s %s %v", name, q.method, q.path, q.header)
			}
			// Replayed to a real worker: nothing but a fresh handshake is answered.
			code := q.replay(t, worker.URL)
			if code == http.StatusOK && !strings.HasSuffix(q.path, "/hello") {
				t.Errorf("%s: a request sent to the fake (%s) was accepted by a real worker", name, q.path)
			}
		}
	}
	if n := real.n.Load(); n != 0 {
		t.Fatalf("the real worker's engine ran %d calls replayed from the fakes", n)
	}
}

// A real worker refuses every call captured on the way to it when it is replayed (a fake that
// recorded the gateway's describe and calls and sends them again), and a captured call altered
// in its body, sequence number or path.
func TestReplayedCallsAreRefused(t *testing.T) {
	real := &countingEngine{}
	ws := NewServer(real, trustToken, t.TempDir())
	ws.SetIdentity("m", 2)
	rc := &recorder{next: ws}
	onPath := httptest.NewServer(rc)
	defer onPath.Close()
	c := NewClient(onPath.URL, trustToken, real.Info())
	for i, err := range everyCall(c) {
		if err != nil {
			t.Fatalf("call %d through the recorder: %v", i, err)
		}
	}
	ran := real.n.Load()
	if ran == 0 {
		t.Fatal("the calls did not reach the engine")
	}
	reqs := rc.captured()
	replayed := 0
	for _, q := range reqs {
		if q.carriesToken(trustToken) {
			t.Fatalf("the token travelled: %s %v", q.path, q.header)
		}
		if strings.HasSuffix(q.path, "/hello") {
			continue
		}
		replayed++
		if code := q.replay(t, onPath.URL); code == http.StatusOK {
			t.Errorf("replayed %s was accepted", q.path)
		}
		// Altered: the body, the sequence number, the method's path.
		alt := q
		alt.body = append(bytes.Clone(q.body), ' ')
		if code := alt.replay(t, onPath.URL); code == http.StatusOK {
			t.Errorf("replayed %s with another body was accepted", q.path)
		}
		alt = q
		alt.header = q.header.Clone()
		for k := range alt.header {
			if strings.EqualFold(k, "X-Skein-Seq") {
				alt.header.Set(k, "999999")
			}
		}
		if code := alt.replay(t, onPath.URL); code == http.StatusOK {
			t.Errorf("replayed %s with another sequence number was accepted", q.path)
		}
		alt = q
		alt.path = "/worker/v1/delete"
		if code := alt.replay(t, onPath.URL); code == http.StatusOK {
			t.Errorf("%s replayed as a delete was accepted", q.path)
		}
	}
	if replayed < 5 {
		t.Fatalf("only %d calls captured", replayed)
	}
	if n := real.n.Load(); n != ran {
		t.Fatalf("replays ran %d more calls on the engine", n-ran)
	}
	// The client still works: nothing it holds was spoiled by the replays.
	if _, err := c.Status(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// A worker that registers with a gateway never sends the token to whatever answers at the
// gateway's address: it sends its registration only once the gateway has proven it holds the
// token. Fakes: one answering {} and one answering a registration's reply to everything.
func TestAnnounceNeverSendsTheTokenToAFakeGateway(t *testing.T) {
	info := (&fakeEngine{}).Info()
	for name, body := range map[string]string{"ok": `{}`, "registered": `{"id":"w","secret":"s3cret"}`} {
		rc := &recorder{answer: func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, body) }}
		fake := httptest.NewServer(rc)
		ctx, cancel := context.WithTimeout(context.Background(), 2500*time.Millisecond)
		reg := Registration{ID: "w", URL: "http://127.0.0.1:1", BaseModel: "m", MaxLoras: 2, Info: info}
		Announce(ctx, fake.URL, trustToken, reg, func() Heartbeat { return Heartbeat{} }, slog.New(slog.NewTextHandler(io.Discard, nil)))
		cancel()
		fake.Close()
		reqs := rc.captured()
		if len(reqs) == 0 {
			t.Fatalf("%s: the fake gateway saw nothing", name)
		}
		for _, q := range reqs {
			if q.carriesToken(trustToken) {
				t.Fatalf("%s: the fake gateway received the cluster token: %s %v", name, q.path, q.header)
			}
			if strings.HasSuffix(q.path, "/register") || strings.HasSuffix(q.path, "/heartbeat") {
				t.Fatalf("%s: the worker sent its %s to a gateway that proved nothing", name, q.path)
			}
		}
	}
}

// Dropping a client ends its calls in flight at once (an effectful one as lost: it may have run)
// and sends no later call: a frozen worker holds no op once the gateway has given it up.
func TestDropEndsCallsInFlight(t *testing.T) {
	ws := NewServer(&fakeEngine{}, "tok", t.TempDir())
	var after atomic.Int64
	var dropped atomic.Bool
	release := make(chan struct{})
	frozen := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if dropped.Load() {
			after.Add(1)
		}
		if strings.HasSuffix(r.URL.Path, "/forward_backward") {
			<-release // took the call and froze
			return
		}
		ws.ServeHTTP(w, r)
	}))
	defer frozen.Close()
	defer close(release)
	c := NewClient(frozen.URL, "tok", (&fakeEngine{}).Info())
	errc := make(chan error, 1)
	go func() {
		_, err := c.ForwardBackward(context.Background(), "a", []engine.Datum{{Tokens: []int{1}}}, "cross_entropy", nil)
		errc <- err
	}()
	time.Sleep(300 * time.Millisecond) // the call is in the worker's hands
	dropped.Store(true)
	start := time.Now()
	c.Drop()
	select {
	case err := <-errc:
		if !errors.Is(err, ErrLost) || c.Effects() != 1 {
			t.Fatalf("the call in flight ended with %v, effects %d; want lost and counted", err, c.Effects())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the call in flight did not end when the client was dropped")
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("the call ended %s after the drop", d)
	}
	if _, err := c.OptimStep(context.Background(), "a", engine.AdamParams{}); !errors.Is(err, ErrUnreachable) || c.Effects() != 1 {
		t.Fatalf("a call after the drop: %v, effects %d; want unreachable, not counted", err, c.Effects())
	}
	if after.Load() != 0 {
		t.Fatalf("%d requests reached the worker after the drop", after.Load())
	}
}
