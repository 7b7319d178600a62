package gateway_test

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/skein-ai/skein/gateway"
)

// countingReader is an endless request body that counts what was read from it.
type countingReader struct{ n int }

func (c *countingReader) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = '{'
	}
	c.n += len(p)
	return len(p), nil
}

// --record reads a request body only as far as the handler does (within its size limit), never
// the whole of it first.
func TestRecorderReadsNoMoreThanTheHandler(t *testing.T) {
	const limit = 1 << 10
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
		http.Error(w, "too large: "+err.Error(), http.StatusRequestEntityTooLarge)
	})
	path := filepath.Join(t.TempDir(), "rec.jsonl")
	rec, err := gateway.Recorder(handler, path)
	if err != nil {
		t.Fatal(err)
	}
	body := &countingReader{}
	req := httptest.NewRequest("POST", "/api/v1/telemetry", io.LimitReader(body, 64<<20))
	w := httptest.NewRecorder()
	rec.ServeHTTP(w, req)
	if w.Code != http.StatusRequestEntityTooLarge {
		t.Fatalf("status %d", w.Code)
	}
	if body.n > 64<<10 {
		t.Fatalf("the recorder read %d bytes of the body; the handler's limit is %d", body.n, limit)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	if !sc.Scan() {
		t.Fatal("nothing recorded")
	}
	var ex gateway.Exchange
	if err := json.Unmarshal(sc.Bytes(), &ex); err != nil {
		t.Fatal(err)
	}
	if ex.Status != http.StatusRequestEntityTooLarge || len(ex.RequestBinary) > 64<<10 || !strings.HasPrefix(string(ex.RequestBinary), "{{") {
		t.Fatalf("recorded status %d, %d request bytes", ex.Status, len(ex.RequestBinary))
	}
}
