package gateway_test

import (
	"context"
	"io"
	"net"
	"net/url"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/client"
	"github.com/skein-ai/skein/gateway"
)

// cuttableProxy forwards TCP connections to a target until cut: then it closes every connection
// and refuses new ones, as a partition between one gateway and PostgreSQL does; heal ends it.
type cuttableProxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	conns  []net.Conn
	cut    bool
}

func newCuttableProxy(t *testing.T, target string) *cuttableProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cuttableProxy{ln: ln, target: target}
	t.Cleanup(func() { ln.Close(); p.sever(true) })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			cut := p.cut
			p.mu.Unlock()
			if cut {
				c.Close()
				continue
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, up)
			p.mu.Unlock()
			go func() { _, _ = io.Copy(up, c); up.Close() }()
			go func() { _, _ = io.Copy(c, up); c.Close() }()
		}
	}()
	return p
}

// sever cuts (true) or heals (false) the link.
func (p *cuttableProxy) sever(cut bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = cut
	if cut {
		for _, c := range p.conns {
			c.Close()
		}
		p.conns = nil
	}
}

// The gateway that sequences a run loses PostgreSQL (not its replica, not its clients): it stops
// acknowledging the run's ops, the other gateway takes the run once the lease lapsed (epoch 2)
// and trains it on, every step's number exact and the losses an uninterrupted run's; healed, the
// cut-off gateway forwards the run's requests to the new holder and never acts on it again.
func TestAGatewayCutOffFromPostgresHandsItsRunOver(t *testing.T) {
	dsn := os.Getenv("SKEIN_TEST_POSTGRES")
	if dsn == "" {
		t.Skip("SKEIN_TEST_POSTGRES not set (.ci/run starts PostgreSQL and sets it)")
	}
	direct := dsn + "&search_path=" + newPGSchema(t, dsn)
	u, err := url.Parse(direct)
	if err != nil {
		t.Fatal(err)
	}
	proxy := newCuttableProxy(t, u.Host)
	u.Host = proxy.ln.Addr().String()
	const ttl = 2 * time.Second
	short := func(o *gateway.Options) { o.RunLeaseTTL = ttl }
	data := t.TempDir()
	a := startPGGateway(t, u.String(), data, 0, short, false)
	b := startPGGateway(t, direct, data, 1, short, false)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const tenant = "tml-cut-off"
	_, tc := newRun(t, a.ts.URL, tenant, 4)
	step := func(c *client.Client, n int) (float64, int) {
		fb, op, refused := seqStep(ctx, t, c, tc.ModelID, n)
		return seqResult(ctx, t, fb, op, n), refused
	}
	ca, cb := client.New(a.ts.URL, tenant), client.New(b.ts.URL, tenant)
	var losses []float64
	for n := 1; n <= 2; n++ {
		l, _ := step(ca, n)
		losses = append(losses, l)
	}
	proxy.sever(true)
	cut := time.Now()
	// The cut-off gateway acknowledges nothing of the run now: it cannot record a request.
	fseq := 5
	batch := []api.Datum{datum([]int{10, 20, 30, 40, 50, 60, 70}, true)}
	var ack struct {
		RequestID string `json:"request_id"`
	}
	if err := ca.Do(ctx, "POST", "forward_backward", api.ForwardBackwardJSON{ModelID: tc.ModelID, SeqID: &fseq,
		ForwardBackwardInput: &api.ForwardBackwardInput{Data: batch, LossFn: "cross_entropy"}}, &ack); err == nil {
		t.Fatalf("the gateway cut off from PostgreSQL acknowledged %s", ack.RequestID)
	}
	l3, refused := step(cb, 3) // refused (forwarded to the cut-off holder) until its lease lapses
	took := time.Since(cut)
	losses = append(losses, l3)
	lease, err := b.st.RunLeaseOf(ctx, tc.ModelID)
	if err != nil || lease.Addr != b.ts.URL || lease.Epoch != 2 {
		t.Fatalf("the run's lease after the cut: %+v %v, want the other gateway's at epoch 2", lease, err)
	}
	if took < ttl*3/4 {
		t.Fatalf("the other gateway served the run %v after the cut, before the holder's lease could lapse (%v)", took, ttl)
	}
	proxy.sever(false)
	l4, _ := step(ca, 4) // healed: forwarded to the new holder
	losses = append(losses, l4)
	if lease2, err := b.st.RunLeaseOf(ctx, tc.ModelID); err != nil || lease2.Epoch != 2 || lease2.Addr != b.ts.URL {
		t.Fatalf("after healing the lease is %+v (%v): the cut-off gateway took it back", lease2, err)
	}
	// The cut-off gateway's listing shows the run as its new holder left it, not as it last saw it.
	f, _ := submitSeq(ctx, t, cb, "save_weights", api.SaveWeightsRequest{ModelID: tc.ModelID, Path: "after-the-cut", SeqID: ptr(9)})
	if f == nil {
		t.Fatal("save_weights was not submitted")
	}
	var saved api.SaveWeightsResponse
	if err := f.Result(ctx, &saved); err != nil {
		t.Fatal(err)
	}
	var listed struct {
		TrainingRuns []api.TrainingRun `json:"training_runs"`
	}
	if err := ca.Do(ctx, "GET", "training_runs", nil, &listed); err != nil || len(listed.TrainingRuns) != 1 ||
		listed.TrainingRuns[0].LastCheckpoint == nil || listed.TrainingRuns[0].LastCheckpoint.TinkerPath != saved.Path {
		t.Fatalf("the cut-off gateway lists %+v (%v), want the run with its new holder's checkpoint %s", listed.TrainingRuns, err, saved.Path)
	}
	sameAsUninterrupted(t, tenant, losses)
	t.Logf("cut off from PostgreSQL: the other gateway served step 3 %v after the cut (lease %v), after %d refusals; epoch 1 -> 2", took.Round(10*time.Millisecond), ttl, refused)
}

func ptr(n int) *int { return &n }
