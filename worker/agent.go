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
// worker (it restarted, or declared the worker dead) it registers again. The token never
// travels: Announce first shakes hands with the gateway (its hello carries a nonce and the
// worker's instance id), checks the gateway's proof that it holds the token, and then signs its
// registration and heartbeats under that session. Whatever answers at the gateway's address
// without the token gets hellos only. reg.Instance names the worker (random if empty).
func Announce(ctx context.Context, gateway, token string, reg Registration, status func() Heartbeat, log *slog.Logger) {
	gateway = strings.TrimRight(gateway, "/")
	if reg.Instance == "" {
		reg.Instance = NewNonce()[:32]
	}
	hc := &http.Client{Timeout: 5 * time.Second}
	var sess *signer
	hello := func() error {
		mine := Hello{Nonce: NewNonce(), ID: reg.Instance}
		b, _ := json.Marshal(mine)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, gateway+"/api/v1/skein/workers/hello", bytes.NewReader(b))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		var r HelloReply
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("gateway handshake: status %d: %w", resp.StatusCode, ErrUnproven)
		}
		if err := json.NewDecoder(io.LimitReader(resp.Body, maxHelloBytes)).Decode(&r); err != nil || !r.valid() {
			return fmt.Errorf("gateway handshake: malformed answer: %w", ErrUnproven)
		}
		s, err := checkProof(token, labelGatewayProof, labelRegisterKey, r, mine.Nonce, r.Nonce, reg.Instance, r.ID)
		if err != nil {
			return fmt.Errorf("gateway handshake: %w", err)
		}
		sess = s
		return nil
	}
	post := func(path string, v, answer any) (int, error) {
		if sess == nil {
			if err := hello(); err != nil {
				return 0, err
			}
		}
		b, _ := json.Marshal(v)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, gateway+"/api/v1/skein/workers/"+path, bytes.NewReader(b))
		if err != nil {
			return 0, err
		}
		req.Header.Set("Content-Type", "application/json")
		sess.sign(req.Header, req.Method, req.URL.Path, b)
		resp, err := hc.Do(req)
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		if resp.StatusCode == http.StatusUnauthorized {
			sess = nil // the gateway forgot the session (it restarted): shake hands again
		}
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
