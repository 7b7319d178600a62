package gateway

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sort"
	"testing"
	"time"
)

// benchServer is a gateway with no models: these benchmarks measure the gateway's own cost.
func benchServer(b *testing.B) (*Server, *httptest.Server) {
	s, err := New(Options{DataDir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	ts := httptest.NewServer(s)
	b.Cleanup(func() { ts.Close(); s.Close() })
	return s, ts
}

func retrieve(b *testing.B, c *http.Client, url, id string) {
	body, _ := json.Marshal(map[string]any{"request_id": id})
	req, _ := http.NewRequest("POST", url+"/api/v1/retrieve_future", bytes.NewReader(body))
	req.Header.Set("X-API-Key", "tml-bench")
	resp, err := c.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	resp.Body.Close()
	if resp.StatusCode != 200 || out["model_id"] != "m" {
		b.Fatalf("retrieve: %d %v", resp.StatusCode, out)
	}
}

// retrieve_future round trips on a future that is already complete (keep-alive HTTP/1.1).
func BenchmarkRetrieveCompletedFuture(b *testing.B) {
	s, ts := benchServer(b)
	tenant, _ := tenantOf(&http.Request{Header: http.Header{"X-Api-Key": {"tml-bench"}}})
	f, _, _ := s.futures.create(tenant, "CreateModel", "")
	s.futures.complete(f, map[string]any{"model_id": "m"})
	c := ts.Client()
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			retrieve(b, c, ts.URL, f.id)
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
}

// Time from a result being stored to the long-poll that waits for it returning to the client.
func BenchmarkLongPollWake(b *testing.B) {
	s, ts := benchServer(b)
	tenant, _ := tenantOf(&http.Request{Header: http.Header{"X-Api-Key": {"tml-bench"}}})
	c := ts.Client()
	lat := make([]time.Duration, 0, b.N)
	for range b.N {
		f, _, _ := s.futures.create(tenant, "CreateModel", "")
		done := make(chan time.Time)
		go func() {
			retrieve(b, c, ts.URL, f.id)
			done <- time.Now()
		}()
		// Wait until the poll is parked on the future, then complete it.
		for s.futures.waiters(f) == 0 {
			time.Sleep(20 * time.Microsecond)
		}
		start := time.Now()
		s.futures.complete(f, map[string]any{"model_id": "m"})
		lat = append(lat, (<-done).Sub(start))
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}
