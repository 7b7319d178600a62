package gateway_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/client"
	"github.com/skein-ai/skein/engine"
	"github.com/skein-ai/skein/gateway"
	"github.com/skein-ai/skein/replica"
	"github.com/skein-ai/skein/storage"
)

// An OpenAI request over the body limit gets a 413 that a client sending its whole body before
// reading (curl, requests, most SDKs) can read: the server reads and discards the rest of the
// body (up to gateway.MaxDiscardBytes) before answering, instead of closing a connection with
// unread bytes, which resets it and loses the answer (issue 40, item 16).
func TestOversizedBodyGetsAReadable413(t *testing.T) {
	ts := newServer(t, gateway.Options{})
	addr := strings.TrimPrefix(ts.URL, "http://")
	size := 32 << 20
	for _, chunked := range []bool{false, true} {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(time.Minute))
		head := "POST /v1/completions HTTP/1.1\r\nHost: " + addr + "\r\nAuthorization: Bearer tml-big\r\nContent-Type: application/json\r\n"
		if chunked {
			head += "Transfer-Encoding: chunked\r\n\r\n"
		} else {
			head += fmt.Sprintf("Content-Length: %d\r\n\r\n", size)
		}
		if _, err := io.WriteString(c, head); err != nil {
			t.Fatal(err)
		}
		chunk := []byte(`{"model":"x","prompt":"` + strings.Repeat("a", 1<<20-23))
		for sent := 0; sent < size; sent += len(chunk) {
			var err error
			if chunked {
				_, err = fmt.Fprintf(c, "%x\r\n%s\r\n", len(chunk), chunk)
			} else {
				_, err = c.Write(chunk)
			}
			if err != nil {
				t.Fatalf("chunked %v: writing the body after %d bytes: %v (the server reset the connection)", chunked, sent, err)
			}
			chunk = []byte(strings.Repeat("a", 1<<20))
			time.Sleep(40 * time.Millisecond) // 25 MB/s: a real link, slower than loopback
		}
		if chunked {
			_, _ = io.WriteString(c, "0\r\n\r\n")
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("chunked %v: reading the answer: %v", chunked, err)
		}
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(string(b), "limit") {
			t.Fatalf("chunked %v: %d %s; want a 413 naming the limit", chunked, resp.StatusCode, b)
		}
	}
}

// remoteDir is a local directory that the gateway takes for object storage (it is not a
// *storage.Dir): checkpoints live in it as in a bucket, and archive links are fake presigned
// URLs. It counts archive objects written and the object reads in flight.
type remoteDir struct {
	*storage.Dir
	archivePuts atomic.Int32
	reading     atomic.Int32 // Gets whose body is open now
	maxReading  atomic.Int32
}

func (d *remoteDir) PresignGet(_ context.Context, key string, _ time.Duration) (string, error) {
	return "http://bucket.invalid/" + key, nil
}

func (d *remoteDir) Put(ctx context.Context, key string, body io.ReadSeeker, cond storage.Cond) (storage.Info, error) {
	if strings.HasSuffix(key, ".tar.gz") {
		d.archivePuts.Add(1)
	}
	return d.Dir.Put(ctx, key, body, cond)
}

func (d *remoteDir) Get(ctx context.Context, key string) (io.ReadCloser, storage.Info, error) {
	rc, info, err := d.Dir.Get(ctx, key)
	if err != nil {
		return rc, info, err
	}
	n := d.reading.Add(1)
	for m := d.maxReading.Load(); n > m && !d.maxReading.CompareAndSwap(m, n); m = d.maxReading.Load() {
	}
	time.Sleep(20 * time.Millisecond) // a bucket is slower than a disk: widens the race
	return &countedBody{ReadCloser: rc, d: d}, info, nil
}

type countedBody struct {
	io.ReadCloser
	d    *remoteDir
	once sync.Once
}

func (b *countedBody) Close() error {
	b.once.Do(func() { b.d.reading.Add(-1) })
	return b.ReadCloser.Close()
}

// Concurrent archive requests of one checkpoint on object storage build its archive once
// (the others wait for that build), and builds of different checkpoints run at most
// gateway.MaxArchiveBuilds at once: 24 requests of one 146 MB checkpoint made 24 copies in the
// scratch directory, 3.9 GB (issue 40, item 5).
func TestConcurrentArchiveRequestsBuildOnce(t *testing.T) {
	root, err := storage.NewDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	st := &remoteDir{Dir: root}
	data := t.TempDir()
	e, err := engine.Load(modelDir(), engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	stored, err := replica.NewStored(e, st, data, filepath.Join(data, "scratch"))
	if err != nil {
		t.Fatal(err)
	}
	rep := replica.New("r0", base, stored, 4)
	gw, err := gateway.New(gateway.Options{DataDir: data, Storage: st}, rep)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(gw)
	t.Cleanup(func() { ts.Close(); gw.Close(); rep.Close() })

	ctx := context.Background()
	c := client.New(ts.URL, "tml-arch")
	sess, _ := c.CreateSession(ctx)
	tc, err := c.CreateLoraTrainingClient(ctx, sess, 0, base, 4)
	if err != nil {
		t.Fatal(err)
	}
	names := []string{"ck1", "ck2", "ck3", "ck4"}
	for _, name := range names {
		fut, err := tc.SaveState(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if err := fut.Result(ctx, &api.SaveWeightsResponse{}); err != nil {
			t.Fatal(err)
		}
	}
	archive := func(name string) error {
		var arch api.ArchiveURLResponse
		if err := c.Do(ctx, "GET", "training_runs/"+tc.ModelID+"/checkpoints/weights/"+name+"/archive", nil, &arch); err != nil {
			return err
		}
		if !strings.HasPrefix(arch.URL, "http://bucket.invalid/") {
			return fmt.Errorf("archive URL %q", arch.URL)
		}
		return nil
	}
	var wg sync.WaitGroup
	errs := make(chan error, 24)
	for range 24 {
		wg.Go(func() { errs <- archive("ck1") })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := st.archivePuts.Load(); n != 1 {
		t.Fatalf("24 concurrent archive requests of one checkpoint built %d archives; want 1", n)
	}
	// Different checkpoints build side by side, but no more than MaxArchiveBuilds at once
	// (each build reads its checkpoint's files one at a time).
	st.maxReading.Store(0)
	errs = make(chan error, 3)
	for _, name := range names[1:] {
		wg.Go(func() { errs <- archive(name) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := st.archivePuts.Load(); n != 4 {
		t.Fatalf("archives built: %d; want 4", n)
	}
	if m := st.maxReading.Load(); m > gateway.MaxArchiveBuilds {
		t.Fatalf("%d checkpoint reads at once; want at most %d builds at once", m, gateway.MaxArchiveBuilds)
	}
}
