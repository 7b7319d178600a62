package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// A forward_backward that fails because its base model is not served (no replica of it, or its
// workers not registered yet) still consumes its seq_id: the run's next op is not stuck behind it.
func TestUnservedBaseModelConsumesTheSeqID(t *testing.T) {
	s, err := New(Options{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ts := httptest.NewServer(s)
	defer ts.Close()
	post := func(path string, body any) map[string]any {
		b, _ := json.Marshal(body)
		req, _ := http.NewRequest("POST", ts.URL+"/api/v1/"+path, bytes.NewReader(b))
		req.Header.Set("X-API-Key", "tml-gone")
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		out := map[string]any{"status": float64(resp.StatusCode)}
		_ = json.NewDecoder(resp.Body).Decode(&out)
		return out
	}
	tenant := ""
	{
		r, _ := http.NewRequest("GET", "/", nil)
		r.Header.Set("X-API-Key", "tml-gone")
		tenant, _ = tenantOf(r)
	}
	now := time.Now()
	run := &trainingRun{id: "sess-x:train:0", tenant: tenant, session: "sess-x", baseModel: "gone", created: now,
		lastRequest: now, ready: true, queue: newRunQueue(1)}
	s.runs.add(run.id, run)
	fb := post("forward_backward", map[string]any{"model_id": run.id, "seq_id": 1,
		"forward_backward_input": map[string]any{"loss_fn": "cross_entropy", "data": []any{}}})
	if fb["status"].(float64) != 400 {
		t.Fatalf("forward_backward on an unserved base model: %v", fb)
	}
	opt := post("optim_step", map[string]any{"model_id": run.id, "seq_id": 2, "adam_params": map[string]any{"learning_rate": 1e-3}})
	id, _ := opt["request_id"].(string)
	if id == "" {
		t.Fatalf("optim_step: %v", opt)
	}
	f, _ := s.futures.get(tenant, id)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if !s.futures.wait(f, 20*time.Second, ctx.Done()) {
		t.Fatal("seq 2 never ran: seq 1's failure did not consume its seq_id")
	}
}
