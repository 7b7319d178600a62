package gateway_test

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/client"
	"github.com/skein-ai/skein/engine"
	"github.com/skein-ai/skein/gateway"
	"github.com/skein-ai/skein/replica"
)

// What a run may buffer ahead of its next seq_id is bounded in count: past it the request is
// refused with a 429 that names the limit and consumes nothing (the same seq_id is accepted once
// the queue drains), while the missing next seq_id is always let in.
func TestRunQueueBoundsBufferedRequests(t *testing.T) {
	ts := newServer(t, gateway.Options{MaxRunQueueOps: 3})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, tc := newRun(t, ts.URL, "tml-ahead", 4)
	data := []api.Datum{datum(ts.eng.Tokenizer.Encode("far ahead of the next one"), true)}
	var futures []*client.Future
	for seq := 3; seq <= 5; seq++ {
		f, err := tc.ForwardBackwardSeq(ctx, seq, data, "cross_entropy", nil, true)
		if err != nil {
			t.Fatalf("seq %d within the bound: %v", seq, err)
		}
		futures = append(futures, f)
	}
	_, err := tc.ForwardBackwardSeq(ctx, 6, data, "cross_entropy", nil, true)
	if !isStatus(err, 429) || !strings.Contains(err.Error(), "limit 3") {
		t.Fatalf("seq 6 past the bound: want 429 naming the limit, got %v", err)
	}
	for seq := 1; seq <= 2; seq++ {
		f, err := tc.ForwardBackwardSeq(ctx, seq, data, "cross_entropy", nil, true)
		if err != nil {
			t.Fatalf("the missing seq %d must be let in: %v", seq, err)
		}
		futures = append(futures, f)
	}
	for i, f := range futures {
		var out api.ForwardBackwardOutput
		if err := f.Result(ctx, &out); err != nil {
			t.Fatalf("future %d: %v", i, err)
		}
	}
	f, err := tc.ForwardBackwardSeq(ctx, 6, data, "cross_entropy", nil, true)
	if err != nil {
		t.Fatalf("seq 6 again once the queue drained: %v", err)
	}
	var out api.ForwardBackwardOutput
	if err := f.Result(ctx, &out); err != nil {
		t.Fatal(err)
	}
}

// The buffered bytes are bounded too.
func TestRunQueueBoundsBufferedBytes(t *testing.T) {
	ts := newServer(t, gateway.Options{MaxRunQueueBytes: 64})
	ctx := context.Background()
	_, tc := newRun(t, ts.URL, "tml-bytes", 4)
	data := []api.Datum{datum(ts.eng.Tokenizer.Encode("a request body of more than sixty-four bytes"), true)}
	if _, err := tc.ForwardBackwardSeq(ctx, 5, data, "cross_entropy", nil, true); err != nil {
		t.Fatalf("one request alone is let in whatever its size: %v", err)
	}
	_, err := tc.ForwardBackwardSeq(ctx, 6, data, "cross_entropy", nil, true)
	if !isStatus(err, 429) || !strings.Contains(err.Error(), "limit 64") {
		t.Fatalf("second buffered request past the byte bound: want 429 naming the limit, got %v", err)
	}
}

// A sequenced request that fails after its seq_id is known (here a sparse tensor whose shape
// overflows when multiplied out) still consumes its seq_id: the run's next op runs.
func TestFailedSequencedRequestConsumesItsSeqID(t *testing.T) {
	ts := newServer(t, gateway.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, tc := newRun(t, ts.URL, "tml-overflow", 4)
	c.JSONForwardBackward = true
	ids := ts.eng.Tokenizer.Encode("sparse overflow")
	bad := datum(ids, false)
	bad.LossFnInputs["weights"] = api.TensorData{DType: "float32", Shape: []int{2, 1 << 62},
		SparseCrowIndices: []int{0, 0, 0}, SparseColIndices: []int{}, Data: []float64{}}
	_, err := tc.ForwardBackwardSeq(ctx, 1, []api.Datum{bad}, "cross_entropy", nil, false)
	if err == nil {
		t.Fatal("a sparse tensor with an overflowing shape was accepted")
	}
	f, err := tc.ForwardBackwardSeq(ctx, 2, []api.Datum{datum(ids, true)}, "cross_entropy", nil, true)
	if err != nil {
		t.Fatal(err)
	}
	var out api.ForwardBackwardOutput
	if err := f.Result(ctx, &out); err != nil {
		t.Fatalf("seq 2 after a failed seq 1: %v", err)
	}
}

// panicOnce is the tiny engine, except that its first forward_backward panics (a compute bug).
type panicOnce struct {
	*engine.Engine
	fired atomic.Bool
}

func (p *panicOnce) ForwardBatch(ctx context.Context, id string, b *engine.Batch, backward bool) (*engine.ForwardResult, error) {
	if backward && !p.fired.Swap(true) {
		panic("compute bug")
	}
	return p.Engine.ForwardBatch(ctx, id, b, backward)
}

// serverOver serves one replica over the given compute.
func serverOver(t *testing.T, compute engine.Compute, opts gateway.Options) *httptest.Server {
	t.Helper()
	rep := replica.New("r0", base, compute, 0)
	opts.DataDir = t.TempDir()
	gw, err := gateway.New(opts, rep)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(gw)
	t.Cleanup(func() { ts.Close(); gw.Close(); rep.Close() })
	return ts
}

// A sequenced op that panics while it runs ends its own future with an error; the replica and
// the run's later ops go on.
func TestPanickingOpFailsItsFutureAndTheRunGoesOn(t *testing.T) {
	e, err := engine.Load(modelDir(), engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ts := serverOver(t, &panicOnce{Engine: e}, gateway.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, tc := newRun(t, ts.URL, "tml-panic", 4)
	data := []api.Datum{datum(e.Tokenizer.Encode("a compute bug"), true)}
	f1, err := tc.ForwardBackward(ctx, data, "cross_entropy", nil, false)
	if err != nil {
		t.Fatal(err)
	}
	f2, err := tc.ForwardBackward(ctx, data, "cross_entropy", nil, false)
	if err != nil {
		t.Fatal(err)
	}
	var out api.ForwardBackwardOutput
	var failed *client.RequestFailed
	if err := f1.Result(ctx, &out); !errors.As(err, &failed) || !strings.Contains(failed.Message, "internal error") {
		t.Fatalf("the panicking op: want a failed future saying internal error, got %v", err)
	}
	if err := f2.Result(ctx, &out); err != nil {
		t.Fatalf("the op after it: %v", err)
	}
}

// One request's size is capped in datums and tokens (forward_backward) and in sampled tokens
// (asample), with a 400 that names the limit; requests within the caps run.
func TestRequestSizeCaps(t *testing.T) {
	ts := newServer(t, gateway.Options{MaxRequestDatums: 2, MaxRequestTokens: 24})
	ctx := context.Background()
	c, tc := newRun(t, ts.URL, "tml-big", 4)
	short := datum(ts.eng.Tokenizer.Encode("a short one"), true)
	long := make([]int, 30)
	for i := range long {
		long[i] = 5 + i
	}
	_, err := tc.ForwardBackward(ctx, []api.Datum{short, short, short}, "cross_entropy", nil, false)
	if !isStatus(err, 400) || !strings.Contains(err.Error(), "limit is 2") {
		t.Fatalf("3 datums over a cap of 2: want 400 naming the limit, got %v", err)
	}
	_, err = tc.ForwardBackward(ctx, []api.Datum{datum(long, true)}, "cross_entropy", nil, false)
	if !isStatus(err, 400) || !strings.Contains(err.Error(), "limit is 24") {
		t.Fatalf("29 tokens over a cap of 24: want 400 naming the limit, got %v", err)
	}
	f, err := tc.ForwardBackward(ctx, []api.Datum{short, short}, "cross_entropy", nil, false)
	if err != nil {
		t.Fatal(err)
	}
	var out api.ForwardBackwardOutput
	if err := f.Result(ctx, &out); err != nil {
		t.Fatal(err)
	}
	n, maxTokens := 4, 10
	_, err = c.Sample(ctx, api.SampleRequest{BaseModel: base, NumSamples: &n,
		Prompt:         api.ModelInput{Chunks: []api.Chunk{{Tokens: long[:3]}}},
		SamplingParams: api.SamplingParams{MaxTokens: &maxTokens}})
	if !isStatus(err, 400) || !strings.Contains(err.Error(), "limit is 24") {
		t.Fatalf("4 × (3 + 10) sampled tokens over a cap of 24: want 400 naming the limit, got %v", err)
	}
	n = 1
	sf, err := c.Sample(ctx, api.SampleRequest{BaseModel: base, NumSamples: &n,
		Prompt:         api.ModelInput{Chunks: []api.Chunk{{Tokens: long[:3]}}},
		SamplingParams: api.SamplingParams{MaxTokens: &maxTokens}})
	if err != nil {
		t.Fatal(err)
	}
	var so api.SampleResponse
	if err := sf.Result(ctx, &so); err != nil {
		t.Fatal(err)
	}
}

// gatedCompute is the tiny engine whose forward_backward waits for a token from gate: a stand-in
// for a long training op.
type gatedCompute struct {
	*engine.Engine
	gate chan struct{}
}

// LocalEngine makes the gated replica an in-process one (its model's files, its memory).
func (g *gatedCompute) LocalEngine() *engine.Engine { return g.Engine }

func (g *gatedCompute) ForwardBatch(ctx context.Context, id string, b *engine.Batch, backward bool) (*engine.ForwardResult, error) {
	if backward {
		<-g.gate
	}
	return g.Engine.ForwardBatch(ctx, id, b, backward)
}

// gatedServer is a gateway over one in-process replica "r0" whose forward_backward calls wait
// at g.gate; it is all closed when the test ends.
func gatedServer(t *testing.T) (*engine.Engine, *gatedCompute, *replica.Replica, *httptest.Server) {
	t.Helper()
	e, err := engine.Load(modelDir(), engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	g := &gatedCompute{Engine: e, gate: make(chan struct{})}
	rep := replica.New("r0", base, g, 8)
	gw, err := gateway.New(gateway.Options{DataDir: t.TempDir()}, rep)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(gw)
	t.Cleanup(func() { close(g.gate); ts.Close(); gw.Close(); rep.Close() })
	return e, g, rep, ts
}

// A replica shares its time between tenants: with one tenant's training ops queued on it (three
// runs, one long op each) another tenant's sample runs as soon as the op running now ends, not
// after all of them.
func TestReplicaSharesTimeBetweenTenants(t *testing.T) {
	e, g, rep, ts := gatedServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	data := []api.Datum{datum(e.Tokenizer.Encode("a long training op"), true)}
	var runs []*client.TrainingClient
	for range 3 {
		_, tc := newRun(t, ts.URL, "tml-heavy", 4)
		runs = append(runs, tc)
	}
	var training []*client.Future
	for _, tc := range runs {
		f, err := tc.ForwardBackward(ctx, data, "cross_entropy", nil, false)
		if err != nil {
			t.Fatal(err)
		}
		training = append(training, f)
	}
	waitDepth := func(n int) {
		for rep.QueueDepth() < n {
			if ctx.Err() != nil {
				t.Fatalf("queue depth %d, waiting for %d", rep.QueueDepth(), n)
			}
			time.Sleep(time.Millisecond)
		}
	}
	waitDepth(3) // one running (held at the gate), two queued behind it
	light := client.New(ts.URL, "tml-light")
	n, maxTokens := 1, 1
	sf, err := light.Sample(ctx, api.SampleRequest{BaseModel: base, NumSamples: &n,
		Prompt:         api.ModelInput{Chunks: []api.Chunk{{Tokens: []int{1, 2, 3}}}},
		SamplingParams: api.SamplingParams{MaxTokens: &maxTokens}})
	if err != nil {
		t.Fatal(err)
	}
	waitDepth(4)
	g.gate <- struct{}{} // the running training op ends; the sample must be next
	var so api.SampleResponse
	if err := sf.Result(ctx, &so); err != nil {
		t.Fatalf("the other tenant's sample waited behind the whole queue: %v", err)
	}
	// The sample's result is stored just before the replica counts its op finished: let the
	// count settle (the training ops cannot finish while the gate holds them).
	for rep.QueueDepth() > 2 && ctx.Err() == nil {
		time.Sleep(time.Millisecond)
	}
	if d := rep.QueueDepth(); d != 2 {
		t.Fatalf("queue depth %d after the sample, want the 2 training ops still queued", d)
	}
	g.gate <- struct{}{}
	g.gate <- struct{}{}
	for _, f := range training {
		var out api.ForwardBackwardOutput
		if err := f.Result(ctx, &out); err != nil {
			t.Fatal(err)
		}
	}
}

// Writing an answer has a deadline: a long-poll that outlives it loses its connection rather
// than holding it (here the deadline is set shorter than the long-poll to see it apply).
func TestAnswersAreWrittenWithinTheWriteTimeout(t *testing.T) {
	e, err := engine.Load(modelDir(), engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	g := &gatedCompute{Engine: e, gate: make(chan struct{})}
	defer close(g.gate)
	ts := serverOver(t, g, gateway.Options{LongPoll: 300 * time.Millisecond, WriteTimeout: 50 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, tc := newRun(t, ts.URL, "tml-slow", 4)
	f, err := tc.ForwardBackward(ctx, []api.Datum{datum(e.Tokenizer.Encode("held at the gate"), true)}, "cross_entropy", nil, false)
	if err != nil {
		t.Fatal(err)
	}
	var out api.ForwardBackwardOutput
	err = f.Result(ctx, &out)
	var se *client.StatusError
	if err == nil || errors.As(err, &se) || ctx.Err() != nil {
		t.Fatalf("a long-poll answered after the write deadline: want the connection cut, got %v", err)
	}
}

// tinyDatums is a batch of n two-token datums: a small body that decodes into far more memory
// (a slice, a map and tensors per datum).
func tinyDatums(ts *testServer, n int) []api.Datum {
	ids := ts.eng.Tokenizer.Encode("a tiny datum of a few tokens")[:3]
	data := make([]api.Datum, n)
	for i := range data {
		data[i] = datum(ids, true)
	}
	return data
}

// The run's byte bound counts what the decoded request holds, not its body: a protobuf body of
// a thousand tiny datums (~90 KB) holds a few MB once decoded.
func TestRunQueueCountsDecodedBytes(t *testing.T) {
	ts := newServer(t, gateway.Options{MaxRunQueueBytes: 1 << 20})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, tc := newRun(t, ts.URL, "tml-decoded", 4)
	data := tinyDatums(ts, 1000)
	if body := len(api.EncodeForwardBackwardRequest(&api.ForwardBackwardRequest{Input: api.ForwardBackwardInput{Data: data}})); body*4 > 1<<20 {
		t.Fatalf("test set-up: body of %d bytes is not small", body)
	}
	if _, err := tc.ForwardBackwardSeq(ctx, 5, data, "cross_entropy", nil, true); err != nil {
		t.Fatalf("one request alone: %v", err)
	}
	_, err := tc.ForwardBackwardSeq(ctx, 6, data, "cross_entropy", nil, true)
	if !isStatus(err, 429) || !strings.Contains(err.Error(), "limit 1048576") {
		t.Fatalf("a second buffered request holding MBs decoded under a 1 MiB bound: want 429, got %v", err)
	}
}

// Queued bytes are bounded per tenant (over all its runs) and in total (over all tenants), so
// that many runs or many tenants cannot add up to unbounded memory. A refused request consumes
// nothing: the same seq_id is accepted once there is room, and a run's next seq_id always is.
func TestQueuedBytesAreBoundedPerTenantAndInTotal(t *testing.T) {
	const mb = 1 << 20
	ts := newServer(t, gateway.Options{MaxRunQueueBytes: -1, MaxTenantQueueBytes: 3 * mb, MaxTotalQueueBytes: 5 * mb})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	data := tinyDatums(ts, 1000) // about 2.2 MB decoded
	c, a1 := newRun(t, ts.URL, "tml-qa", 4)
	sess, err := c.CreateSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	a2, err := c.CreateLoraTrainingClient(ctx, sess, 0, base, 4)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a1.ForwardBackwardSeq(ctx, 5, data, "cross_entropy", nil, true); err != nil {
		t.Fatalf("first buffered request of the tenant: %v", err)
	}
	_, err = a2.ForwardBackwardSeq(ctx, 5, data, "cross_entropy", nil, true)
	if !isStatus(err, 429) || !strings.Contains(err.Error(), "per tenant") {
		t.Fatalf("the tenant's second run past the tenant bound: want 429 naming it, got %v", err)
	}
	_, b := newRun(t, ts.URL, "tml-qb", 4)
	if _, err := b.ForwardBackwardSeq(ctx, 5, data, "cross_entropy", nil, true); err != nil {
		t.Fatalf("another tenant within the total: %v", err)
	}
	_, cc := newRun(t, ts.URL, "tml-qc", 4)
	_, err = cc.ForwardBackwardSeq(ctx, 5, data, "cross_entropy", nil, true)
	if !isStatus(err, 429) || !strings.Contains(err.Error(), "total_queue_bytes") {
		t.Fatalf("a third tenant past the server's total: want 429 naming it, got %v", err)
	}
	// The next seq_id is let in over the bounds: it runs now and releases what waits for it.
	small := []api.Datum{datum(ts.eng.Tokenizer.Encode("next one"), true)}
	var fs []*client.Future
	for seq := 1; seq <= 4; seq++ {
		f, err := a1.ForwardBackwardSeq(ctx, seq, small, "cross_entropy", nil, true)
		if err != nil {
			t.Fatalf("run a1's next seq_id %d: %v", seq, err)
		}
		fs = append(fs, f)
	}
	for _, f := range fs {
		if err := f.Result(ctx, nil); err != nil {
			t.Fatal(err)
		}
	}
	// a1's seq 5 has run (its future is done once seq 1-4 are): the tenant holds nothing now.
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err = a2.ForwardBackwardSeq(ctx, 5, data, "cross_entropy", nil, true)
		if err == nil || !isStatus(err, 429) || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("run a2's refused seq 5, once the tenant's queue drained: %v", err)
	}
}

// user_metadata and tags are capped where they are accepted (create_session, create_model): too
// many keys or tags, too long ones, or too many bytes in all get a 400 naming the limit, and
// nothing is created.
func TestMetadataAndTagsAreCapped(t *testing.T) {
	ts := newServer(t, gateway.Options{})
	ctx := context.Background()
	c := client.New(ts.URL, "tml-meta")
	many := map[string]any{}
	for i := range 10000 {
		many[fmt.Sprint("k", i)] = i
	}
	long := strings.Repeat("x", 1<<20)
	tooMany := make([]string, 1000)
	for name, body := range map[string]map[string]any{
		"many keys":  {"tags": []string{}, "user_metadata": many},
		"big value":  {"tags": []string{}, "user_metadata": map[string]any{"a": long}},
		"long key":   {"tags": []string{}, "user_metadata": map[string]any{long: 1}},
		"many tags":  {"tags": tooMany, "user_metadata": map[string]any{}},
		"a long tag": {"tags": []string{long}, "user_metadata": map[string]any{}},
	} {
		body["type"] = "create_session"
		err := c.Do(ctx, "POST", "create_session", body, nil)
		if !isStatus(err, 400) || !strings.Contains(err.Error(), "limit") {
			t.Errorf("create_session with %s: want a 400 naming the limit, got %v", name, err)
		}
	}
	var list api.SessionsResponse
	if err := c.Do(ctx, "GET", "sessions", nil, &list); err != nil || len(list.Sessions) != 0 {
		t.Fatalf("refused sessions were created: %v %v", list.Sessions, err)
	}
	sess, err := c.CreateSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	err = c.Do(ctx, "POST", "create_model", map[string]any{"session_id": sess, "model_seq_id": 0, "base_model": base,
		"user_metadata": many, "lora_config": map[string]any{"rank": 4}}, nil)
	if !isStatus(err, 400) || !strings.Contains(err.Error(), "limit") {
		t.Fatalf("create_model with too much user_metadata: want a 400 naming the limit, got %v", err)
	}
}

// blockFirst is the tiny engine, except that its first forward pass waits for release.
type blockFirst struct {
	*engine.Engine
	started, release chan struct{}
	once             atomic.Bool
}

func (b *blockFirst) ForwardBatch(ctx context.Context, id string, batch *engine.Batch, backward bool) (*engine.ForwardResult, error) {
	if !b.once.Swap(true) {
		close(b.started)
		<-b.release
	}
	return b.Engine.ForwardBatch(ctx, id, batch, backward)
}

// Requests sent in order while the run's op is busy wait their turn in the run's queue: they are
// held to its bounds too (only a next seq_id that releases buffered ones is let in over them).
func TestInOrderRequestsAreBoundedWhileTheRunIsBusy(t *testing.T) {
	e, err := engine.Load(modelDir(), engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	bf := &blockFirst{Engine: e, started: make(chan struct{}), release: make(chan struct{})}
	ts := serverOver(t, bf, gateway.Options{MaxRunQueueOps: 2})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, tc := newRun(t, ts.URL, "tml-busy", 4)
	data := []api.Datum{datum([]int{10, 20, 30, 40}, true)}
	first, err := tc.ForwardBackwardSeq(ctx, 1, data, "cross_entropy", nil, true)
	if err != nil {
		t.Fatal(err)
	}
	<-bf.started
	var fs []*client.Future
	for seq := 2; seq <= 3; seq++ {
		f, err := tc.ForwardBackwardSeq(ctx, seq, data, "cross_entropy", nil, true)
		if err != nil {
			t.Fatalf("seq %d within the bound: %v", seq, err)
		}
		fs = append(fs, f)
	}
	_, err = tc.ForwardBackwardSeq(ctx, 4, data, "cross_entropy", nil, true)
	close(bf.release)
	if !isStatus(err, 429) || !strings.Contains(err.Error(), "limit 2") {
		t.Fatalf("seq 4 waiting behind two while the run is busy: want 429 naming the limit, got %v", err)
	}
	for _, f := range append(fs, first) {
		if err := f.Result(ctx, nil); err != nil {
			t.Fatal(err)
		}
	}
	f, err := tc.ForwardBackwardSeq(ctx, 4, data, "cross_entropy", nil, true)
	if err != nil {
		t.Fatalf("seq 4 again, once the queue drained: %v", err)
	}
	if err := f.Result(ctx, nil); err != nil {
		t.Fatal(err)
	}
}

// Unloading a run ends the requests buffered ahead of its next seq_id (they can never run) and
// gives back what they held, rather than keeping them until the run is forgotten.
func TestUnloadEndsBufferedRequests(t *testing.T) {
	const mb = 1 << 20
	ts := newServer(t, gateway.Options{MaxTenantQueueBytes: 3 * mb})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, tc := newRun(t, ts.URL, "tml-unload", 4)
	data := tinyDatums(ts, 1000) // about 2.2 MB decoded
	f, err := tc.ForwardBackwardSeq(ctx, 5, data, "cross_entropy", nil, true)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Do(ctx, "POST", "unload_model", map[string]any{"model_id": tc.ModelID}, nil); err != nil {
		t.Fatal(err)
	}
	if err := f.Result(ctx, nil); err == nil || !strings.Contains(err.Error(), "unloaded") {
		t.Fatalf("a buffered request of an unloaded model: want it failed saying so, got %v", err)
	}
	sess, err := c.CreateSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	other, err := c.CreateLoraTrainingClient(ctx, sess, 0, base, 4)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.ForwardBackwardSeq(ctx, 5, data, "cross_entropy", nil, true); err != nil {
		t.Fatalf("the unloaded run's buffered bytes were not given back: %v", err)
	}
}
