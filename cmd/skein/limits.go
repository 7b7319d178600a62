package main

import (
	"flag"
	"fmt"
	"net/http"
	"time"

	"github.com/skein-ai/skein/gateway"
)

// limitFlags are the serve/gateway flags that bound what one client can make the server hold:
// queued requests per training run, one request's size, checkpoint storage, how long closed
// sessions are kept, and how long a connection may be held.
type limitFlags struct {
	runQueueOps, requestDatums, requestTokens *int
	runQueueBytes, checkpointBytes            *int64
	tenantQueueBytes, totalQueueBytes         *int64
	readHeaderTimeout, readTimeout            *time.Duration
	idleTimeout, writeTimeout                 *time.Duration
	sessionRetention, chatTemplateTimeout     *time.Duration
	pixelValues, imageBytes, imagePixels      *int
	imageDecoders                             *int
	minBodyRate, maxConns, maxConnsPerIP      *int
	minBodyRateGrace                          *time.Duration
	sessionsPerTenant                         *int
}

func addLimitFlags(fs *flag.FlagSet) *limitFlags {
	return &limitFlags{
		runQueueOps:         fs.Int("run-queue-ops", gateway.DefaultMaxRunQueueOps, "requests one training run may have queued (ahead of its next seq_id or waiting); past it: 429"),
		runQueueBytes:       fs.Int64("run-queue-bytes", gateway.DefaultMaxRunQueueBytes, "memory (decoded requests) one training run may have queued; past it: 429"),
		requestDatums:       fs.Int("max-request-datums", gateway.DefaultMaxRequestDatums, "datums of one forward/forward_backward request"),
		requestTokens:       fs.Int("max-request-tokens", gateway.DefaultMaxRequestTokens, "tokens of one request (model inputs; samples × (prompt + max_tokens) for sampling)"),
		checkpointBytes:     fs.Int64("tenant-checkpoint-bytes", gateway.DefaultTenantCheckpointBytes, "checkpoint storage one tenant may hold (-1: unlimited); a save past it is refused"),
		pixelValues:         fs.Int("max-request-pixel-values", gateway.DefaultMaxRequestPixelValues, "pixel_values elements of one request's images together (vision-language models)"),
		imageBytes:          fs.Int("max-request-image-bytes", gateway.DefaultMaxRequestImageBytes, "encoded bytes of one request's images together, a file by its size before it is read (a file named twice counts once)"),
		imagePixels:         fs.Int("max-request-image-pixels", gateway.DefaultMaxRequestImagePixels, "decoded pixels (width·height from the headers, before any decode) of one request's images together"),
		imageDecoders:       fs.Int("image-decoders", 0, "images the server decodes at once, all requests together (0: half the CPUs)"),
		chatTemplateTimeout: fs.Duration("chat-template-timeout", gateway.DefaultChatTemplateTimeout, "how long one chat request's template render is waited on (OpenAI chat endpoint); past it: 400"),
		sessionRetention:    fs.Duration("session-retention", gateway.DefaultSessionRetention, "how long a closed session and its dead runs are kept before they are forgotten"),
		readHeaderTimeout:   fs.Duration("http-read-header-timeout", 10*time.Second, "time a client has to send a request's headers"),
		readTimeout:         fs.Duration("http-read-timeout", 5*time.Minute, "time a client has to send a whole request, body included (must exceed the 30 s long-poll)"),
		idleTimeout:         fs.Duration("http-idle-timeout", 2*time.Minute, "how long an idle keep-alive connection stays open"),
		writeTimeout:        fs.Duration("http-write-timeout", 0, "time to write one answer (0: the long-poll plus a minute; archive downloads get 30 min)"),
		minBodyRate:         fs.Int("min-body-rate", defaultMinBodyRate, "bytes/s a request body must average once --min-body-rate-grace has passed; slower: 400 and the connection is closed (0: off)"),
		minBodyRateGrace:    fs.Duration("min-body-rate-grace", defaultMinBodyRateGrace, "time a request body may take before --min-body-rate applies"),
		maxConns:            fs.Int("max-conns", defaultMaxConns, "connections the server holds open at once; past it a new one gets 503 and is closed"),
		maxConnsPerIP:       fs.Int("max-conns-per-ip", defaultMaxConnsPerIP, "connections one remote address may hold open at once; past it: 503 (0: no per-address cap, e.g. behind a proxy)"),
		tenantQueueBytes:    fs.Int64("tenant-queue-bytes", gateway.DefaultMaxTenantQueueBytes, "memory (decoded requests) one tenant's training runs may have queued together; past it: 429"),
		totalQueueBytes:     fs.Int64("total-queue-bytes", gateway.DefaultMaxTotalQueueBytes, "memory (decoded requests) all training runs may have queued together; past it: 429"),
		sessionsPerTenant:   fs.Int("max-sessions-per-tenant", gateway.DefaultMaxSessionsPerTenant, "live sessions one tenant may hold (expired ones do not count); past it create_session gets 429"),
	}
}

// longPoll is how long retrieve_future holds a request (the gateway's default).
const longPoll = 30 * time.Second

// check refuses values that cannot work.
func (l *limitFlags) check() error {
	for name, v := range map[string]int64{"run-queue-ops": int64(*l.runQueueOps), "run-queue-bytes": *l.runQueueBytes,
		"tenant-queue-bytes": *l.tenantQueueBytes, "total-queue-bytes": *l.totalQueueBytes,
		"max-request-datums": int64(*l.requestDatums), "max-request-tokens": int64(*l.requestTokens),
		"max-request-pixel-values": int64(*l.pixelValues), "max-request-image-bytes": int64(*l.imageBytes),
		"max-request-image-pixels": int64(*l.imagePixels), "max-sessions-per-tenant": int64(*l.sessionsPerTenant)} {
		if v < 1 {
			return fmt.Errorf("--%s must be at least 1, got %d", name, v)
		}
	}
	if *l.checkpointBytes == 0 || *l.checkpointBytes < -1 {
		return fmt.Errorf("--tenant-checkpoint-bytes must be positive, or -1 for unlimited, got %d", *l.checkpointBytes)
	}
	if *l.minBodyRate < 0 || *l.minBodyRateGrace <= 0 || *l.maxConns < 1 || *l.maxConnsPerIP < 0 {
		return fmt.Errorf("--min-body-rate and --max-conns-per-ip must be at least 0, --min-body-rate-grace positive and --max-conns at least 1")
	}
	if *l.imageDecoders < 0 {
		return fmt.Errorf("--image-decoders must be 0 (half the CPUs) or more, got %d", *l.imageDecoders)
	}
	if *l.chatTemplateTimeout <= 0 {
		return fmt.Errorf("--chat-template-timeout must be positive, got %s", *l.chatTemplateTimeout)
	}
	if *l.sessionRetention <= 0 {
		return fmt.Errorf("--session-retention must be positive, got %s", *l.sessionRetention)
	}
	if *l.readHeaderTimeout <= 0 || *l.idleTimeout <= 0 {
		return fmt.Errorf("--http-read-header-timeout and --http-idle-timeout must be positive")
	}
	// A request's context ends when its read deadline passes, long-polls included.
	if *l.readTimeout <= longPoll {
		return fmt.Errorf("--http-read-timeout must exceed the %s long-poll, got %s", longPoll, *l.readTimeout)
	}
	if *l.writeTimeout != 0 && *l.writeTimeout <= longPoll {
		return fmt.Errorf("--http-write-timeout must exceed the %s long-poll, got %s", longPoll, *l.writeTimeout)
	}
	return nil
}

// apply sets the gateway's bounds.
func (l *limitFlags) apply(o gateway.Options) gateway.Options {
	o.MaxRunQueueOps, o.MaxRunQueueBytes = *l.runQueueOps, *l.runQueueBytes
	o.MaxTenantQueueBytes, o.MaxTotalQueueBytes = *l.tenantQueueBytes, *l.totalQueueBytes
	o.MaxRequestDatums, o.MaxRequestTokens = *l.requestDatums, *l.requestTokens
	o.WriteTimeout = *l.writeTimeout
	o.MaxRequestPixelValues = *l.pixelValues
	o.MaxRequestImageBytes, o.MaxRequestImagePixels = *l.imageBytes, *l.imagePixels
	o.ImageDecoders = *l.imageDecoders
	o.ChatTemplateTimeout = *l.chatTemplateTimeout
	o.TenantCheckpointBytes = *l.checkpointBytes
	o.SessionRetention = *l.sessionRetention
	o.MaxSessionsPerTenant = *l.sessionsPerTenant
	return o
}

// httpServer is the server of the API with its connection timeouts and minimum body rate
// (door.go): a slow or idle client cannot hold a connection forever. Serve it on listener(ln, its handler). Writes are bounded per answer by the gateway (a server-wide
// WriteTimeout would cut long checkpoint downloads).
func (l *limitFlags) httpServer(addr string, h http.Handler) *http.Server {
	h = minRateBodies(h, *l.minBodyRate, *l.minBodyRateGrace, *l.readTimeout)
	return &http.Server{Addr: addr, Handler: h, ReadHeaderTimeout: *l.readHeaderTimeout,
		ReadTimeout: *l.readTimeout, IdleTimeout: *l.idleTimeout}
}
