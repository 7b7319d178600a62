package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"
)

// shutdownOnSignal, once ctx ends (a signal), drains hs: it stops accepting connections and
// waits up to bound for the requests in flight, then closes what is left, then runs closeAll
// (the gateway's background work and store). Each stage is logged.
func shutdownOnSignal(ctx context.Context, hs *http.Server, log *slog.Logger, bound time.Duration, closeAll func()) error {
	cause := "stopped"
	if err := context.Cause(ctx); err != nil {
		cause = err.Error() // "interrupt signal received"
	}
	log.Info("shutting down: draining requests in flight", "cause", cause, "timeout", bound)
	drain, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	err := hs.Shutdown(drain)
	if errors.Is(err, context.DeadlineExceeded) {
		log.Warn("drain timed out: closing the connections still open", "timeout", bound)
		err = hs.Close()
	}
	closeAll()
	if err != nil {
		log.Error("shutdown", "err", err)
		return fmt.Errorf("shutdown: %w", err)
	}
	log.Info("closed")
	return nil
}
