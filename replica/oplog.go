package replica

import (
	"context"
	"log/slog"
	"time"

	"github.com/skein-ai/skein/engine"
)

// opInfoAfter: a finished op that took at least this long is logged at info, a shorter one at
// debug. A person waits on a long op (a big forward_backward, a long decode) and wants to see it
// end; a busy service runs hundreds of short ones a second, and logging each at info would drown
// the log. A variable only so that tests can move it.
var opInfoAfter = time.Second

// SetLogger sets where the replica logs its finished ops (default: slog's default logger, which
// skein's binary sets to the configured one). Call it before the replica serves.
func (r *Replica) SetLogger(l *slog.Logger) { r.logger = l }

func (r *Replica) log() *slog.Logger {
	if r.logger != nil {
		return r.logger
	}
	return slog.Default()
}

// logOp logs a finished op: its duration, and tokens and tokens per second where it has tokens
// (attrs adds what else it has, its loss or step).
func (r *Replica) logOp(op, run string, start time.Time, tokens int, attrs ...any) {
	d := time.Since(start)
	level := slog.LevelDebug
	if d >= opInfoAfter {
		level = slog.LevelInfo
	}
	args := []any{"op", op, "replica", r.id, "seconds", d.Seconds()}
	if run != "" {
		args = append(args, "run", run)
	}
	if tokens > 0 {
		args = append(args, "tokens", tokens, "tokens_per_s", float64(tokens)/max(d.Seconds(), 1e-9))
	}
	r.log().Log(context.Background(), level, op+" done", append(args, attrs...)...)
}

// batchTokens is the tokens of a batch's datums.
func batchTokens(b *engine.Batch) int {
	n := 0
	for _, d := range b.Data {
		n += len(d.Tokens)
	}
	return n
}
