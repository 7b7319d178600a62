package worker

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"
)

// Announce registers with the gateway, then heartbeats every second until ctx ends; when the
// gateway does not know the worker (it restarted, or declared the worker dead) it registers again.
func Announce(ctx context.Context, gateway, token string, reg Registration, status func() Heartbeat, log *slog.Logger) {
	gateway = strings.TrimRight(gateway, "/")
	hc := &http.Client{Timeout: 5 * time.Second}
	post := func(path string, v any) (int, error) {
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
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	registered := false
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		if !registered {
			if status, err := post("register", reg); err == nil && status == http.StatusOK {
				registered = true
				log.Info("registered with the gateway", "gateway", gateway, "id", reg.ID)
			} else {
				log.Warn("registering with the gateway", "gateway", gateway, "status", status, "err", err)
			}
		} else {
			hb := status()
			hb.ID = reg.ID
			code, err := post("heartbeat", hb)
			if err == nil && code == http.StatusNotFound {
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
