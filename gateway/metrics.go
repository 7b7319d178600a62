package gateway

import (
	"fmt"
	"maps"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/skein-ai/skein/replica"
)

// metrics are Prometheus counters kept by hand (no client library): a few numbers an operator
// needs, served as text at GET /metrics.
type metrics struct {
	ops         map[string]*opHist // by future kind
	mu          sync.Mutex
	requests    map[[2]string]int64 // endpoint, status class
	futures     map[[2]string]int64 // kind, outcome
	evictions   int64
	persistN    int64
	persistSecs float64
}

func (m *metrics) request(endpoint string, status int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.requests == nil {
		m.requests = map[[2]string]int64{}
	}
	m.requests[[2]string{endpoint, fmt.Sprintf("%dxx", status/100)}]++
}

// opBuckets are the upper bounds, in seconds, of the op-latency histogram: from a sample's
// milliseconds to a big forward_backward's minutes.
var opBuckets = []float64{0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 1800}

// opHist is one kind's latency histogram and tokens.
type opHist struct {
	counts []int64 // per bucket, not cumulative; the last is +Inf
	sum    float64
	n      int64
	tokens int64
}

// opDone records a finished op: its latency from submit to result, and the tokens it processed.
func (m *metrics) opDone(kind string, d time.Duration, tokens int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.ops == nil {
		m.ops = map[string]*opHist{}
	}
	h := m.ops[kind]
	if h == nil {
		h = &opHist{counts: make([]int64, len(opBuckets)+1)}
		m.ops[kind] = h
	}
	sec := d.Seconds()
	i := sort.SearchFloat64s(opBuckets, sec)
	h.counts[i]++
	h.sum += sec
	h.n++
	h.tokens += int64(tokens)
}

func (m *metrics) future(kind, outcome string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.futures == nil {
		m.futures = map[[2]string]int64{}
	}
	m.futures[[2]string{kind, outcome}]++
}

func (m *metrics) eviction() {
	m.mu.Lock()
	m.evictions++
	m.mu.Unlock()
}

func (m *metrics) persisted(d time.Duration) {
	m.mu.Lock()
	m.persistN++
	m.persistSecs += d.Seconds()
	m.mu.Unlock()
}

// statusRecorder remembers a handler's status for the request counter.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(s int) { r.status = s; r.ResponseWriter.WriteHeader(s) }

// Unwrap lets http.ResponseController reach the connection (write deadlines).
func (r *statusRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

func (s *Server) serveMetrics(w http.ResponseWriter, _ *http.Request) {
	var b strings.Builder
	m := &s.metrics
	m.mu.Lock()
	writeCounter := func(name, help string, rows map[[2]string]int64, l1, l2 string) {
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s counter\n", name, help, name)
		keys := make([][2]string, 0, len(rows))
		for k := range rows {
			keys = append(keys, k)
		}
		sort.Slice(keys, func(i, j int) bool { return keys[i][0]+keys[i][1] < keys[j][0]+keys[j][1] })
		for _, k := range keys {
			fmt.Fprintf(&b, "%s{%s=%q,%s=%q} %d\n", name, l1, k[0], l2, k[1], rows[k])
		}
	}
	writeCounter("skein_http_requests_total", "API requests by endpoint and status class.", m.requests, "endpoint", "code")
	writeCounter("skein_futures_total", "Finished requests by kind and outcome.", m.futures, "kind", "outcome")
	fmt.Fprintf(&b, "# HELP skein_evictions_total Adapters saved and evicted to free a LoRA slot.\n# TYPE skein_evictions_total counter\nskein_evictions_total %d\n", m.evictions)
	fmt.Fprintf(&b, "# HELP skein_adapter_persist_seconds Time to save adapter state before acknowledging a step.\n# TYPE skein_adapter_persist_seconds summary\nskein_adapter_persist_seconds_sum %g\nskein_adapter_persist_seconds_count %d\n", m.persistSecs, m.persistN)
	writeOps(&b, m.ops)
	m.mu.Unlock()
	fmt.Fprintf(&b, "# HELP skein_lora_slots LoRA slots of healthy replicas by base model and state.\n# TYPE skein_lora_slots gauge\n")
	for _, u := range s.router.Usage() {
		ep := u.Endpoint
		if !ep.Healthy() {
			continue
		}
		fmt.Fprintf(&b, "skein_lora_slots{replica=%q,base_model=%q,state=\"used\"} %d\n", ep.ID(), ep.BaseModel(), u.Held)
		fmt.Fprintf(&b, "skein_lora_slots{replica=%q,base_model=%q,state=\"free\"} %d\n", ep.ID(), ep.BaseModel(), ep.MaxLoras()-u.Held)
	}
	fmt.Fprintf(&b, "# HELP skein_replica_queue_depth Ops queued or running on a replica.\n# TYPE skein_replica_queue_depth gauge\n")
	for _, u := range s.router.Usage() {
		fmt.Fprintf(&b, "skein_replica_queue_depth{replica=%q} %d\n", u.Endpoint.ID(), u.Endpoint.QueueDepth())
	}
	s.writeBatchMetrics(&b)
	s.writeReplicaState(&b)
	s.writeSamplerMetrics(&b)
	w.Header().Set("Content-Type", "text/plain; version=0.0.4")
	_, _ = w.Write([]byte(b.String()))
}

// writeBatchMetrics writes how the replicas batch their work: sampling batches, the samples and
// the distinct weights (adapters) in them (rows and adapters per pass are the ratios to the
// batches), and how long each lane's ops waited for their turn.
func (s *Server) writeBatchMetrics(b *strings.Builder) {
	reps := s.allReplicas()
	sort.Slice(reps, func(i, j int) bool { return reps[i].ID() < reps[j].ID() })
	for _, m := range []struct {
		name, help string
		of         func(replica.SamplingStats) int64
	}{
		{"skein_sampling_batches_total", "Sampling batches (decode loops over every request taken together).", func(s replica.SamplingStats) int64 { return s.Batches }},
		{"skein_sampling_rows_total", "Samples decoded in sampling batches; per batch: rows per pass.", func(s replica.SamplingStats) int64 { return s.Rows }},
		{"skein_sampling_adapters_total", "Distinct weights (adapters, the base model) summed over sampling batches; per batch: adapters per pass.", func(s replica.SamplingStats) int64 { return s.Adapters }},
	} {
		fmt.Fprintf(b, "# HELP %s %s\n# TYPE %s counter\n", m.name, m.help, m.name)
		for _, r := range reps {
			fmt.Fprintf(b, "%s{replica=%q} %d\n", m.name, r.ID(), m.of(r.SamplingStats()))
		}
	}
	fmt.Fprintf(b, "# HELP skein_queue_wait_seconds Time ops waited on a replica before they ran, by lane (a tenant; \"sampling\": the shared sampling batches; \"placement\": loads and evictions).\n# TYPE skein_queue_wait_seconds summary\n")
	for _, r := range reps {
		waits := r.LaneWaits()
		lanes := slices.Sorted(maps.Keys(waits))
		for _, lane := range lanes {
			name := lane
			switch lane {
			case replica.SamplingLane:
				name = "sampling"
			case replica.PlacementLane:
				name = "placement"
			}
			w := waits[lane]
			fmt.Fprintf(b, "skein_queue_wait_seconds_sum{replica=%q,lane=%q} %g\nskein_queue_wait_seconds_count{replica=%q,lane=%q} %d\n", r.ID(), name, w.Seconds, r.ID(), name, w.Ops)
		}
	}
}

// writeOps writes the op-latency histograms and the tokens processed, by kind.
func writeOps(b *strings.Builder, ops map[string]*opHist) {
	kinds := slices.Sorted(maps.Keys(ops))
	fmt.Fprintf(b, "# HELP skein_op_seconds Time from an op's submit to its result, by kind (queue wait included).\n# TYPE skein_op_seconds histogram\n")
	for _, k := range kinds {
		h := ops[k]
		var cum int64
		for i, le := range opBuckets {
			cum += h.counts[i]
			fmt.Fprintf(b, "skein_op_seconds_bucket{kind=%q,le=\"%g\"} %d\n", k, le, cum)
		}
		fmt.Fprintf(b, "skein_op_seconds_bucket{kind=%q,le=\"+Inf\"} %d\nskein_op_seconds_sum{kind=%q} %g\nskein_op_seconds_count{kind=%q} %d\n", k, h.n, k, h.sum, k, h.n)
	}
	fmt.Fprintf(b, "# HELP skein_tokens_total Tokens processed by finished ops, by kind (trained or scored tokens; sampled tokens).\n# TYPE skein_tokens_total counter\n")
	for _, k := range kinds {
		fmt.Fprintf(b, "skein_tokens_total{kind=%q} %d\n", k, ops[k].tokens)
	}
}

// writeReplicaState writes what each replica is doing and holds: how long its current op has
// run (0: idle), and its resident weights and adapters (in-process replicas).
func (s *Server) writeReplicaState(b *strings.Builder) {
	reps := s.allReplicas()
	sort.Slice(reps, func(i, j int) bool { return reps[i].ID() < reps[j].ID() })
	fmt.Fprintf(b, "# HELP skein_replica_op_running_seconds How long the op running now on a replica has run (0: idle).\n# TYPE skein_replica_op_running_seconds gauge\n")
	for _, r := range reps {
		d, _ := r.Running()
		fmt.Fprintf(b, "skein_replica_op_running_seconds{replica=%q} %g\n", r.ID(), d.Seconds())
	}
	fmt.Fprintf(b, "# HELP skein_resident_bytes Memory of an in-process replica by kind: base weights (shared by the replicas of one model) and adapters (weights, gradients, optimizer state).\n# TYPE skein_resident_bytes gauge\n")
	for _, r := range reps {
		if w, a, ok := r.Resident(); ok {
			fmt.Fprintf(b, "skein_resident_bytes{replica=%q,kind=\"weights\"} %d\nskein_resident_bytes{replica=%q,kind=\"adapters\"} %d\n", r.ID(), w, r.ID(), a)
		}
	}
}
