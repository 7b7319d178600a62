package gateway_test

import (
	"context"
	"testing"

	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/client"
	"github.com/skein-ai/skein/gateway"
)

// seqStep sends step n of a run as lossStep trains it (the same batch and AdamW settings), with
// explicit seq_ids (forward_backward 2n-1, optim_step 2n) so that a retry through any gateway
// is the same op; each request is retried while it gets 5xx (submitSeq). It returns both
// futures (nil if a request failed otherwise) and how many answers were 5xx.
func seqStep(ctx context.Context, t *testing.T, c *client.Client, modelID string, n int) (fb, op *client.Future, refused int) {
	lr, b1, b2, eps, zero := 1e-2, 0.9, 0.95, 1e-8, 0.0
	fseq, oseq := 2*n-1, 2*n
	fb, r1 := submitSeq(ctx, t, c, "forward_backward", api.ForwardBackwardJSON{ModelID: modelID, SeqID: &fseq,
		ForwardBackwardInput: &api.ForwardBackwardInput{Data: []api.Datum{datum([]int{10, 20, 30, 40, 50, 60, 70}, true)}, LossFn: "cross_entropy"}})
	op, r2 := submitSeq(ctx, t, c, "optim_step", api.OptimStepRequest{ModelID: modelID, SeqID: &oseq,
		AdamParams: api.AdamParams{LearningRate: &lr, Beta1: &b1, Beta2: &b2, Eps: &eps, WeightDecay: &zero, GradClipNorm: &zero}})
	return fb, op, r1 + r2
}

// seqResult waits for step n's futures, checks that the step counted is n, and returns its loss.
func seqResult(ctx context.Context, t *testing.T, fb, op *client.Future, n int) float64 {
	t.Helper()
	if fb == nil || op == nil {
		t.Fatalf("step %d was not submitted", n)
	}
	var out api.ForwardBackwardOutput
	if err := fb.Result(ctx, &out); err != nil {
		t.Fatalf("step %d forward_backward: %v", n, err)
	}
	if got := stepOf(t, op, ctx); got != n {
		t.Fatalf("step %d reported step %d", n, got)
	}
	return out.Metrics["loss:sum"]
}

// sameAsUninterrupted checks losses, bit for bit, against the same steps (lossStep) of a new
// run on an in-process server that nothing interrupts.
func sameAsUninterrupted(t *testing.T, tenant string, losses []float64) {
	t.Helper()
	ref := newServer(t, gateway.Options{})
	_, rc := newRun(t, ref.URL, tenant, 4)
	for i := range losses {
		l, err := lossStep(t, rc)
		if err != nil {
			t.Fatal(err)
		}
		if l != losses[i] {
			t.Fatalf("step %d: loss %v here, %v uninterrupted (all: %v)", i+1, losses[i], l, losses)
		}
	}
}
