package gateway_test

import (
	"context"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/client"
	"github.com/skein-ai/skein/engine"
	"github.com/skein-ai/skein/gateway"
	"github.com/skein-ai/skein/replica"
	"github.com/skein-ai/skein/storage"
	"github.com/skein-ai/skein/storage/storagetest"
)

// A replica that was cut off while it held an adapter, and still runs, must not overwrite the
// state the adapter's new replica saved: when another replica makes the adapter resident it
// claims the state pointer, and the old replica's next save (its optim_step) is refused with 412,
// fails the request saying so, and drops its copy. The pointer keeps the new owner's version.
// On the data directory and on S3.
func TestStaleReplicaCannotOverwriteState(t *testing.T) {
	for _, backend := range []string{"dir", "s3"} {
		t.Run(backend, func(t *testing.T) {
			data := t.TempDir()
			var st storage.Storage
			if backend == "s3" {
				st = storagetest.S3(t)
			} else {
				d, err := storage.NewDir(data)
				if err != nil {
					t.Fatal(err)
				}
				st = d
			}
			e, err := engine.Load(modelDir(), engine.Options{})
			if err != nil {
				t.Fatal(err)
			}
			var reps []*replica.Replica
			for i, eng := range []engine.Compute{e, e.Fork()} {
				c, err := replica.NewStored(eng, st, data, filepath.Join(data, "scratch"))
				if err != nil {
					t.Fatal(err)
				}
				reps = append(reps, replica.New([]string{"old", "new"}[i], base, c, 4))
			}
			// Only "old" at first: the adapter is placed there.
			gw, err := gateway.New(gateway.Options{DataDir: data, Storage: st}, reps[0])
			if err != nil {
				t.Fatal(err)
			}
			ts := httptest.NewServer(gw)
			t.Cleanup(func() { ts.Close(); gw.Close(); reps[0].Close(); reps[1].Close() })
			ctx := context.Background()
			c := client.New(ts.URL, "tml-fence")
			sess, _ := c.CreateSession(ctx)
			tc, err := c.CreateLoraTrainingClient(ctx, sess, 0, base, 4)
			if err != nil {
				t.Fatal(err)
			}
			batch := []api.Datum{datum([]int{3, 14, 15, 92, 65, 35}, true)}
			step := func() error {
				fb, _ := tc.ForwardBackward(ctx, batch, "cross_entropy", nil, false)
				op, _ := tc.OptimStep(ctx, 1e-2)
				if err := fb.Result(ctx, &api.ForwardBackwardOutput{}); err != nil {
					return err
				}
				return op.Result(ctx, &map[string]any{})
			}
			if err := step(); err != nil {
				t.Fatal(err)
			}
			pointer := "state/" + strings.ReplaceAll(tc.ModelID, ":", "_") + ".current"
			afterStep1, _, err := storage.ReadPointer(ctx, st, pointer)
			if err != nil {
				t.Fatal(err)
			}
			// The adapter's new replica takes it over (as after the old one was cut off).
			if err := reps[1].Place(ctx, gw.AdapterOf(tc.ModelID)); err != nil {
				t.Fatal(err)
			}
			// The old replica, still running, steps and tries to save over the new owner's state.
			err = step()
			if err == nil || !strings.Contains(err.Error(), "412") {
				t.Fatalf("the stale replica's optim_step: %v, want a failure naming 412", err)
			}
			if now, _, err := storage.ReadPointer(ctx, st, pointer); err != nil || now != afterStep1 {
				t.Fatalf("pointer %q (%v), want it unchanged at the new owner's %q", now, err, afterStep1)
			}
			if reps[0].AdapterIDs(ctx) != nil && len(reps[0].AdapterIDs(ctx)) != 0 {
				t.Fatalf("the stale replica still holds %v", reps[0].AdapterIDs(ctx))
			}
			// No version but the current one stays behind.
			objs, err := st.List(ctx, "state/", 100)
			if err != nil {
				t.Fatal(err)
			}
			for _, o := range objs {
				if o.Key != pointer && !strings.HasPrefix(o.Key, "state/"+afterStep1+"/") {
					t.Fatalf("left over: %s", o.Key)
				}
			}
		})
	}
}
