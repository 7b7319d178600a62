package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/client"
	"github.com/skein-ai/skein/engine"
	"github.com/skein-ai/skein/replica"
)

// GGUF exports are bounded, all tenants together: with every slot taken the next one is a 429
// and converts nothing.
func TestGGUFExportsAreBounded(t *testing.T) {
	dir := t.TempDir()
	if err := engine.InitTiny(dir, engine.ArchQwen3, "tiny", 1); err != nil {
		t.Fatal(err)
	}
	e, err := engine.Load(dir, engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rep := replica.New("r0", "tiny", e, 1)
	s, err := New(Options{DataDir: t.TempDir()}, rep)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(); rep.Close() })
	for i := range MaxGGUFExports {
		_, done, err := s.exports.acquire(fmt.Sprint("tenant", i))
		if err != nil {
			t.Fatal(err)
		}
		defer done()
	}
	rec := httptest.NewRecorder()
	_, err = s.downloadGGUF(rec, httptest.NewRequest("GET", "/", nil), &ckptMeta{BaseModel: "tiny", Path: "tinker://x/weights/y"})
	var he *httpError
	if !errors.As(err, &he) || he.status != http.StatusTooManyRequests {
		t.Fatalf("with every export slot taken: %v", err)
	}
	if rec.Body.Len() != 0 {
		t.Fatal("something was written")
	}
}

// stalledWriter is a client that stops reading its download: Write blocks until released.
type stalledWriter struct {
	header  http.Header
	once    sync.Once
	wrote   chan struct{}
	release chan struct{}
}

func newStalled() *stalledWriter {
	return &stalledWriter{header: http.Header{}, wrote: make(chan struct{}), release: make(chan struct{})}
}
func (w *stalledWriter) Header() http.Header { return w.header }
func (w *stalledWriter) WriteHeader(int)     {}
func (w *stalledWriter) Write(b []byte) (int, error) {
	w.once.Do(func() { close(w.wrote) })
	<-w.release
	return len(b), nil
}

// One tenant's stalled GGUF downloads do not hold the export slots: a slot is given back when
// the conversion is done, before the file is streamed, and a tenant converts one at a time, so
// another tenant's export goes through (issue 40, item 6: two unread downloads gave everyone
// else 429 for 30 minutes).
func TestGGUFExportSlotsAreFairAndFreedAfterConversion(t *testing.T) {
	dir := t.TempDir()
	if err := engine.InitTiny(dir, engine.ArchQwen3, "tiny", 1); err != nil {
		t.Fatal(err)
	}
	e, err := engine.Load(dir, engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rep := replica.New("r0", "tiny", e, 4)
	s, err := New(Options{DataDir: t.TempDir()}, rep)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(s)
	t.Cleanup(func() { hs.Close(); s.Close(); rep.Close() })
	ctx := context.Background()
	checkpointOf := func(key string) *ckptMeta {
		c := client.New(hs.URL, key)
		sess, err := c.CreateSession(ctx)
		if err != nil {
			t.Fatal(err)
		}
		no := false
		tc, err := c.CreateLoraTrainingClientConfig(ctx, sess, 0, "tiny", api.LoraConfig{Rank: 4, TrainUnembed: &no})
		if err != nil {
			t.Fatal(err)
		}
		f, _ := tc.SaveState(ctx, "g1")
		if err := f.Result(ctx, nil); err != nil {
			t.Fatal(err)
		}
		s.ckpts.mu.Lock()
		defer s.ckpts.mu.Unlock()
		for _, m := range s.ckpts.m {
			if strings.Contains(m.Path, tc.ModelID) {
				return m
			}
		}
		t.Fatal("no checkpoint")
		return nil
	}
	a, b := checkpointOf("tml-a"), checkpointOf("tml-b")
	if a.Owner == b.Owner {
		t.Fatal("one tenant")
	}
	req := httptest.NewRequest("GET", "/", nil)
	var stalled []*stalledWriter
	var wg sync.WaitGroup
	for range 2 {
		w := newStalled()
		stalled = append(stalled, w)
		wg.Go(func() {
			if _, err := s.downloadGGUF(w, req, a); err != nil {
				t.Errorf("tenant a's download: %v", err)
			}
		})
		select {
		case <-w.wrote:
		case <-time.After(time.Minute):
			t.Fatal("tenant a's download never started")
		}
	}
	rec := httptest.NewRecorder()
	if _, err := s.downloadGGUF(rec, req, b); err != nil || !bytes.HasPrefix(rec.Body.Bytes(), []byte("GGUF")) {
		t.Fatalf("tenant b's export while tenant a's two downloads stall: %v", err)
	}
	// What a tenant's stalled downloads hold is bounded too (their files): a third is a 429.
	var he *httpError
	if _, err := s.downloadGGUF(httptest.NewRecorder(), req, a); !errors.As(err, &he) || he.status != http.StatusTooManyRequests || !strings.Contains(he.msg, "downloading") {
		t.Fatalf("a third download of one tenant with two stalled: %v; want a 429", err)
	}
	for _, w := range stalled {
		close(w.release)
	}
	wg.Wait()
	// A tenant converts one at a time: with a's conversion running, a's next is a 429 and b's goes on.
	_, done, err := s.exports.acquire(a.Owner)
	if err != nil {
		t.Fatal(err)
	}
	defer done()
	_, err = s.downloadGGUF(httptest.NewRecorder(), req, a)
	if !errors.As(err, &he) || he.status != http.StatusTooManyRequests || !strings.Contains(he.msg, "export") {
		t.Fatalf("a second conversion of one tenant: %v; want a 429", err)
	}
	rec = httptest.NewRecorder()
	if _, err := s.downloadGGUF(rec, req, b); err != nil || !bytes.HasPrefix(rec.Body.Bytes(), []byte("GGUF")) {
		t.Fatalf("tenant b's export while tenant a converts: %v", err)
	}
}
