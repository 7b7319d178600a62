package gateway_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/skein-ai/skein/client"
)

// privatePostgres starts a PostgreSQL of the test's own with .ci/postgres.sh (it can be stopped
// without disturbing the other tests' server) and returns its DSN, a stop and a start. Only as
// root, where CI's PostgreSQL runs (SKEIN_TEST_POSTGRES set).
func privatePostgres(t *testing.T) (dsn string, stop, start func()) {
	if os.Getenv("SKEIN_TEST_POSTGRES") == "" || os.Geteuid() != 0 {
		t.Skip("needs root and PostgreSQL (SKEIN_TEST_POSTGRES, as .ci/run sets up)")
	}
	out := filepath.Join(t.TempDir(), "pgdir")
	cmd := exec.Command("../.ci/postgres.sh")
	cmd.Env = append(os.Environ(), "SKEIN_PG_DIR_OUT="+out)
	dsnOut, err := cmd.Output()
	if err != nil {
		t.Fatalf(".ci/postgres.sh: %v", err)
	}
	dirb, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	dir := strings.TrimSpace(string(dirb))
	dsn = strings.TrimSpace(string(dsnOut))
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pg_ctl")
	if len(bins) == 0 {
		t.Fatal("no pg_ctl")
	}
	pgctl := bins[len(bins)-1]
	// pg_ctl's output goes to a file, not a pipe: the server it starts inherits it and would hold
	// a pipe open for as long as it runs.
	ctl := func(args string) {
		c := exec.Command("su", "postgres", "-s", "/bin/sh", "-c", pgctl+" -D "+dir+"/data "+args+" >>"+dir+"/ctl.log 2>&1")
		if err := c.Run(); err != nil {
			log, _ := os.ReadFile(dir + "/ctl.log")
			t.Errorf("pg_ctl %s: %v %s", args, err, log)
		}
	}
	t.Cleanup(func() { ctl("stop -m immediate"); os.RemoveAll(dir) })
	stop = func() { ctl("stop -m fast -w") }
	start = func() {
		ctl(fmt.Sprintf("start -w -l %s/log -o '-p %s -k %s -c listen_addresses=127.0.0.1'", dir, u.Port(), dir))
	}
	return dsn, stop, start
}

// submitSeq sends one sequenced op, retrying while the service answers 5xx (its store is
// down); a retry of the same seq_id gets the original future, never a second op. It returns
// the future and how many answers were 5xx.
func submitSeq(ctx context.Context, t *testing.T, c *client.Client, path string, body any) (*client.Future, int) {
	for refused := 0; ; refused++ {
		var out struct {
			RequestID string `json:"request_id"`
		}
		err := c.Do(ctx, "POST", path, body, &out)
		if err == nil {
			return c.Future(out.RequestID), refused
		}
		var se *client.StatusError
		if !errors.As(err, &se) || se.Status < 500 || ctx.Err() != nil {
			t.Errorf("%s: %v", path, err)
			return nil, refused
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// PostgreSQL stops while one of a run's ops is on its gateway's replica, which finishes it while
// the store is down; the next step, sent through the other gateway, is refused (5xx) until the
// store is back and is then retried by the client. Every result is stored once the store is
// back, each step's number is exact, the losses equal an uninterrupted run's bit for bit, and
// nothing is left pending.
func TestPostgresRestartLosesNothing(t *testing.T) {
	dsn, stop, start := privatePostgres(t)
	gws, _ := startPGGatewaysAt(t, dsn, 2, nil, false)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const tenant = "tml-pg-restart"
	_, tc := newRun(t, gws[0].ts.URL, tenant, 4)
	step := func(c *client.Client, n int) (*client.Future, *client.Future, int) {
		return seqStep(ctx, t, c, tc.ModelID, n)
	}
	result := func(fb, op *client.Future, n int) float64 { return seqResult(ctx, t, fb, op, n) }
	ca, cb := client.New(gws[0].ts.URL, tenant), client.New(gws[1].ts.URL, tenant)
	var losses []float64
	for n := 1; n <= 2; n++ {
		fb, op, _ := step(ca, n)
		losses = append(losses, result(fb, op, n))
	}
	gws[0].compute.shut()
	fb3, op3, _ := step(ca, 3) // acknowledged; its forward_backward waits on the replica
	<-gws[0].compute.entered
	stop()
	type submitted struct {
		fb, op  *client.Future
		refused int
	}
	fourth := make(chan submitted, 1)
	go func() { fb, op, n := step(cb, 4); fourth <- submitted{fb, op, n} }()
	close(gws[0].compute.gate) // step 3 computes while the store is down
	<-gws[0].compute.left
	time.Sleep(time.Second)
	start()
	s4 := <-fourth
	if s4.refused == 0 {
		t.Fatal("step 4 was never refused: the store was not down when it was sent, and the test shows nothing")
	}
	losses = append(losses, result(fb3, op3, 3), result(s4.fb, s4.op, 4))
	fb5, op5, _ := step(cb, 5)
	losses = append(losses, result(fb5, op5, 5))

	sameAsUninterrupted(t, tenant, losses)
	if pending, err := gws[0].st.PendingOps(ctx, tc.ModelID); err != nil || len(pending) != 0 {
		t.Fatalf("after the restart %d of the run's ops are pending (%v)", len(pending), err)
	}
	t.Logf("step 4 refused %d times while the store was down; losses %v", s4.refused, losses)
}
