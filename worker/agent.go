package worker

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"
)

// Announce registers with the gateway, then heartbeats every second until ctx ends, each
// heartbeat carrying the secret its registration was given; when the gateway does not know the
// worker (it restarted, or declared the worker dead) it registers again.
func Announce(ctx context.Context, gateway, token string, reg Registration, status func() Heartbeat, log *slog.Logger) {
	gateway = strings.TrimRight(gateway, "/")
	hc := &http.Client{Timeout: 5 * time.Second}
	post := func(path string, v, answer any) (int, error) {
		b, _ := json.Marshal(v)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, gateway+"/api/v1/skein/workers/"+path, bytes.NewReader(b))
		if err != nil {
			return 0, err
		}
		req.Header.Set("Content-Type", "application/json")
		if token != "" {
			req.Header.Set(TokenHeader, token)
		}
		resp, err := hc.Do(req)
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		if resp.StatusCode == http.StatusOK && answer != nil {
			if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(answer); err != nil {
				return 0, fmt.Errorf("gateway answer: %w", err)
			}
		}
		return resp.StatusCode, nil
	}
	registered, secret := false, ""
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		if !registered {
			var ans RegisterReply
			if status, err := post("register", reg, &ans); err == nil && status == http.StatusOK && ans.Secret != "" {
				registered, secret = true, ans.Secret
				log.Info("registered with the gateway", "gateway", gateway, "id", reg.ID)
			} else {
				log.Warn("registering with the gateway", "gateway", gateway, "status", status, "err", err)
			}
		} else {
			hb := status()
			hb.ID, hb.Secret = reg.ID, secret
			code, err := post("heartbeat", hb, nil)
			// Unknown (the gateway restarted, or declared this worker dead) or not ours any more:
			// register again.
			if err == nil && (code == http.StatusNotFound || code == http.StatusForbidden) {
				registered = false
				continue
			}
			if err != nil || code != http.StatusOK {
				log.Warn("heartbeat", "status", code, "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// ID makes a worker id from its host address.
func ID(base, addr string) string { return fmt.Sprintf("%s@%s", base, addr) }
