package gateway_test

import (
	"context"
	"database/sql"
	"fmt"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/client"
	"github.com/skein-ai/skein/engine"
	"github.com/skein-ai/skein/gateway"
	"github.com/skein-ai/skein/replica"
	"github.com/skein-ai/skein/store"
)

// Two gateways on one PostgreSQL database: a future completed through one wakes, by
// LISTEN/NOTIFY, a retrieve_future long-poll waiting on the other (the store-polling fallback is
// switched off so that only the notification can wake it), and results are readable from both.
func TestTwoGatewaysShareOnePostgres(t *testing.T) {
	dsn := os.Getenv("SKEIN_TEST_POSTGRES")
	if dsn == "" {
		t.Skip("SKEIN_TEST_POSTGRES not set (.ci/run starts PostgreSQL and sets it)")
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	schema := fmt.Sprintf("gw_%d", time.Now().UnixNano())
	if _, err := db.Exec("CREATE SCHEMA " + schema); err != nil {
		t.Fatal(err)
	}
	db.Close()
	shared := dsn + "&search_path=" + schema
	start := func() *httptest.Server {
		st, err := store.OpenPostgres(shared)
		if err != nil {
			t.Fatal(err)
		}
		e, err := engine.Load(modelDir(), engine.Options{})
		if err != nil {
			t.Fatal(err)
		}
		rep := replica.New("r", base, e, 0)
		gw, err := gateway.New(gateway.Options{DataDir: t.TempDir(), Store: st, RemotePoll: time.Hour, LongPoll: 20 * time.Second},
			rep)
		if err != nil {
			t.Fatal(err)
		}
		ts := httptest.NewServer(gw)
		t.Cleanup(func() { ts.Close(); gw.Close(); rep.Close(); st.Close() })
		return ts
	}
	a, b := start(), start()
	ctx := context.Background()
	ca := client.New(a.URL, "tml-pg")
	cb := client.New(b.URL, "tml-pg")
	sess, err := ca.CreateSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tc, err := ca.CreateLoraTrainingClient(ctx, sess, 0, base, 4)
	if err != nil {
		t.Fatal(err)
	}
	data := []api.Datum{datum([]int{5, 6, 7, 8, 9, 10}, true)}
	// seq 2 waits for seq 1, so it is still pending when gateway B starts waiting on it.
	f2, err := tc.ForwardBackwardSeq(ctx, 2, data, "cross_entropy", nil, true)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	var viaB api.ForwardBackwardOutput
	go func() { got <- cb.Future(f2.RequestID).Result(ctx, &viaB) }()
	time.Sleep(200 * time.Millisecond) // let B park on it
	f1, _ := tc.ForwardBackwardSeq(ctx, 1, data, "cross_entropy", nil, false)
	if err := f1.Result(ctx, &api.ForwardBackwardOutput{}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("gateway B was not woken by gateway A's completion")
	}
	var viaA api.ForwardBackwardOutput
	if err := f2.Result(ctx, &viaA); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(viaA.LossFnOutputs) != fmt.Sprint(viaB.LossFnOutputs) || len(viaB.LossFnOutputs) != 1 {
		t.Fatal("the two gateways disagree on a result")
	}
	// Another tenant sees nothing through either gateway.
	if err := client.New(b.URL, "tml-other").Future(f2.RequestID).Result(ctx, nil); !isStatus(err, 404) {
		t.Fatalf("other tenant: %v", err)
	}
}
