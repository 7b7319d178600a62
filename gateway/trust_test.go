package gateway_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/client"
	"github.com/skein-ai/skein/discovery"
	"github.com/skein-ai/skein/engine"
	"github.com/skein-ai/skein/gateway"
	"github.com/skein-ai/skein/worker"
)

// seenRequest is a request a plain server received.
type seenRequest struct {
	path   string
	header http.Header
	body   []byte
}

// plainServer is an HTTP server that is no worker: it answers {} to everything and keeps what
// it receives.
type plainServer struct {
	*httptest.Server
	mu   sync.Mutex
	seen []seenRequest
}

func newPlainServer(t *testing.T) *plainServer {
	p := &plainServer{}
	p.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		p.mu.Lock()
		p.seen = append(p.seen, seenRequest{r.URL.Path, r.Header.Clone(), b})
		p.mu.Unlock()
		_, _ = io.WriteString(w, `{}`)
	}))
	t.Cleanup(p.Close)
	return p
}

func (p *plainServer) requests() []seenRequest {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]seenRequest(nil), p.seen...)
}

func (q seenRequest) carries(secret string) bool {
	for k, vs := range q.header {
		if strings.Contains(k, secret) || strings.Contains(strings.Join(vs, " "), secret) {
			return true
		}
	}
	return bytes.Contains(q.body, []byte(secret))
}

// A plain HTTP server at a discovered address gets hellos only: never the cluster token, never a
// call, and nothing it received is accepted by a real worker when replayed there; it never
// becomes a replica.
func TestDiscoveryNeverSendsTheTokenToAPlainServer(t *testing.T) {
	e, err := engine.Load(modelDir(), engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	data := t.TempDir()
	src := &pushSource{events: make(chan func(discovery.Notifier))}
	gw, err := gateway.New(gateway.Options{DataDir: data, WorkerToken: clusterToken, WorkerTimeout: 1500 * time.Millisecond, Discovery: src})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(gw)
	t.Cleanup(func() { ts.Close(); gw.Close() })
	plain := newPlainServer(t)
	src.upsert("pod-x", plain.URL, true)
	waitUntil(t, "the gateway to try the address a few times", func() bool { return len(plain.requests()) >= 3 })
	real, _ := newDiscoveredWorker(t, e, data)
	for _, q := range plain.requests() {
		if q.carries(clusterToken) {
			t.Fatalf("the plain server received the cluster token: %s %v", q.path, q.header)
		}
		if !strings.HasSuffix(q.path, "/hello") {
			t.Fatalf("the plain server received a call: %s", q.path)
		}
		req, _ := http.NewRequest("POST", real.URL+q.path, bytes.NewReader(q.body))
		req.Header = q.header.Clone()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var ans worker.HelloReply
		_ = json.NewDecoder(resp.Body).Decode(&ans)
		resp.Body.Close()
		if strings.Contains(ans.Proof, clusterToken) {
			t.Fatal("a worker's answer holds the token")
		}
	}
	if strings.Contains(replicaIDs(t, ts.URL), "pod-x") {
		t.Fatal("the plain server became a replica")
	}
}

// A worker that registers itself joins through the handshake (it never sends the token) and
// serves a run; a worker with a wrong token never registers (it cannot check the gateway's
// proof, so it sends nothing but hellos).
func TestAnnouncedWorkerJoinsWithoutSendingTheToken(t *testing.T) {
	ts, e, data := newWorkerGatewayTimeout(t, 3*time.Second)
	ws := worker.NewServer(e.Fork(), clusterToken, data)
	var sawToken atomic.Bool
	w := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if r.Header.Get(worker.TokenHeader) != "" {
			sawToken.Store(true)
		}
		ws.ServeHTTP(rw, r)
	}))
	t.Cleanup(w.Close)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	reg := worker.Registration{ID: "announced", URL: w.URL, Instance: ws.Instance(), BaseModel: base, MaxLoras: 2, Info: e.Info()}
	go worker.Announce(ctx, ts.URL, clusterToken, reg, func() worker.Heartbeat { return ws.Status(2) }, quiet)
	wrong := reg
	wrong.ID, wrong.Instance = "wrong-token", "other-instance"
	go worker.Announce(ctx, ts.URL, "not-the-token", wrong, func() worker.Heartbeat { return worker.Heartbeat{} }, quiet)
	waitUntil(t, "the announced worker to join", func() bool { return strings.Contains(replicaIDs(t, ts.URL), `"announced"`) })
	_, tc := newRun(t, ts.URL, "tml-announced", 4)
	if s, err := step(t, tc); err != nil || s != 1 {
		t.Fatalf("step on the announced worker: %v %v", s, err)
	}
	time.Sleep(4 * time.Second) // past the worker timeout: its signed heartbeats keep it
	if s, err := step(t, tc); err != nil || s != 2 {
		t.Fatalf("second step: %v %v", s, err)
	}
	body := replicaIDs(t, ts.URL)
	if strings.Contains(body, "wrong-token") {
		t.Fatal("a worker with a wrong token joined")
	}
	if sawToken.Load() {
		t.Fatal("the gateway sent the token to the worker")
	}
}

// One worker at two addresses (a dual-stack Service: 127.0.0.1:P and [::1]:P) is one replica,
// never two holding more adapters than its slots; a stall of one address makes it re-join, and
// the re-join keeps the adapters placed through the other address.
func TestOneWorkerAtTwoAddressesIsOneReplica(t *testing.T) {
	e, err := engine.Load(modelDir(), engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	data := t.TempDir()
	src := &pushSource{events: make(chan func(discovery.Notifier))}
	gw, err := gateway.New(gateway.Options{DataDir: data, WorkerToken: clusterToken, WorkerTimeout: 1500 * time.Millisecond, Discovery: src})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(gw)
	t.Cleanup(func() { ts.Close(); gw.Close() })
	fe := e.Fork()
	ws := worker.NewServer(fe, clusterToken, data)
	ws.SetIdentity(base, 2)
	var stalled atomic.Bool
	release := make(chan struct{})
	addrA := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if stalled.Load() {
			select {
			case <-release:
			case <-time.After(3 * time.Second):
			}
		}
		ws.ServeHTTP(w, r)
	}))
	addrB := httptest.NewServer(ws)
	t.Cleanup(addrB.Close)
	t.Cleanup(addrA.Close)
	t.Cleanup(func() { close(release) })

	src.upsert("addr-a", addrA.URL, true)
	waitUntil(t, "the worker to join", func() bool { return strings.Contains(replicaIDs(t, ts.URL), "addr-a") })
	src.upsert("addr-b", addrB.URL, true)
	time.Sleep(2500 * time.Millisecond) // addr-b's follower has described the worker twice
	if n := strings.Count(replicaIDs(t, ts.URL), `"id":"`+base+"@"); n != 1 {
		t.Fatalf("one worker at two addresses is %d replicas: %s", n, replicaIDs(t, ts.URL))
	}
	var runs []*client.TrainingClient
	for _, key := range []string{"tml-dual-1", "tml-dual-2"} {
		_, tc := newRun(t, ts.URL, key, 4)
		if s, err := step(t, tc); err != nil || s != 1 {
			t.Fatalf("first step: %v %v", s, err)
		}
		runs = append(runs, tc)
	}
	// addr-a stalls for 3 s: the replica is dropped and joins again (through either address).
	stalled.Store(true)
	time.Sleep(3500 * time.Millisecond)
	stalled.Store(false)
	waitUntil(t, "the worker to join again", func() bool { return strings.Contains(replicaIDs(t, ts.URL), `"id":"`+base+"@") })
	for i, r := range runs {
		if s, err := step(t, r); err != nil || s != 2 {
			t.Fatalf("run %d after the stall: %v %v", i, s, err)
		}
	}
	if held := fe.TrainingAdapterIDs(context.Background()); len(held) > 2 {
		t.Fatalf("the worker holds %d adapters in 2 slots: %v", len(held), held)
	}
	if n := strings.Count(replicaIDs(t, ts.URL), `"id":"`+base+"@"); n != 1 {
		t.Fatalf("after the stall: %d replicas: %s", n, replicaIDs(t, ts.URL))
	}
}

// A worker that freezes mid-forward_backward (SIGSTOP, a paused VM) is dropped by the liveness
// check, and dropping it ends its calls: the op's future ends within seconds as "may have run",
// and the run's next step runs on the other worker.
func TestAFrozenWorkersCallsEndWhenItIsDropped(t *testing.T) {
	e, err := engine.Load(modelDir(), engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	data := t.TempDir()
	src := &pushSource{events: make(chan func(discovery.Notifier))}
	gw, err := gateway.New(gateway.Options{DataDir: data, WorkerToken: clusterToken, WorkerTimeout: time.Second, Discovery: src})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(gw)
	t.Cleanup(func() { ts.Close(); gw.Close() })
	wsA := worker.NewServer(e.Fork(), clusterToken, data)
	wsA.SetIdentity(base, 4)
	var freezeAtFB, frozen atomic.Bool
	thaw := make(chan struct{})
	a := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if freezeAtFB.Load() && strings.HasSuffix(r.URL.Path, "/forward_backward") {
			frozen.Store(true) // it took the call and stopped: nothing more is answered
		}
		if frozen.Load() {
			<-thaw
			return
		}
		wsA.ServeHTTP(w, r)
	}))
	t.Cleanup(a.Close)
	t.Cleanup(func() { close(thaw) })
	src.upsert("pod-a", a.URL, true)
	waitUntil(t, "pod-a to join", func() bool { return strings.Contains(replicaIDs(t, ts.URL), "pod-a") })
	_, tc := newRun(t, ts.URL, "tml-frozen", 4)
	if s, err := step(t, tc); err != nil || s != 1 {
		t.Fatalf("first step: %v %v", s, err)
	}
	b, _ := newDiscoveredWorker(t, e, data)
	src.upsert("pod-b", b.URL, true)
	waitUntil(t, "pod-b to join", func() bool { return strings.Contains(replicaIDs(t, ts.URL), "pod-b") })

	freezeAtFB.Store(true)
	start := time.Now()
	f, err := tc.ForwardBackward(context.Background(), durableBatch, "cross_entropy", nil, false)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var out api.ForwardBackwardOutput
	err = f.Result(ctx, &out)
	if ctx.Err() != nil {
		t.Fatalf("the frozen worker's op had not ended after %s", time.Since(start))
	}
	if err == nil || !strings.Contains(err.Error(), "may have run") {
		t.Fatalf("the frozen worker's op: %v, want it to end saying it may have run", err)
	}
	if s, err := step(t, tc); err != nil {
		t.Fatalf("the run's next step after its worker froze: %v %v", s, err)
	}
	if !frozen.Load() {
		t.Fatal("the op never reached the worker that froze")
	}
	if !strings.Contains(replicaIDs(t, ts.URL), "pod-b") || strings.Contains(replicaIDs(t, ts.URL), "pod-a") {
		t.Fatalf("replicas after the freeze: %s", replicaIDs(t, ts.URL))
	}
}
