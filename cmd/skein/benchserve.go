package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/client"
)

// `skein bench serve` drives a running server over HTTP with a workload of tenants (issue 39
// item 5): RL groups (many prompts at once, each of several samples, over a shared instruction)
// and chat turns (a shared system prompt and a user turn of their own), arriving spread in time.
// It reports generated tokens/s, each request's latency (p50, p99), the prompt positions the
// server computed against those requested and served from its prefix cache (from /metrics,
// in-process replicas only), and the keys and values it held. Workload files are in workloads/.

// serveWorkload is a workload file.
type serveWorkload struct {
	// BaseModel is the model sampled ("": the server's first).
	BaseModel string `json:"base_model"`
	// Seed makes the prompts and the arrivals (the same seed: the same run).
	Seed int64 `json:"seed"`
	// Vocab: prompt tokens are drawn from [3, 3+Vocab) (default 400: within every model's
	// vocabulary, the tiny presets' too).
	Vocab   int              `json:"vocab"`
	Tenants []workloadTenant `json:"tenants"`
}

// workloadTenant is one tenant's stream of arrivals.
type workloadTenant struct {
	Name string `json:"name"`
	// Kind: "rl" (an arrival is a step: Prompts requests at once, NumSamples samples each) or
	// "chat" (an arrival is one request).
	Kind     string `json:"kind"`
	Arrivals int    `json:"arrivals"`
	// IntervalMS is the mean time between arrivals (exponential gaps: a Poisson stream).
	IntervalMS int `json:"interval_ms"`
	Prompts    int `json:"prompts"` // rl: prompts per step (default 1)
	NumSamples int `json:"num_samples"`
	// SharedPrefixTokens lead every prompt of the tenant (a chat's system prompt, an RL task's
	// instructions); PromptTokens follow, the prompt's own.
	SharedPrefixTokens int     `json:"shared_prefix_tokens"`
	PromptTokens       int     `json:"prompt_tokens"`
	MaxTokens          int     `json:"max_tokens"`
	Temperature        float64 `json:"temperature"`
}

// Bounds on a workload file: a typo should fail, not run for a day.
const (
	maxWorkloadBytes    = 1 << 20
	maxWorkloadTenants  = 64
	maxWorkloadArrivals = 100_000
	maxWorkloadPrompts  = 1024
	maxWorkloadTokens   = 1 << 17
	maxWorkloadInterval = 3_600_000 // an hour, in ms
	// The whole run's requests and prompt tokens: every prompt is drawn before the run starts
	// and every request waits in a goroutine of its own.
	maxWorkloadRequests     = 200_000
	maxWorkloadPromptTokens = 1 << 25
)

// readWorkload reads and checks a workload file, filling defaults.
func readWorkload(path string) (*serveWorkload, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxWorkloadBytes+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxWorkloadBytes {
		return nil, fmt.Errorf("workload %s: over %d bytes", path, maxWorkloadBytes)
	}
	var w serveWorkload
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&w); err != nil {
		return nil, fmt.Errorf("workload %s: %w", path, err)
	}
	if err := w.check(); err != nil {
		return nil, fmt.Errorf("workload %s: %w", path, err)
	}
	return &w, nil
}

func (w *serveWorkload) check() error {
	if w.Vocab == 0 {
		w.Vocab = 400
	}
	if w.Vocab < 1 || w.Vocab > 10_000_000 {
		return fmt.Errorf("vocab %d outside [1, 10000000]", w.Vocab)
	}
	if len(w.Tenants) == 0 || len(w.Tenants) > maxWorkloadTenants {
		return fmt.Errorf("%d tenants, want 1…%d", len(w.Tenants), maxWorkloadTenants)
	}
	names := map[string]bool{}
	in := func(v, lo, hi int) bool { return v >= lo && v <= hi }
	requests, tokens := 0, 0
	for i := range w.Tenants {
		t := &w.Tenants[i]
		if t.Name == "" || names[t.Name] || strings.ContainsFunc(t.Name, func(r rune) bool { return r < '!' || r > '~' }) {
			return fmt.Errorf("tenant %d: a name of printable ASCII, unique, is required (got %q)", i, t.Name)
		}
		names[t.Name] = true
		if t.Prompts == 0 {
			t.Prompts = 1
		}
		if t.NumSamples == 0 {
			t.NumSamples = 1
		}
		switch {
		case t.Kind != "rl" && t.Kind != "chat":
			return fmt.Errorf("tenant %s: kind %q, want rl or chat", t.Name, t.Kind)
		case !in(t.Arrivals, 1, maxWorkloadArrivals):
			return fmt.Errorf("tenant %s: arrivals %d outside [1, %d]", t.Name, t.Arrivals, maxWorkloadArrivals)
		case !in(t.IntervalMS, 0, maxWorkloadInterval):
			return fmt.Errorf("tenant %s: interval_ms %d outside [0, %d]", t.Name, t.IntervalMS, maxWorkloadInterval)
		case !in(t.Prompts, 1, maxWorkloadPrompts) || (t.Kind == "chat" && t.Prompts != 1):
			return fmt.Errorf("tenant %s: prompts %d outside [1, %d] (a chat turn is one prompt)", t.Name, t.Prompts, maxWorkloadPrompts)
		case !in(t.NumSamples, 1, 128):
			return fmt.Errorf("tenant %s: num_samples %d outside [1, 128]", t.Name, t.NumSamples)
		case !in(t.SharedPrefixTokens, 0, maxWorkloadTokens) || !in(t.PromptTokens, 0, maxWorkloadTokens) || t.SharedPrefixTokens+t.PromptTokens < 1:
			return fmt.Errorf("tenant %s: shared_prefix_tokens %d and prompt_tokens %d: each in [0, %d], at least one token in all", t.Name, t.SharedPrefixTokens, t.PromptTokens, maxWorkloadTokens)
		case !in(t.MaxTokens, 1, maxWorkloadTokens):
			return fmt.Errorf("tenant %s: max_tokens %d outside [1, %d]", t.Name, t.MaxTokens, maxWorkloadTokens)
		case math.IsNaN(t.Temperature) || t.Temperature < 0 || t.Temperature > 100:
			return fmt.Errorf("tenant %s: temperature %v outside [0, 100]", t.Name, t.Temperature)
		}
		requests += t.Arrivals * t.Prompts
		tokens += t.Arrivals * t.Prompts * t.PromptTokens
	}
	if requests > maxWorkloadRequests || tokens > maxWorkloadPromptTokens {
		return fmt.Errorf("%d requests and %d prompt tokens of their own in all, at most %d and %d", requests, tokens, maxWorkloadRequests, maxWorkloadPromptTokens)
	}
	return nil
}

// benchServeConfig is what `skein bench serve` was asked to do.
type benchServeConfig struct {
	url, workload, key, metricsKey string
	asJSON                         bool
	timeout                        time.Duration
}

func parseBenchServeFlags(args []string) (benchServeConfig, error) {
	var c benchServeConfig
	fs := flag.NewFlagSet("bench serve", flag.ContinueOnError)
	fs.StringVar(&c.url, "url", "http://127.0.0.1:8000", "the server's base URL")
	fs.StringVar(&c.workload, "workload", "", "workload `FILE` (JSON; workloads/*.json)")
	fs.StringVar(&c.key, "key", "", "API key of every tenant (default: tml-bench-NAME per tenant, which an open server takes as that tenant)")
	fs.StringVar(&c.metricsKey, "metrics-key", "", "key for /metrics (an admin key when the server runs --auth keys; default: --key)")
	fs.BoolVar(&c.asJSON, "json", false, "print one JSON object")
	fs.DurationVar(&c.timeout, "timeout", 30*time.Minute, "give up on the whole run after this long")
	if _, err := parseArgs(fs, args, "skein bench serve --workload FILE [flags]"); err != nil {
		return c, err
	}
	if c.workload == "" {
		return c, errors.New("--workload is required")
	}
	if c.timeout <= 0 {
		return c, fmt.Errorf("--timeout %v: must be positive", c.timeout)
	}
	return c, nil
}

// benchRequest is one finished request of the run.
type benchRequest struct {
	tenant    string
	latency   time.Duration
	generated int
	prompt    int // positions requested: its prompt × its samples
	cacheHits int // prompt_cache_hit_tokens
	err       error
}

func benchServe(args []string) error {
	c, err := parseBenchServeFlags(args)
	if err != nil {
		return err
	}
	w, err := readWorkload(c.workload)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	if w.BaseModel == "" {
		var caps api.ServerCapabilities
		if err := client.New(c.url, cmpOr(c.key, "tml-bench")).Do(ctx, http.MethodGet, "get_server_capabilities", nil, &caps); err != nil {
			return fmt.Errorf("asking the server its models: %w", err)
		}
		if len(caps.SupportedModels) == 0 {
			return errors.New("the server serves no model")
		}
		w.BaseModel = caps.SupportedModels[0].ModelName
	}
	metricsKey := cmpOr(c.metricsKey, c.key)
	before, err := scrapeSampler(ctx, c.url, metricsKey, w.BaseModel)
	if err != nil {
		return err
	}
	// The keys and values held, polled while the run goes (gauges: their peaks).
	var peakMu sync.Mutex
	var peakCache, peakLoops float64
	pollDone := make(chan struct{})
	pollCtx, stopPoll := context.WithCancel(ctx)
	go func() {
		defer close(pollDone)
		for {
			if m, err := scrapeSampler(pollCtx, c.url, metricsKey, w.BaseModel); err == nil {
				peakMu.Lock()
				peakCache, peakLoops = max(peakCache, m["skein_prefix_cache_bytes"]), max(peakLoops, m["skein_sampler_loop_kv_bytes"])
				peakMu.Unlock()
			}
			select {
			case <-pollCtx.Done():
				return
			case <-time.After(250 * time.Millisecond):
			}
		}
	}()
	start := time.Now()
	done := runWorkload(ctx, c, w)
	wall := time.Since(start)
	stopPoll()
	<-pollDone
	after, err := scrapeSampler(ctx, c.url, metricsKey, w.BaseModel)
	if err != nil {
		return err
	}
	res := benchServeReport(w, done, wall, before, after)
	// Polled every 250 ms (a shorter run may see none of its loops): the last reading counts too.
	res["kv_cache_peak_bytes"] = max(peakCache, after["skein_prefix_cache_bytes"])
	res["kv_loops_peak_bytes"] = peakLoops
	if c.asJSON {
		b, err := json.Marshal(res)
		if err != nil {
			return err
		}
		fmt.Fprintln(benchOutput, string(b))
	} else {
		for _, k := range slices.Sorted(maps.Keys(res)) {
			fmt.Fprintf(benchOutput, "%-40s %v\n", k, res[k])
		}
	}
	for _, r := range done {
		if r.err != nil {
			return fmt.Errorf("%d of %d requests failed; the first: %s: %w", countFailed(done), len(done), r.tenant, r.err)
		}
	}
	return nil
}

func countFailed(done []benchRequest) int {
	n := 0
	for _, r := range done {
		if r.err != nil {
			n++
		}
	}
	return n
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// runWorkload plays every tenant's arrivals at once and returns every request's outcome.
func runWorkload(ctx context.Context, c benchServeConfig, w *serveWorkload) []benchRequest {
	var mu sync.Mutex
	var done []benchRequest
	var wg sync.WaitGroup
	for ti, t := range w.Tenants {
		rng := rand.New(rand.NewPCG(uint64(w.Seed), uint64(ti)))
		tokens := func(n int) []int {
			out := make([]int, n)
			for i := range out {
				out[i] = 3 + rng.IntN(w.Vocab)
			}
			return out
		}
		shared := tokens(t.SharedPrefixTokens)
		// Every arrival's prompts and gaps are drawn here, before the run: the run's clock then
		// measures only the server.
		type arrival struct {
			at      time.Duration
			prompts [][]int
		}
		var plan []arrival
		var at time.Duration
		for range t.Arrivals {
			var a arrival
			for range t.Prompts {
				a.prompts = append(a.prompts, append(slices.Clone(shared), tokens(t.PromptTokens)...))
			}
			a.at = at
			plan = append(plan, a)
			at += time.Duration(rng.ExpFloat64() * float64(t.IntervalMS) * float64(time.Millisecond))
		}
		cl := client.New(c.url, cmpOr(c.key, "tml-bench-"+t.Name))
		cl.HTTP.Timeout = c.timeout
		start := time.Now()
		for _, a := range plan {
			for _, p := range a.prompts {
				wg.Add(1)
				go func() {
					defer wg.Done()
					select {
					case <-time.After(time.Until(start.Add(a.at))):
					case <-ctx.Done():
					}
					r := sampleOnce(ctx, cl, w.BaseModel, t, p)
					mu.Lock()
					done = append(done, r)
					mu.Unlock()
				}()
			}
		}
	}
	wg.Wait()
	return done
}

// sampleOnce sends one sampling request and waits for its answer.
func sampleOnce(ctx context.Context, cl *client.Client, base string, t workloadTenant, prompt []int) benchRequest {
	r := benchRequest{tenant: t.Name, prompt: len(prompt) * t.NumSamples}
	n, mt, temp := t.NumSamples, t.MaxTokens, t.Temperature
	start := time.Now()
	f, err := cl.Sample(ctx, api.SampleRequest{BaseModel: base, NumSamples: &n,
		Prompt:         api.ModelInput{Chunks: []api.Chunk{{Tokens: prompt}}},
		SamplingParams: api.SamplingParams{MaxTokens: &mt, Temperature: &temp}})
	if err != nil {
		r.err = err
		return r
	}
	var res api.SampleResponse
	if err := f.Result(ctx, &res); err != nil {
		r.err = err
		return r
	}
	r.latency = time.Since(start)
	for _, s := range res.Sequences {
		r.generated += len(s.Tokens)
	}
	r.cacheHits = res.PromptCacheHitTokens
	return r
}

// scrapeSampler reads the sampler's series of base model base from /metrics (name → value).
func scrapeSampler(ctx context.Context, url, key, base string) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(url, "/")+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	if key != "" {
		req.Header.Set("X-API-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("reading /metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("reading /metrics: %s (with --auth keys, pass an admin key as --metrics-key)", resp.Status)
	}
	out := map[string]float64{}
	label := fmt.Sprintf("{base_model=%q}", base)
	sc := bufio.NewScanner(io.LimitReader(resp.Body, 64<<20))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "skein_sampler_") && !strings.HasPrefix(line, "skein_prefix_cache_") {
			continue
		}
		name, rest, ok := strings.Cut(line, label+" ")
		if !ok {
			continue
		}
		if v, err := strconv.ParseFloat(rest, 64); err == nil {
			out[name] = v
		}
	}
	return out, sc.Err()
}

// benchServeReport is the run's figures: over all requests and per tenant.
func benchServeReport(w *serveWorkload, done []benchRequest, wall time.Duration, before, after map[string]float64) map[string]float64 {
	res := map[string]float64{"wall_s": wall.Seconds(), "requests": float64(len(done)), "failed": float64(countFailed(done))}
	var generated, prompt, hits int
	var all []time.Duration
	per := map[string][]time.Duration{}
	for _, r := range done {
		if r.err != nil {
			continue
		}
		generated += r.generated
		prompt += r.prompt
		hits += r.cacheHits
		all = append(all, r.latency)
		per[r.tenant] = append(per[r.tenant], r.latency)
	}
	res["generated_tokens"] = float64(generated)
	res["tokens_per_s"] = float64(generated) / wall.Seconds()
	res["latency_p50_s"], res["latency_p99_s"] = percentile(all, 0.5), percentile(all, 0.99)
	for _, t := range w.Tenants {
		res["latency_p50_s."+t.Name], res["latency_p99_s."+t.Name] = percentile(per[t.Name], 0.5), percentile(per[t.Name], 0.99)
	}
	res["prompt_tokens_requested"] = float64(prompt)
	res["prompt_cache_hit_tokens"] = float64(hits) // as the answers count them
	for _, k := range []string{"skein_sampler_prompt_tokens_total", "skein_sampler_prefill_tokens_total", "skein_sampler_cached_tokens_total",
		"skein_prefix_cache_lookups_total", "skein_prefix_cache_hits_total", "skein_prefix_cache_evictions_total"} {
		res[strings.TrimPrefix(k, "skein_")] = after[k] - before[k] // the server's, in-process replicas only
	}
	res["kv_cache_bytes"], res["kv_cache_cap_bytes"] = after["skein_prefix_cache_bytes"], after["skein_prefix_cache_cap_bytes"]
	return res
}

// percentile is the q-quantile of ds (nearest rank), in seconds; 0 for none.
func percentile(ds []time.Duration, q float64) float64 {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))].Seconds()
}
