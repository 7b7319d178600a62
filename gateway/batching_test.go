package gateway_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/client"
)

// Samples of several tenants, each from its own adapter's sampler weights, and one from the base
// model, queued while another tenant's training op runs, are served together: one sampling batch
// of four rows over four weights, run inside the training op (at its first turn), before it ends.
// /metrics counts the batch, its rows and its adapters.
func TestSamplesOfManyTenantsShareOneBatch(t *testing.T) {
	e, g, rep, ts := gatedServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	type tenant struct {
		c       *client.Client
		session string
	}
	var tenants []tenant
	for i := range 3 {
		c, tc := newRun(t, ts.URL, fmt.Sprintf("tml-sampler-%d", i), 4)
		f, err := tc.SaveWeightsForSampler(ctx, "")
		if err != nil {
			t.Fatal(err)
		}
		var saved struct {
			SamplingSessionID string `json:"sampling_session_id"`
		}
		if err := f.Result(ctx, &saved); err != nil || saved.SamplingSessionID == "" {
			t.Fatalf("save for sampler: %v %+v", err, saved)
		}
		tenants = append(tenants, tenant{c, saved.SamplingSessionID})
	}
	tenants = append(tenants, tenant{client.New(ts.URL, "tml-base-sampler"), ""})

	_, heavy := newRun(t, ts.URL, "tml-heavy", 4)
	tf, err := heavy.ForwardBackward(ctx, []api.Datum{datum(e.Tokenizer.Encode("a long training op"), true)}, "cross_entropy", nil, false)
	if err != nil {
		t.Fatal(err)
	}
	for rep.QueueDepth() < 1 && ctx.Err() == nil { // the training op holds the replica, at the gate
		time.Sleep(time.Millisecond)
	}
	var samples []*client.Future
	for _, tn := range tenants {
		n, mt := 1, 3
		req := api.SampleRequest{SamplingSessionID: tn.session, NumSamples: &n,
			Prompt:         api.ModelInput{Chunks: []api.Chunk{{Tokens: []int{1, 2, 3}}}},
			SamplingParams: api.SamplingParams{MaxTokens: &mt}}
		if tn.session == "" {
			req.BaseModel = base
		}
		f, err := tn.c.Sample(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		samples = append(samples, f)
	}
	for rep.SamplingWaiting() < len(tenants) && ctx.Err() == nil {
		time.Sleep(time.Millisecond)
	}
	// While the op is held, /metrics shows it running, and what the replica holds.
	held := metricsText(t, ts.URL)
	if v := metricValue(t, held, `skein_replica_op_running_seconds{replica="r0"}`); v <= 0 {
		t.Errorf("the running op shows as %v s running", v)
	}
	if w, a := metricValue(t, held, `skein_resident_bytes{replica="r0",kind="weights"}`), metricValue(t, held, `skein_resident_bytes{replica="r0",kind="adapters"}`); w != float64(e.WeightBytes()) || a <= 0 {
		t.Errorf("resident weights %v (engine: %d), adapters %v", w, e.WeightBytes(), a)
	}
	g.gate <- struct{}{}
	sampled := 0 // a sample may stop early, at an end-of-sequence token
	for i, f := range samples {
		var res api.SampleResponse
		if err := f.Result(ctx, &res); err != nil || len(res.Sequences) != 1 || len(res.Sequences[0].Tokens) == 0 {
			t.Fatalf("tenant %d's sample: %v %+v", i, err, res)
		}
		sampled += len(res.Sequences[0].Tokens)
	}
	if err := tf.Result(ctx, nil); err != nil {
		t.Fatal(err)
	}
	body := metricsText(t, ts.URL)
	for _, want := range []string{`skein_op_seconds_count{kind="Sample"} 4`, fmt.Sprintf(`skein_tokens_total{kind="Sample"} %d`, sampled), `skein_sampling_batches_total{replica="r0"} 1`, `skein_sampling_rows_total{replica="r0"} 4`,
		`skein_sampling_adapters_total{replica="r0"} 4`, `skein_queue_wait_seconds_count{replica="r0",lane="sampling"} 1`,
		// Four one-sample prompts of three tokens: twelve positions asked for and computed.
		fmt.Sprintf(`skein_sampler_prompt_tokens_total{base_model=%q} 12`, base), fmt.Sprintf(`skein_sampler_prefill_tokens_total{base_model=%q} 12`, base)} {
		if !strings.Contains(body, want+"\n") {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if st := rep.SamplingStats(); st.Batches != 1 {
		t.Fatalf("%d sampling batches, want the four requests in one", st.Batches)
	}
}

// metricsText is GET /metrics.
func metricsText(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(body)
}

// metricValue is the value of one series in a /metrics text.
func metricValue(t *testing.T, text, series string) float64 {
	t.Helper()
	for _, line := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			var f float64
			if _, err := fmt.Sscan(v, &f); err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return f
		}
	}
	t.Fatalf("/metrics has no %s", series)
	return 0
}
