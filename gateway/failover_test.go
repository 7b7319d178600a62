package gateway_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/client"
	"github.com/skein-ai/skein/engine"
	"github.com/skein-ai/skein/gateway"
	"github.com/skein-ai/skein/replica"
	"github.com/skein-ai/skein/store"
	"github.com/skein-ai/skein/worker"
)

// stoppableCompute is an engine whose forward_backwards wait at a gate while it is shut, so that a
// test can kill a gateway while one of its ops is on the replica.
type stoppableCompute struct {
	engine.Compute
	mu      sync.Mutex
	gate    chan struct{} // nil: open
	entered chan struct{} // gets a value when an op reaches a shut gate
	left    chan struct{} // gets a value when such an op has computed
}

func (g *stoppableCompute) ForwardBatch(ctx context.Context, id string, b *engine.Batch, backward bool) (*engine.ForwardResult, error) {
	g.mu.Lock()
	gate := g.gate
	g.mu.Unlock()
	if gate != nil && backward {
		g.entered <- struct{}{}
		<-gate
		defer func() { g.left <- struct{}{} }()
	}
	return g.Compute.ForwardBatch(ctx, id, b, backward)
}

func (g *stoppableCompute) shut() {
	g.mu.Lock()
	g.gate, g.entered, g.left = make(chan struct{}), make(chan struct{}, 16), make(chan struct{}, 16)
	g.mu.Unlock()
}

type pgGateway struct {
	gw      *gateway.Server
	ts      *httptest.Server
	rep     *replica.Replica
	compute *stoppableCompute
	st      *store.Postgres
}

// startPGGateways starts n gateways on one fresh PostgreSQL schema and one shared data directory
// (as pods sharing a ReadWriteMany claim), each with its own in-process replica and an
// advertised URL for forwarding, at default lease settings.
func startPGGateways(t *testing.T, n int) []*pgGateway {
	return startPGGatewaysWith(t, n, nil)
}

// startPGGatewaysWith is startPGGateways with options changed by opt.
func startPGGatewaysWith(t testing.TB, n int, opt func(*gateway.Options)) []*pgGateway {
	gws, _ := startPGGatewaysOn(t, n, opt, false)
	return gws
}

// startPGGatewaysOn is startPGGatewaysWith, without local replicas if noLocalReplicas (workers
// then serve the model); it also returns the shared data directory.
func startPGGatewaysOn(t testing.TB, n int, opt func(*gateway.Options), noLocalReplicas bool) ([]*pgGateway, string) {
	dsn := os.Getenv("SKEIN_TEST_POSTGRES")
	if dsn == "" {
		t.Skip("SKEIN_TEST_POSTGRES not set (.ci/run starts PostgreSQL and sets it)")
	}
	return startPGGatewaysAt(t, dsn, n, opt, noLocalReplicas)
}

// startPGGatewaysAt is startPGGatewaysOn on the PostgreSQL at dsn.
func startPGGatewaysAt(t testing.TB, dsn string, n int, opt func(*gateway.Options), noLocalReplicas bool) ([]*pgGateway, string) {
	schema, data := newPGSchema(t, dsn), t.TempDir()
	var out []*pgGateway
	for i := range n {
		out = append(out, startPGGateway(t, dsn+"&search_path="+schema, data, i, opt, noLocalReplicas))
	}
	return out, data
}

// newPGSchema makes a fresh schema for one test's gateways.
func newPGSchema(t testing.TB, dsn string) string {
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	schema := fmt.Sprintf("fo_%d", time.Now().UnixNano())
	if _, err := db.Exec("CREATE SCHEMA " + schema); err != nil {
		t.Fatal(err)
	}
	return schema
}

// startPGGateway starts gateway number i on the store at dsn (a schema's), with data as its data
// directory, closed at the test's end (or before, by the test).
func startPGGateway(t testing.TB, dsn, data string, i int, opt func(*gateway.Options), noLocalReplicas bool) *pgGateway {
	st, err := store.OpenPostgres(dsn)
	if err != nil {
		t.Fatal(err)
	}
	e, err := engine.Load(modelDir(), engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	g := &pgGateway{compute: &stoppableCompute{Compute: e}, st: st}
	var h http.Handler = http.NotFoundHandler()
	var mu sync.Mutex
	g.ts = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		hh := h
		mu.Unlock()
		hh.ServeHTTP(w, r)
	}))
	o := gateway.Options{DataDir: data, Store: st, AdvertiseURL: g.ts.URL, LongPoll: 5 * time.Second}
	if opt != nil {
		opt(&o)
	}
	var reps []*replica.Replica
	if !noLocalReplicas {
		var c engine.Compute = g.compute
		if o.Storage != nil { // object storage: the replica reads and writes adapters there
			if c, err = replica.NewStored(g.compute, o.Storage, o.DataDir, filepath.Join(o.DataDir, "scratch")); err != nil {
				t.Fatal(err)
			}
		}
		g.rep = replica.New(fmt.Sprintf("r%d", i), base, c, 4)
		reps = append(reps, g.rep)
	}
	g.gw, err = gateway.New(o, reps...)
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	h = g.gw
	mu.Unlock()
	t.Cleanup(func() {
		g.ts.Close()
		g.gw.Close()
		if g.rep != nil {
			g.rep.Close()
		}
		st.Close()
	})
	return g
}

func timeDuration(ns int64) time.Duration { return time.Duration(ns) }

// stepOf is an optim_step result's step.
func stepOf(t *testing.T, f *client.Future, ctx context.Context) int {
	t.Helper()
	var out api.OptimStepResponse
	if err := f.Result(ctx, &out); err != nil {
		t.Fatalf("optim_step %s: %v", f.RequestID, err)
	}
	return int(out.Metrics["step:max"])
}

// Two gateways on one PostgreSQL; the one that sequences a run (it created it) is killed while
// one of the run's ops is on its replica and five more are queued behind it. The other gateway
// takes the run over once the lease lapses, runs every acknowledged op without a stored result
// once, in seq_id order: each optim_step's step is exactly its number, and no future stays
// pending. The dead gateway's op, released afterwards as a zombie's, changes nothing: its
// result is refused (stale epoch) and its replica never writes the state again. A request sent
// to the other gateway while the owner lived was forwarded to the owner.
func TestFailoverRunsAcknowledgedOpsOnceInOrder(t *testing.T) {
	gws := startPGGateways(t, 2)
	a, b := gws[0], gws[1]
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ca, cb := client.New(a.ts.URL, "tml-failover"), client.New(b.ts.URL, "tml-failover")
	sess, err := ca.CreateSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tc, err := ca.CreateLoraTrainingClient(ctx, sess, 0, base, 4)
	if err != nil {
		t.Fatal(err)
	}
	batch := []api.Datum{datum([]int{3, 14, 15, 92, 65, 35}, true)}
	submitStep := func() (*client.Future, *client.Future) {
		t.Helper()
		fb, err := tc.ForwardBackward(ctx, batch, "cross_entropy", nil, false)
		if err != nil {
			t.Fatal(err)
		}
		op, err := tc.OptimStep(ctx, 1e-2)
		if err != nil {
			t.Fatal(err)
		}
		return fb, op
	}
	for want := 1; want <= 2; want++ {
		fb, op := submitStep()
		if err := fb.Result(ctx, &api.ForwardBackwardOutput{}); err != nil {
			t.Fatal(err)
		}
		if got := stepOf(t, op, ctx); got != want {
			t.Fatalf("step %d, want %d", got, want)
		}
	}
	// Through B while A lives: forwarded to A, which runs it on its replica; B's holds nothing.
	tc.Via(cb)
	fb, op := submitStep()
	if err := fb.Result(ctx, &api.ForwardBackwardOutput{}); err != nil {
		t.Fatal(err)
	}
	if got := stepOf(t, op, ctx); got != 3 {
		t.Fatalf("step through B: %d, want 3", got)
	}
	if ids := b.rep.AdapterIDs(ctx); len(ids) != 0 {
		t.Fatalf("B's replica holds %v: the request was not forwarded to the run's gateway", ids)
	}
	if ids := a.rep.AdapterIDs(ctx); len(ids) != 1 {
		t.Fatalf("A's replica holds %v", ids)
	}

	// Three more steps through A; the first forward_backward stops on A's replica; A dies.
	tc.Via(ca)
	a.compute.shut()
	var fbs, ops []*client.Future
	for i := range 3 {
		fb, op := submitStep()
		fbs, ops = append(fbs, fb), append(ops, op)
		if i == 0 {
			// A request refused before its future was made consumes its seq_id: the gateway
			// taking over must skip it, or every later op waits for it.
			if _, err := tc.OptimStep(ctx, -1); !isStatus(err, 400) {
				t.Fatalf("an optim_step with a negative learning rate: %v, want a 400", err)
			}
		}
	}
	select {
	case <-a.compute.entered:
	case <-ctx.Done():
		t.Fatal("the op never reached A's replica")
	}
	a.ts.CloseClientConnections()
	a.ts.Close()
	a.gw.Crash()
	killed := time.Now()

	// The client goes on through B: every future of the dead gateway ends, each once.
	first := fbs[0]
	if err := cb.Future(first.RequestID).Result(ctx, &api.ForwardBackwardOutput{}); err != nil {
		t.Fatalf("the forward_backward A was running: %v", err)
	}
	took := time.Since(killed)
	t.Logf("first op after the kill done in %s", took.Round(time.Millisecond))
	if took > 15*time.Second {
		t.Errorf("failover's first op took %s after the kill, want ≤ 15 s", took)
	}
	for i := range 3 {
		if err := cb.Future(fbs[i].RequestID).Result(ctx, &api.ForwardBackwardOutput{}); err != nil {
			t.Fatalf("forward_backward %d: %v", i+4, err)
		}
		if got := stepOf(t, cb.Future(ops[i].RequestID), ctx); got != 4+i {
			t.Fatalf("step %d after the failover, want %d", got, 4+i)
		}
	}
	// The zombie: A's stopped forward_backward goes on now. Its result is refused and it is not
	// run again; the run's next step through B is 7.
	close(a.compute.gate)
	<-a.compute.left
	time.Sleep(300 * time.Millisecond) // its gradient ledger's write and its result's
	run, err := b.st.GetRun(ctx, tc.ModelID)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Step    int      `json:"step"`
		Pending []string `json:"pending_forward_backwards"`
	}
	if err := json.Unmarshal(run.Data, &d); err != nil || d.Step != 6 || len(d.Pending) != 0 {
		t.Fatalf("the run's row after the zombie's op: %s (%v), want step 6 and no pending forward_backward", run.Data, err)
	}
	tc.Via(cb)
	fb, op = submitStep()
	if err := fb.Result(ctx, &api.ForwardBackwardOutput{}); err != nil {
		t.Fatal(err)
	}
	if got := stepOf(t, op, ctx); got != 7 {
		t.Fatalf("step after the zombie: %d, want 7", got)
	}
	// The first forward_backward's one result is B's (the zombie's write was refused).
	row, err := b.st.GetFuture(ctx, first.RequestID)
	if err != nil || row.State != store.FutureComplete || row.Owner == "" {
		t.Fatalf("the zombie's op's future: %+v %v", row, err)
	}
	if ops, err := b.st.PendingOps(ctx, tc.ModelID); err != nil || len(ops) != 0 {
		t.Fatalf("pending after the failover: %d %v", len(ops), err)
	}
	if l, err := b.st.RunLeaseOf(ctx, tc.ModelID); err != nil || l.Epoch < 2 || l.Addr != b.ts.URL {
		t.Fatalf("the run's lease: %+v %v", l, err)
	}
}

// A gateway that stops gracefully (Close, as on SIGTERM) hands its runs over: the other gateway
// takes the run at its next request at once, not after the lease lapses, and the steps go on.
func TestGracefulStopHandsRunsOver(t *testing.T) {
	gws := startPGGateways(t, 2)
	a, b := gws[0], gws[1]
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ca, cb := client.New(a.ts.URL, "tml-handover"), client.New(b.ts.URL, "tml-handover")
	sess, err := ca.CreateSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tc, err := ca.CreateLoraTrainingClient(ctx, sess, 0, base, 4)
	if err != nil {
		t.Fatal(err)
	}
	batch := []api.Datum{datum([]int{3, 14, 15, 92, 65, 35}, true)}
	step := func(c *client.Client) int {
		tc.Via(c)
		fb, err := tc.ForwardBackward(ctx, batch, "cross_entropy", nil, false)
		if err != nil {
			t.Fatal(err)
		}
		op, err := tc.OptimStep(ctx, 1e-2)
		if err != nil {
			t.Fatal(err)
		}
		if err := fb.Result(ctx, &api.ForwardBackwardOutput{}); err != nil {
			t.Fatal(err)
		}
		return stepOf(t, op, ctx)
	}
	if got := step(ca); got != 1 {
		t.Fatalf("step %d", got)
	}
	a.ts.Close()
	a.gw.Close()
	start := time.Now()
	if got := step(cb); got != 2 {
		t.Fatalf("step after the handover: %d, want 2", got)
	}
	if took := time.Since(start); took > gateway.DefaultRunLeaseTTL/2 {
		t.Fatalf("the step after a graceful stop took %s: the lease was left to lapse", took)
	}
	if l, err := b.st.RunLeaseOf(ctx, tc.ModelID); err != nil || l.Epoch < 2 || l.Addr != b.ts.URL {
		t.Fatalf("lease %+v %v", l, err)
	}
}

// Sessions across gateways: a session created on one gateway after the other started is found
// by the other (heartbeat, create_model), and a gateway whose own copy of a session stopped
// hearing heartbeats does not expire it while its client heartbeats through the other gateway
// (the store's heartbeat counts); once no gateway hears it, it expires.
func TestSessionsLiveAcrossGateways(t *testing.T) {
	timeout := 800 * time.Millisecond
	gws := startPGGatewaysWith(t, 2, func(o *gateway.Options) { o.SessionTimeout = timeout })
	a, b := gws[0], gws[1]
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ca, cb := client.New(a.ts.URL, "tml-sessions"), client.New(b.ts.URL, "tml-sessions")
	sess, err := ca.CreateSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	beat := func(c *client.Client) error {
		return c.Do(ctx, "POST", "session_heartbeat", api.SessionHeartbeatRequest{SessionID: sess}, nil)
	}
	if err := beat(cb); err != nil {
		t.Fatalf("a heartbeat through the other gateway: %v", err)
	}
	tc, err := cb.CreateLoraTrainingClient(ctx, sess, 0, base, 4)
	if err != nil {
		t.Fatalf("create_model through the other gateway: %v", err)
	}
	// Heartbeats through A only, for several timeouts: B (which created the run) keeps it.
	for end := time.Now().Add(3 * timeout); time.Now().Before(end); {
		if err := beat(ca); err != nil {
			t.Fatal(err)
		}
		time.Sleep(timeout / 4)
	}
	row, err := b.st.GetSession(ctx, sess)
	if err != nil || row.Closed {
		t.Fatalf("the session was expired while its client heartbeated through the other gateway: %+v %v", row, err)
	}
	if run, err := b.st.GetRun(ctx, tc.ModelID); err != nil || !run.Live {
		t.Fatalf("its run: %+v %v", run, err)
	}
	// No heartbeats at all: it expires.
	deadline := time.Now().Add(10 * timeout)
	for {
		row, err := b.st.GetSession(ctx, sess)
		if err == nil && row.Closed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the session never expired: %+v %v", row, err)
		}
		time.Sleep(timeout / 4)
	}
}

// A session's runs and samplers made through different gateways are all listed by get_session on
// each of them, and on a gateway that never saw the session before: each gateway wrote the
// session's row with only its own run in it, and the old get_session read only that list.
func TestASessionListsWhatEveryGatewayMadeInIt(t *testing.T) {
	gws := startPGGateways(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const tenant = "tml-members"
	ca, cb := client.New(gws[0].ts.URL, tenant), client.New(gws[1].ts.URL, tenant)
	sess, err := ca.CreateSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ta, err := ca.CreateLoraTrainingClient(ctx, sess, 0, base, 4)
	if err != nil {
		t.Fatal(err)
	}
	tb, err := cb.CreateLoraTrainingClient(ctx, sess, 1, base, 4)
	if err != nil {
		t.Fatal(err)
	}
	smp, err := cb.CreateSamplingSession(ctx, sess, base, "")
	if err != nil {
		t.Fatal(err)
	}
	for i, g := range gws {
		var got api.SessionResponse
		if err := client.New(g.ts.URL, tenant).Do(ctx, "GET", "sessions/"+sess, nil, &got); err != nil {
			t.Fatalf("gateway %d: %v", i, err)
		}
		if !slices.Contains(got.TrainingRunIDs, ta.ModelID) || !slices.Contains(got.TrainingRunIDs, tb.ModelID) || len(got.TrainingRunIDs) != 2 ||
			!slices.Equal(got.SamplerIDs, []string{smp}) {
			t.Fatalf("gateway %d lists runs %v and samplers %v, want %s and %s, and %s", i, got.TrainingRunIDs, got.SamplerIDs, ta.ModelID, tb.ModelID, smp)
		}
	}
}

// A run and its checkpoint made through one gateway are in every gateway's listings (the run's
// training_runs row with its last checkpoint, its checkpoints, the tenant's checkpoints), also on
// a gateway that started before they were made; another tenant sees none of them. The old
// listings read only each gateway's own maps.
func TestListingsShowWhatOtherGatewaysMade(t *testing.T) {
	gws := startPGGateways(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const tenant = "tml-listings"
	ca := client.New(gws[0].ts.URL, tenant)
	sess, err := ca.CreateSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tc, err := ca.CreateLoraTrainingClient(ctx, sess, 0, base, 4)
	if err != nil {
		t.Fatal(err)
	}
	f, err := tc.SaveState(ctx, "first")
	if err != nil {
		t.Fatal(err)
	}
	var saved api.SaveWeightsResponse
	if err := f.Result(ctx, &saved); err != nil {
		t.Fatal(err)
	}
	for i, g := range gws {
		c := client.New(g.ts.URL, tenant)
		var runs struct {
			TrainingRuns []api.TrainingRun `json:"training_runs"`
		}
		if err := c.Do(ctx, "GET", "training_runs", nil, &runs); err != nil {
			t.Fatalf("gateway %d: %v", i, err)
		}
		if len(runs.TrainingRuns) != 1 || runs.TrainingRuns[0].TrainingRunID != tc.ModelID ||
			runs.TrainingRuns[0].LastCheckpoint == nil || runs.TrainingRuns[0].LastCheckpoint.TinkerPath != saved.Path {
			t.Fatalf("gateway %d lists runs %+v, want %s with its checkpoint %s", i, runs.TrainingRuns, tc.ModelID, saved.Path)
		}
		for _, path := range []string{"training_runs/" + tc.ModelID + "/checkpoints", "checkpoints"} {
			var ck api.CheckpointsResponse
			if err := c.Do(ctx, "GET", path, nil, &ck); err != nil {
				t.Fatalf("gateway %d, %s: %v", i, path, err)
			}
			if len(ck.Checkpoints) != 1 || ck.Checkpoints[0].TinkerPath != saved.Path {
				t.Fatalf("gateway %d, %s: %+v, want %s", i, path, ck.Checkpoints, saved.Path)
			}
		}
		var sessions api.SessionsResponse
		if err := c.Do(ctx, "GET", "sessions", nil, &sessions); err != nil || len(sessions.Sessions) != 1 || sessions.Sessions[0] != sess {
			t.Fatalf("gateway %d lists sessions %v (%v), want [%s]", i, sessions.Sessions, err, sess)
		}
		other := client.New(g.ts.URL, "tml-someone-else")
		if err := other.Do(ctx, "GET", "sessions", nil, &sessions); err != nil || len(sessions.Sessions) != 0 {
			t.Fatalf("gateway %d shows another tenant sessions %v (%v)", i, sessions.Sessions, err)
		}
		var none struct {
			TrainingRuns []api.TrainingRun `json:"training_runs"`
		}
		if err := other.Do(ctx, "GET", "training_runs", nil, &none); err != nil || len(none.TrainingRuns) != 0 {
			t.Fatalf("gateway %d shows another tenant %+v (%v)", i, none.TrainingRuns, err)
		}
		var ck api.CheckpointsResponse
		if err := other.Do(ctx, "GET", "training_runs/"+tc.ModelID+"/checkpoints", nil, &ck); err == nil {
			t.Fatalf("gateway %d lists another tenant's run's checkpoints: %+v", i, ck.Checkpoints)
		}
	}
}

// countingCompute counts the forward_backwards that reach an engine.
type countingCompute struct {
	engine.Compute
	backward atomic.Int64
}

func (c *countingCompute) ForwardBatch(ctx context.Context, id string, b *engine.Batch, backward bool) (*engine.ForwardResult, error) {
	if backward {
		c.backward.Add(1)
	}
	return c.Compute.ForwardBatch(ctx, id, b, backward)
}

// A worker still holding a dead gateway's call (it was in flight when the gateway died) gets it
// after the run's new gateway has driven the adapter: the call carries the old epoch and the
// worker refuses it before it reaches the engine, so its gradients are not added to the adapter
// the new gateway trains. Two gateways on PostgreSQL, one worker registered with both.
func TestAWorkerRefusesTheDeadGatewaysCallInFlight(t *testing.T) {
	gws, data := startPGGatewaysOn(t, 2, func(o *gateway.Options) {
		o.AcceptWorkers, o.WorkerToken, o.WorkerTimeout = true, clusterToken, time.Hour
	}, true)
	a, b := gws[0], gws[1]
	e, err := engine.Load(modelDir(), engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	eng := &countingCompute{Compute: e}
	ws := worker.NewServer(eng, clusterToken, data)
	var held atomic.Pointer[chan struct{}] // shut: the next forward_backward waits here, not yet at the worker
	entered, left := make(chan struct{}, 1), make(chan struct{}, 1)
	w := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if gate := held.Load(); gate != nil && r.URL.Path == "/worker/v1/forward_backward" && held.CompareAndSwap(gate, nil) {
			entered <- struct{}{}
			<-*gate
			defer func() { left <- struct{}{} }()
		}
		ws.ServeHTTP(rw, r)
	}))
	t.Cleanup(w.Close)
	for _, g := range gws {
		if code, ans := postWorker(t, g.ts.URL, "register", clusterToken, registration("w", w.URL, e)); code != http.StatusOK {
			t.Fatalf("register: %d %v", code, ans)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ca, cb := client.New(a.ts.URL, "tml-zombie"), client.New(b.ts.URL, "tml-zombie")
	sess, err := ca.CreateSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tc, err := ca.CreateLoraTrainingClient(ctx, sess, 0, base, 4)
	if err != nil {
		t.Fatal(err)
	}
	batch := []api.Datum{datum([]int{3, 14, 15, 92, 65, 35}, true)}
	submit := func() (*client.Future, *client.Future) {
		fb, err := tc.ForwardBackward(ctx, batch, "cross_entropy", nil, false)
		if err != nil {
			t.Fatal(err)
		}
		op, err := tc.OptimStep(ctx, 1e-2)
		if err != nil {
			t.Fatal(err)
		}
		return fb, op
	}
	fb, op := submit()
	if err := fb.Result(ctx, &api.ForwardBackwardOutput{}); err != nil {
		t.Fatal(err)
	}
	if got := stepOf(t, op, ctx); got != 1 {
		t.Fatalf("step %d", got)
	}
	gate := make(chan struct{})
	held.Store(&gate)
	fb, op = submit()
	select {
	case <-entered:
	case <-ctx.Done():
		t.Fatal("A's forward_backward never left for the worker")
	}
	a.ts.CloseClientConnections()
	a.ts.Close()
	a.gw.Crash()
	// B takes the run over and runs both ops on the worker.
	if err := cb.Future(fb.RequestID).Result(ctx, &api.ForwardBackwardOutput{}); err != nil {
		t.Fatal(err)
	}
	if got := stepOf(t, cb.Future(op.RequestID), ctx); got != 2 {
		t.Fatalf("step after the takeover: %d, want 2", got)
	}
	before := eng.backward.Load()
	close(gate) // A's call, in flight all along, reaches the worker now
	<-left
	if got := eng.backward.Load(); got != before {
		t.Fatalf("the dead gateway's forward_backward reached the engine (%d forward_backwards, want %d)", got, before)
	}
	if before != 2 {
		t.Fatalf("%d forward_backwards ran on the engine, want 2 (one per acknowledged request)", before)
	}
	tc.Via(cb)
	fb, op = submit()
	if err := fb.Result(ctx, &api.ForwardBackwardOutput{}); err != nil {
		t.Fatal(err)
	}
	if got := stepOf(t, op, ctx); got != 3 {
		t.Fatalf("next step %d, want 3", got)
	}
}

// resultStallStore stalls the storing of an optim_step's result while shut: its gateway saved the
// step and dies before the result is stored.
type resultStallStore struct {
	*store.Postgres
	forwardBackward bool // stall a forward_backward's result instead
	shut            atomic.Bool
	stalled         chan struct{}
	release         chan struct{}
}

func (s *resultStallStore) FinishFutureFenced(ctx context.Context, id, state string, result []byte, category string, fence store.Fence) (bool, error) {
	kind := `"optim_step"`
	if s.forwardBackward {
		kind = `"loss_fn_outputs"`
	}
	if s.shut.Load() && strings.Contains(string(result), kind) && s.shut.CompareAndSwap(true, false) {
		s.stalled <- struct{}{}
		<-s.release
	}
	return s.Postgres.FinishFutureFenced(ctx, id, state, result, category, fence)
}

// A gateway that saved an optim_step's state and died before storing its result: the gateway
// taking the run over finds the step in the saved state (gradients.json names the request) and
// answers it from there, at the saved step, instead of stepping again (which would take a
// second, gradient-less step). The dead gateway's late result is refused.
func TestAStepSavedButNotAnsweredIsNotTakenTwice(t *testing.T) {
	var stall *resultStallStore
	gws, _ := startPGGatewaysOn(t, 2, func(o *gateway.Options) {
		if stall == nil { // the first gateway's store stalls
			pg := o.Store.(*store.Postgres)
			stall = &resultStallStore{Postgres: pg, stalled: make(chan struct{}, 1), release: make(chan struct{})}
			o.Store = stall
		}
	}, false)
	a, b := gws[0], gws[1]
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ca, cb := client.New(a.ts.URL, "tml-saved"), client.New(b.ts.URL, "tml-saved")
	sess, err := ca.CreateSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tc, err := ca.CreateLoraTrainingClient(ctx, sess, 0, base, 4)
	if err != nil {
		t.Fatal(err)
	}
	batch := []api.Datum{datum([]int{3, 14, 15, 92, 65, 35}, true)}
	step := func() (*client.Future, *client.Future) {
		fb, err := tc.ForwardBackward(ctx, batch, "cross_entropy", nil, false)
		if err != nil {
			t.Fatal(err)
		}
		op, err := tc.OptimStep(ctx, 1e-2)
		if err != nil {
			t.Fatal(err)
		}
		return fb, op
	}
	fb, op := step()
	if err := fb.Result(ctx, &api.ForwardBackwardOutput{}); err != nil {
		t.Fatal(err)
	}
	if got := stepOf(t, op, ctx); got != 1 {
		t.Fatalf("step %d", got)
	}
	stall.shut.Store(true)
	fb, op = step()
	select {
	case <-stall.stalled: // step 2 is saved; its result is not stored
	case <-ctx.Done():
		t.Fatal("the optim_step's result was never stored")
	}
	a.ts.CloseClientConnections()
	a.ts.Close()
	a.gw.Crash()
	if got := stepOf(t, cb.Future(op.RequestID), ctx); got != 2 {
		t.Fatalf("the saved step answered by the new gateway: step %d, want 2 (not taken twice)", got)
	}
	close(stall.release) // the dead gateway's result arrives late: refused
	tc.Via(cb)
	fb, op = step()
	if err := fb.Result(ctx, &api.ForwardBackwardOutput{}); err != nil {
		t.Fatal(err)
	}
	if got := stepOf(t, op, ctx); got != 3 {
		t.Fatalf("the next step: %d, want 3", got)
	}
}

// A forward_backward whose gradients were saved with the adapter (an eviction between its run
// and its result) when its gateway died: the gateway taking over only runs it forward, for its
// outputs, and does not accumulate its gradients a second time. The next optim_step's gradient
// norm is exactly that of the same two steps on a run that saw no failure.
func TestAForwardBackwardWhoseGradientsWereSavedIsNotAccumulatedTwice(t *testing.T) {
	var stall *resultStallStore
	gws, _ := startPGGatewaysOn(t, 2, func(o *gateway.Options) {
		if stall == nil {
			stall = &resultStallStore{Postgres: o.Store.(*store.Postgres), forwardBackward: true,
				stalled: make(chan struct{}, 1), release: make(chan struct{})}
			o.Store = stall
		}
	}, false)
	a, b := gws[0], gws[1]
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	batch := []api.Datum{datum([]int{3, 14, 15, 92, 65, 35}, true)}
	newRunOn := func(c *client.Client) *client.TrainingClient {
		sess, err := c.CreateSession(ctx)
		if err != nil {
			t.Fatal(err)
		}
		tc, err := c.CreateLoraTrainingClient(ctx, sess, 0, base, 4)
		if err != nil {
			t.Fatal(err)
		}
		return tc
	}
	fbOf := func(tc *client.TrainingClient) *client.Future {
		f, err := tc.ForwardBackward(ctx, batch, "cross_entropy", nil, false)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	optOf := func(tc *client.TrainingClient) map[string]float64 {
		f, err := tc.OptimStep(ctx, 1e-2)
		if err != nil {
			t.Fatal(err)
		}
		var out api.OptimStepResponse
		if err := f.Result(ctx, &out); err != nil {
			t.Fatal(err)
		}
		return out.Metrics
	}
	// The reference: the same two steps, no failure, on B.
	cb := client.New(b.ts.URL, "tml-ref")
	ref := newRunOn(cb)
	var want map[string]float64
	for range 2 {
		if err := fbOf(ref).Result(ctx, &api.ForwardBackwardOutput{}); err != nil {
			t.Fatal(err)
		}
		want = optOf(ref)
	}
	ca := client.New(a.ts.URL, "tml-saved-grads")
	tc := newRunOn(ca)
	if err := fbOf(tc).Result(ctx, &api.ForwardBackwardOutput{}); err != nil {
		t.Fatal(err)
	}
	optOf(tc)
	stall.shut.Store(true)
	fb := fbOf(tc)
	select {
	case <-stall.stalled: // its gradients are in the adapter; its result is not stored
	case <-ctx.Done():
		t.Fatal("the forward_backward's result was never stored")
	}
	// An eviction saves the adapter with those gradients before the gateway dies.
	if err := a.rep.Evict(ctx, a.gw.AdapterOf(tc.ModelID)); err != nil {
		t.Fatal(err)
	}
	a.ts.CloseClientConnections()
	a.ts.Close()
	a.gw.Crash()
	var out api.ForwardBackwardOutput
	if err := client.New(b.ts.URL, "tml-saved-grads").Future(fb.RequestID).Result(ctx, &out); err != nil || len(out.LossFnOutputs) != 1 {
		t.Fatalf("the forward_backward taken over: %+v %v", out, err)
	}
	close(stall.release)
	tc.Via(client.New(b.ts.URL, "tml-saved-grads"))
	got := optOf(tc)
	if got["step:max"] != 2 || math.Abs(got["grad_norm:mean"]-want["grad_norm:mean"]) > 1e-6*want["grad_norm:mean"] {
		t.Fatalf("step 2 after the takeover: %v; the same steps without a failure: %v (gradients counted twice?)", got, want)
	}
}
