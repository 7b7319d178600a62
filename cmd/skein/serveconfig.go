package main

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/skein-ai/skein/engine"
	"github.com/skein-ai/skein/engine/imageproc"
	"github.com/skein-ai/skein/gateway"
	"github.com/skein-ai/skein/replica"
)

const serveSynopsis = "skein serve|gateway [flags]"

// DefaultKVCacheMB is --kv-cache-mb's default on serve and worker: a 1 GiB prefix cache per base
// model (Qwen3-8B's float32 keys and values are 288 KiB a position: about 3,600 positions).
const DefaultKVCacheMB = 1024

// checkKVCacheMB refuses a --kv-cache-mb outside [0, engine.MaxKVCacheMB].
func checkKVCacheMB(mb int) error {
	if mb < 0 || mb > engine.MaxKVCacheMB {
		return fmt.Errorf("--kv-cache-mb %d: must be in [0, %d] (0: off)", mb, engine.MaxKVCacheMB)
	}
	return nil
}

// serveConfig is the whole configuration of `skein serve` and `skein gateway`: one field per
// flag, each registered with its default once in register (defaults the gateway also applies
// come from its Default* constants).
type serveConfig struct {
	Addr, Data           string
	Models, Names        multiFlag
	MaxBodyBytes         int64
	Replicas, MaxLoras   int
	StepMemoryMB         int
	KVCacheMB            int
	PrefillChunk         int
	ContinuousBatching   bool
	Precision            string
	Device               string
	Activations          string
	QueueTimeout         time.Duration
	FutureTTL            time.Duration
	SessionTimeout       time.Duration
	MaxAdaptersPerTenant int
	RouterWeights        string
	Config               string
	WorkerToken, State   string
	Storage, S3Endpoint  string
	dataGiven            bool // --data (or its variable, or the file) was given
	Auth, PublicURL      string
	AdvertiseURL         string
	RunLeaseTTL          time.Duration
	Record               string
	ImageDir             string
	AcceptWorkers        bool
	ShutdownTimeout      time.Duration
	SamplerCopies        int
	Limits               *limitFlags
	Log                  logConfig
	Discover             discoverFlags
}

// register defines the flags of c on fs.
func (c *serveConfig) register(fs *flag.FlagSet) {
	fs.StringVar(&c.Addr, "addr", "127.0.0.1:8000", "listen address")
	fs.StringVar(&c.Data, "data", "./skein-data", "data directory (skein gateway with --state postgres://… and --storage s3://… needs none: given none, it uses a private scratch directory)")
	fs.Var(&c.Models, "model", "Hugging Face model directory, a hub cache entry models--Org--Name (its refs/main snapshot), a GGUF file (llama, qwen2, qwen3, qwen3moe) or an Ollama manifest (repeatable; a comma-separated list in the variable); default: a generated tiny model")
	fs.Var(&c.Names, "name", "base-model name clients use for the matching --model (repeatable; default: directory name, Org/Name for a hub cache entry or snapshot, a GGUF file's name without .gguf, name:tag for an Ollama manifest)")
	fs.Int64Var(&c.MaxBodyBytes, "max-body-bytes", gateway.DefaultMaxBodyBytes, "largest request body")
	fs.IntVar(&c.Replicas, "replicas", 1, "replicas of each base model in this process (they share one copy of the base weights)")
	fs.IntVar(&c.MaxLoras, "max-loras", replica.DefaultMaxLoras, "LoRA adapter slots per replica")
	fs.IntVar(&c.SamplerCopies, "sampler-copies", replica.SamplerCopies, "read-only sampler weights each replica keeps in memory (least recently used go first); one sampling batch serves at most this many tenants' sampler weights at once")
	fs.IntVar(&c.StepMemoryMB, "step-memory-mb", 4096, "activation memory one training pass may hold; bigger batches run in chunks")
	fs.IntVar(&c.KVCacheMB, "kv-cache-mb", DefaultKVCacheMB, "memory each base model's sampler keeps for prompts' keys and values across requests (a later prompt starting with a cached prefix, on the same weights, prefills only the rest; the least recently used go first; replicas of a model share it); 0: off")
	fs.IntVar(&c.PrefillChunk, "prefill-chunk", engine.DefaultPrefillChunk, "prompt tokens (rows × positions) of one prefill pass of a request joining a running sampling loop: the loop's rows take a decode step between two such passes")
	fs.BoolVar(&c.ContinuousBatching, "continuous-batching", false, "sampling requests that arrive while a batch decodes join its loop between decode steps, and each is answered when its own samples end (off: they wait for the next batch, or run as a batch of their own between its layers; on is faster for requests of similar lengths, slower when short and long ones mix: see the design notes)")
	fs.StringVar(&c.Activations, "activations", engine.ActivationsF32, "forward products of quantized base weights: f32 (float32 activations times the dequantized blocks) or ggml (activations rounded to Q8_0/Q8_K blocks and integer dots, as llama.cpp's CPU backend: its logits on the same GGUF; slower)")
	fs.StringVar(&c.Device, "device", "auto", "where the engine computes: auto (the first working NVIDIA GPU, else the CPU), cpu, cuda or cuda:N; the CUDA backend does not run the model yet, so auto computes on the CPU (logging why) and cuda is refused")
	fs.StringVar(&c.Precision, "precision", engine.PrecisionF32, "base weights in memory: f32; bf16 (half the memory; products in bf16 where the CPU has AVX512_BF16, else widened); q8_0, q6_k or q4_k (projections in GGUF Q8_0, Q6_K or Q4_K blocks, about a quarter, a fifth or an eighth of f32); q4_k_m (llama.cpp's Q4_K_M mix: Q4_K with Q6_K for the head and some layers' v and down projections); LoRA, norms and gradients in f32")
	fs.DurationVar(&c.QueueTimeout, "queue-timeout", gateway.DefaultQueueTimeout, "how long an op waits for a free LoRA slot")
	fs.DurationVar(&c.FutureTTL, "future-ttl", gateway.DefaultFutureTTL, "how long request results are kept")
	fs.DurationVar(&c.SessionTimeout, "session-timeout", gateway.DefaultSessionTimeout, "a session without a heartbeat for this long expires: its samplers go and its adapters are unloaded (checkpoints stay)")
	fs.IntVar(&c.MaxAdaptersPerTenant, "max-adapters-per-tenant", gateway.DefaultMaxAdaptersPerTenant, "live LoRA adapters (training runs) one tenant may hold, all replicas together; past it create_model is refused")
	aliasFlag(fs, "tenant-max-loras", "max-adapters-per-tenant")
	fs.StringVar(&c.RouterWeights, "router-weights", "", "router scorer weights, e.g. capacity=4,queue=1,held=2")
	fs.StringVar(&c.Config, "config", "", "YAML file of flag-name: value settings")
	fs.StringVar(&c.WorkerToken, "worker-token", "", "shared secret of workers (register, heartbeat, calls)")
	fs.StringVar(&c.State, "state", "", "state store: empty for SQLite in the data directory, or a postgres:// URL shared by several gateways")
	fs.StringVar(&c.Storage, "storage", "", "where adapter state, checkpoints and sampler weights live: empty for the data directory, or s3://bucket/prefix (credentials from the AWS chain: AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE, instance roles)")
	fs.StringVar(&c.S3Endpoint, "s3-endpoint", "", "address of an S3-compatible server for --storage s3://… (MinIO, versitygw, Ceph): http(s)://host:port; empty: AWS (or AWS_ENDPOINT_URL_S3)")
	fs.StringVar(&c.Auth, "auth", "", "open (any key is a tenant; loopback only, the default there) or keys (keys from 'skein keys create')")
	fs.StringVar(&c.PublicURL, "public-url", "", "base URL clients reach this server at, used in download links (default: the listen address when it is loopback)")
	fs.StringVar(&c.AdvertiseURL, "advertise-url", "", "with a shared --state (several gateways): this gateway's own URL (not a load balancer's) where the other gateways reach it, to forward requests for the training runs it sequences (e.g. http://10.0.0.5:8000); a gateway restarted at the same URL takes its predecessor's runs at once; empty: the others answer 503 for its runs until their lease lapses")
	fs.DurationVar(&c.RunLeaseTTL, "run-lease-ttl", gateway.DefaultRunLeaseTTL, "with a shared --state: how long a gateway's lease on a training run lasts unrenewed; a dead gateway's runs are taken over within about this long (negative: no leases)")
	fs.StringVar(&c.Record, "record", "", "append every request and response to this JSONL file (for replay tests)")
	fs.StringVar(&c.ImageDir, "image-dir", "", "directory image_asset_pointer chunks may name files in (empty: file pointers refused; data: URIs always work, URLs never)")
	fs.BoolVar(&c.AcceptWorkers, "accept-workers", false, "let 'skein worker' processes register ('skein gateway' always does); without --worker-token a cluster token is generated into the data directory")
	fs.DurationVar(&c.ShutdownTimeout, "shutdown-timeout", 10*time.Second, "on SIGINT or SIGTERM, how long requests in flight may finish before their connections are closed")
	c.Limits = addLimitFlags(fs)
	c.Log.register(fs)
	c.Discover.register(fs)
}

// serveFlags is the flag set of `skein serve` over a new configuration.
func serveFlags() (*flag.FlagSet, *serveConfig) {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	c := &serveConfig{}
	c.register(fs)
	return fs, c
}

// parseServeConfig reads the configuration of `skein serve` from args, SKEIN_* variables and the
// YAML file.
func parseServeConfig(args []string) (*serveConfig, error) {
	fs, c := serveFlags()
	pos, err := parseSettings(fs, args, serveSynopsis)
	if err != nil {
		return nil, err
	}
	if len(pos) != 0 {
		return nil, fmt.Errorf("unexpected arguments %q (flags only; see skein serve --help)", pos)
	}
	fs.Visit(func(f *flag.Flag) { c.dataGiven = c.dataGiven || f.Name == "data" })
	if err := imageproc.CheckImageDir(c.ImageDir); err != nil {
		return nil, err
	}
	return c, nil
}

// logConfig chooses the process's log output (always stderr).
type logConfig struct {
	Level, Format string
}

func (c *logConfig) register(fs *flag.FlagSet) {
	fs.StringVar(&c.Level, "log-level", "info", "least severe log lines written: debug, info, warn or error")
	fs.StringVar(&c.Format, "log-format", "text", "log lines as text (key=value) or json")
}

// processLog is the process's configured logger once serve or worker has built it, and nil
// before: the final error goes through it, so that a JSON log ends with a JSON line too.
var processLog *slog.Logger

// setupLog builds c's logger on stderr and makes it the process's: slog's default (which the
// replica and gateway packages log through, and which the standard log package then writes to,
// net/http's errors included), the final error's, and what human notes are written through. With
// --log-format json a line of any other shape would break whatever reads the log.
func (c logConfig) setupLog() (*slog.Logger, io.Writer, error) {
	log, err := c.logger(os.Stderr)
	if err != nil {
		return nil, nil, err
	}
	slog.SetDefault(log)
	processLog = log
	if strings.EqualFold(c.Format, "json") {
		return log, logWriter{log}, nil
	}
	return log, os.Stderr, nil
}

// logWriter writes each Write (one human note, perhaps of several lines) as one info record.
type logWriter struct{ log *slog.Logger }

func (w logWriter) Write(p []byte) (int, error) {
	if msg := strings.Join(strings.Fields(string(p)), " "); msg != "" {
		w.log.Info(msg)
	}
	return len(p), nil
}

// logger builds the slog logger of c, writing to w.
func (c logConfig) logger(w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(c.Level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", c.Level)
	}
	opts := &slog.HandlerOptions{Level: level}
	switch strings.ToLower(c.Format) {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", c.Format)
}

// scratchData gives a gateway that keeps nothing on its disk a private data directory when it
// was given none: with --state postgres://… and --storage s3://… its state, secrets and files
// live in PostgreSQL and the bucket, and the directory holds only scratch (archives being built,
// GGUF conversions, copies on their way to the bucket), removed by the returned cleanup. Any
// other server keeps --data's default, where its state lives.
func scratchData(c *serveConfig, gatewayOnly bool) (cleanup func(), err error) {
	if !gatewayOnly || c.dataGiven || c.State == "" || !strings.HasPrefix(c.Storage, "s3://") {
		return func() {}, nil
	}
	dir, err := os.MkdirTemp("", "skein-gateway-")
	if err != nil {
		return nil, fmt.Errorf("a scratch directory (give --data): %w", err)
	}
	c.Data = dir
	return func() { os.RemoveAll(dir) }, nil
}
