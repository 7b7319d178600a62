package lab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/client"
)

// balancer is the one address the client reaches the gateways through, as a Service: round
// robin over the live ones; a request that found no gateway (refused, reset) or got a 5xx goes to
// the next, as the SDK retries. What still fails after 60 s of that is a failed request.
type balancer struct {
	mu      sync.Mutex
	clients []*client.Client
	next    int
	retried atomic.Int64
}

func (b *balancer) set(cs ...*client.Client) {
	b.mu.Lock()
	b.clients = cs
	b.mu.Unlock()
}

func (b *balancer) pick() *client.Client {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.next++
	return b.clients[b.next%len(b.clients)]
}

func (b *balancer) do(ctx context.Context, path string, body, out any) error {
	deadline := time.Now().Add(time.Minute)
	for {
		err := b.pick().Do(ctx, "POST", path, body, out)
		var se *client.StatusError
		if err == nil || (errors.As(err, &se) && se.Status < 500 && se.Status != http.StatusRequestTimeout) || time.Now().After(deadline) {
			return err
		}
		b.retried.Add(1)
		time.Sleep(100 * time.Millisecond)
	}
}

// result long-polls a future through the balancer until it ends.
func (b *balancer) result(ctx context.Context, id string, out any) error {
	for {
		var raw json.RawMessage
		err := b.do(ctx, "retrieve_future", api.RetrieveFutureRequest{RequestID: id}, &raw)
		var se *client.StatusError
		if errors.As(err, &se) && se.Status == http.StatusRequestTimeout {
			continue
		}
		if err != nil {
			return err
		}
		var probe struct {
			Type  string `json:"type"`
			Error string `json:"error"`
		}
		_ = json.Unmarshal(raw, &probe)
		switch {
		case probe.Type == "try_again":
			continue
		case probe.Error != "":
			return fmt.Errorf("request %s failed: %s", id, probe.Error)
		}
		return json.Unmarshal(raw, out)
	}
}

// A rolling upgrade of both gateway processes while a run trains for 40 steps on two workers,
// with sampling in between, through one address: a new gateway starts on a host of its own,
// joins, and an old one gets SIGTERM (it drains its requests, saves its runs' adapters and hands
// their leases back); twice. No request fails after the client's retries, every step's number is
// exact and the losses are an in-process replica's, bit for bit.
//
// It failed about 1 run in 8 until the handover race it found was fixed: a forward_backward a
// gateway acknowledged just before SIGTERM had its gradients reported lost at the next holder's
// optim_step, which had claimed the adapter left on the worker as it was, with a view of the run
// holding none (replica.ensure reloads such a copy now; gateway
// TestATakeOverReloadsTheCopyAStoppedGatewayLeftOnItsWorker).
func TestLabRollingRestartOfBothGateways(t *testing.T) {
	g := newGatewayLabWith(t, "gw3", "gw4")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	lb := &balancer{}
	lb.set(g.clients["gw1"], g.clients["gw2"])
	var sess api.CreateSessionResponse
	if err := lb.do(ctx, "create_session", api.CreateSessionRequest{Tags: []string{}, UserMetadata: api.UserMetadata{}}, &sess); err != nil {
		t.Fatal(err)
	}
	var created api.FutureResponse
	if err := lb.do(ctx, "create_model", api.CreateModelRequest{SessionID: sess.SessionID, BaseModel: modelName, LoraConfig: &api.LoraConfig{Rank: 4}}, &created); err != nil {
		t.Fatal(err)
	}
	var model api.CreateModelResponse
	if err := lb.result(ctx, created.RequestID, &model); err != nil {
		t.Fatal(err)
	}
	lr, b1, b2, eps, zero := 1e-2, 0.9, 0.95, 1e-8, 0.0
	const steps = 40
	var losses []float64
	samples := 0
	stepDone := make(chan int)
	trained := make(chan error, 1)
	go func() {
		for n := 1; n <= steps; n++ {
			fseq, oseq := 2*n-1, 2*n
			var fb, op api.FutureResponse
			if err := lb.do(ctx, "forward_backward", api.ForwardBackwardJSON{ModelID: model.ModelID, SeqID: &fseq,
				ForwardBackwardInput: &api.ForwardBackwardInput{Data: batch, LossFn: "cross_entropy"}}, &fb); err != nil {
				trained <- fmt.Errorf("step %d forward_backward: %w", n, err)
				return
			}
			if err := lb.do(ctx, "optim_step", api.OptimStepRequest{ModelID: model.ModelID, SeqID: &oseq,
				AdamParams: api.AdamParams{LearningRate: &lr, Beta1: &b1, Beta2: &b2, Eps: &eps, WeightDecay: &zero, GradClipNorm: &zero}}, &op); err != nil {
				trained <- fmt.Errorf("step %d optim_step: %w", n, err)
				return
			}
			var out api.ForwardBackwardOutput
			if err := lb.result(ctx, fb.RequestID, &out); err != nil {
				trained <- fmt.Errorf("step %d forward_backward result: %w", n, err)
				return
			}
			var st api.OptimStepResponse
			if err := lb.result(ctx, op.RequestID, &st); err != nil {
				trained <- fmt.Errorf("step %d optim_step result: %w", n, err)
				return
			}
			if got := int(st.Metrics["step:max"]); got != n {
				trained <- fmt.Errorf("step %d reported step %d", n, got)
				return
			}
			losses = append(losses, out.Metrics["loss:sum"])
			if n%4 == 0 { // sampling in between, from the base model
				one, four := 1, 4
				var sf api.FutureResponse
				if err := lb.do(ctx, "asample", api.SampleRequest{BaseModel: modelName, NumSamples: &one,
					Prompt:         api.ModelInput{Chunks: []api.Chunk{{Type: "encoded_text", Tokens: []int{11, 12, 13}}}},
					SamplingParams: api.SamplingParams{MaxTokens: &four}}, &sf); err != nil {
					trained <- fmt.Errorf("sample after step %d: %w", n, err)
					return
				}
				var so api.SampleResponse
				if err := lb.result(ctx, sf.RequestID, &so); err != nil || len(so.Sequences) != 1 {
					trained <- fmt.Errorf("sample after step %d: %+v %v", n, so, err)
					return
				}
				samples++
			}
			stepDone <- n
		}
		trained <- nil
	}()
	var done atomic.Int64
	replace := func(old, fresh, keep string) {
		from := done.Load()
		g.startGateway(fresh)
		lb.set(g.clients[keep], g.clients[fresh])
		if err := g.gws[old].Process.Signal(syscall.SIGTERM); err != nil {
			t.Error(err)
			return
		}
		err := g.gws[old].Wait()
		t.Logf("%s replaced by %s during steps %d to %d (%s exited: %v)", old, fresh, from+1, done.Load()+1, old, err)
	}
	var replacing sync.WaitGroup
	var trainErr error
	for finished := false; !finished; {
		select {
		case n := <-stepDone:
			done.Store(int64(n))
			switch n {
			case 8:
				replacing.Go(func() { replace("gw1", "gw3", "gw2") })
			case 24:
				replacing.Wait()
				replacing.Go(func() { replace("gw2", "gw4", "gw3") })
			}
		case trainErr = <-trained:
			finished = true
		}
	}
	replacing.Wait()
	if trainErr != nil {
		t.Fatalf("a request failed after retries: %v", trainErr)
	}
	want := reference(t, g.model, steps)
	for i := range want {
		if losses[i] != want[i] {
			t.Fatalf("step %d: loss %v through the rolling restart, %v uninterrupted (lab %v, reference %v)", i+1, losses[i], want[i], losses, want)
		}
	}
	t.Logf("%d steps and %d samples through a rolling restart of both gateway processes; %d requests retried", steps, samples, lb.retried.Load())
}
