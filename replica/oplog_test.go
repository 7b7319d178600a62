package replica

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/skein-ai/skein/engine"
)

// lossyFake answers every pass with a loss, as a real engine does.
type lossyFake struct{ *fakeCompute }

func (f lossyFake) ForwardBatch(ctx context.Context, id string, b *engine.Batch, backward bool) (*engine.ForwardResult, error) {
	res, err := f.fakeCompute.ForwardBatch(ctx, id, b, backward)
	if res != nil {
		res.Loss = 2.5
	}
	return res, err
}

// Every finished op (forward_backward, forward, optim_step, a sampling batch) is one log line
// with its duration, tokens, tokens per second and loss where there is one: at info from
// opInfoAfter (1 s) on, when someone is waiting on it, and at debug below, so that a busy
// service's hundreds of short ops a second do not drown its log (issue 22).
func TestFinishedOpsAreLogged(t *testing.T) {
	for _, slow := range []bool{false, true} {
		old := opInfoAfter
		if slow {
			opInfoAfter = 0 // every op counts as long
		}
		var buf bytes.Buffer
		f := lossyFake{newFake()}
		r := New("r0", "base", f, 4)
		r.SetLogger(slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})))
		ctx := context.Background()
		a := Adapter{ID: "a", Lane: "t", State: &keeper{f: f.fakeCompute}}
		b := &engine.Batch{Data: []engine.Datum{{Tokens: []int{1, 2, 3}}, {Tokens: []int{4, 5}}}}
		if _, err := r.ForwardBackward(ctx, a, b); err != nil {
			t.Fatal(err)
		}
		if _, err := r.Forward(ctx, a, b, false); err != nil {
			t.Fatal(err)
		}
		if _, _, err := r.OptimStep(ctx, a, engine.AdamParams{}); err != nil {
			t.Fatal(err)
		}
		done := make(chan SampleOutcome, 1)
		if err := r.Sample(Weights{Lane: "t"}, SampleJob{Req: engine.SampleRequest{Prompt: []int{7, 8, 9}, NumSamples: 1},
			Done: func(o SampleOutcome) { done <- o }}); err != nil {
			t.Fatal(err)
		}
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Fatal("sample not answered")
		}
		r.Close()
		opInfoAfter = old

		ops := map[string]map[string]any{}
		for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
			var rec map[string]any
			if err := json.Unmarshal([]byte(l), &rec); err != nil {
				t.Fatalf("line %q: %v", l, err)
			}
			if op, ok := rec["op"].(string); ok {
				ops[op] = rec
			}
		}
		want := "DEBUG"
		if slow {
			want = "INFO"
		}
		for _, op := range []string{"forward_backward", "forward", "optim_step", "sample"} {
			rec := ops[op]
			if rec == nil {
				t.Errorf("slow %v: no line for %s in %s", slow, op, buf.String())
				continue
			}
			if rec["level"] != want || rec["seconds"] == nil || rec["replica"] != "r0" {
				t.Errorf("slow %v: %s logged %v, want level %s with seconds and replica", slow, op, rec, want)
			}
		}
		for _, op := range []string{"forward_backward", "forward"} {
			if rec := ops[op]; rec != nil && (rec["tokens"] != 5.0 || rec["loss_sum"] != 2.5 || rec["tokens_per_s"] == nil) {
				t.Errorf("%s: %v, want tokens 5, loss_sum 2.5 and tokens_per_s", op, rec)
			}
		}
		if rec := ops["sample"]; rec != nil && (rec["prompt_tokens"] != 3.0 || rec["tokens"] != 1.0) {
			t.Errorf("sample: %v, want prompt_tokens 3 and 1 token generated", rec)
		}
	}
}
