package gateway_test

import (
	"context"
	"testing"

	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/client"
	"github.com/skein-ai/skein/gateway"
)

// BenchmarkRunLeaseOverhead: what run ownership costs an op (issue 38's target: at most 1.1× an
// op's latency). One forward_backward and its result, round trip, through a gateway on
// PostgreSQL with run leases (the default with a shared store) and with them off
// (RunLeaseTTL < 0); the same tiny model, one run, one client. The leased path adds reading
// the body once more, finding its model_id, an in-memory epoch check, the request kept with the
// future, and a fenced result write; renewals run in the background. Compare the two ns/op.
func BenchmarkRunLeaseOverhead(b *testing.B) {
	for _, c := range []struct {
		name string
		ttl  int64 // nanoseconds; < 0: no leases
	}{{"leases", 0}, {"no-leases", -1}} {
		b.Run(c.name, func(b *testing.B) {
			gws := startPGGatewaysWith(b, 1, func(o *gateway.Options) { o.RunLeaseTTL = timeDuration(c.ttl) })
			ctx := context.Background()
			cl := client.New(gws[0].ts.URL, "tml-bench")
			sess, err := cl.CreateSession(ctx)
			if err != nil {
				b.Fatal(err)
			}
			tc, err := cl.CreateLoraTrainingClient(ctx, sess, 0, base, 4)
			if err != nil {
				b.Fatal(err)
			}
			batch := []api.Datum{datum([]int{3, 14, 15, 92, 65, 35}, true)}
			b.ResetTimer()
			for range b.N {
				fb, err := tc.ForwardBackward(ctx, batch, "cross_entropy", nil, false)
				if err != nil {
					b.Fatal(err)
				}
				if err := fb.Result(ctx, &api.ForwardBackwardOutput{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
