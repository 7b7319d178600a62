// Command skein is the one binary: serve, model, bench.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/skein-ai/skein/engine"
	"github.com/skein-ai/skein/gateway"
	"github.com/skein-ai/skein/replica"
	"github.com/skein-ai/skein/router"
	"github.com/skein-ai/skein/storage"
	"github.com/skein-ai/skein/store"
)

const usage = `skein: multi-tenant LoRA fine-tuning and sampling (Tinker API)

  skein serve [--addr 127.0.0.1:8000] [--data ./skein-data] [--model DIR [--name NAME]]... [--replicas N] [--max-loras K] [--max-adapters-per-tenant N] [--accept-workers [--worker-token T]]
  skein gateway [--addr …] [--data …] [--state postgres://…] [--worker-token T]   (replicas come from workers)
  skein worker --gateway URL --model DIR --worker-token T [--data DIR] [--name NAME] [--max-loras K] [--addr 127.0.0.1:0]
  skein model init-tiny DIR [--arch llama|qwen2|qwen3|qwen3_vl|qwen3_5|qwen3_5_text|qwen3_moe|qwen3_5_moe] [--preset tiny|tiny-quant|tiny-moe|small|1b|8b|qwen3_5-4b|qwen3-30b-a3b|qwen3_5-35b-a3b] [--seed N]
  skein model to-gguf DIR OUT.gguf [--type f32|f16|bf16|q8_0|q4_k|q6_k|q4_k_m] [--name NAME]
  skein model export-gguf CHECKPOINT_DIR OUT.gguf --base MODEL   (a LoRA adapter for llama.cpp / Ollama)
  skein model export-peft CHECKPOINT_DIR OUT_DIR --base MODEL    (experts' LoRAs expanded per expert, for PEFT / vLLM)
  skein bench engine --model DIR [--batch 8] [--seq 256] [--rank 16] [--json]
  skein bench serve --workload FILE [--url http://127.0.0.1:8000] [--key KEY] [--json]   (loads a running server: workloads/*.json)
  skein keys create --name NAME [--admin] | list | revoke ID   [--data DIR | --state postgres://…]
  skein version

  skein COMMAND --help lists a command's flags, each with its SKEIN_* variable and default.
`

func main() {
	if err := run(os.Args[1:]); err != nil {
		reportError(err)
		os.Exit(1)
	}
}

// reportError writes the error that ends the process: through its logger once one is set up
// (a JSON line with --log-format json), plainly before.
func reportError(err error) {
	if processLog != nil {
		processLog.Error("skein exits", "err", err)
		return
	}
	fmt.Fprintln(os.Stderr, "skein:", err)
}

func run(args []string) error {
	err := runCommand(args)
	if errors.Is(err, flag.ErrHelp) {
		return nil // --help printed the usage: a success
	}
	return err
}

func runCommand(args []string) error {
	if len(args) == 0 {
		fmt.Print(usage)
		return errors.New("no command")
	}
	switch args[0] {
	case "serve":
		return serve(args[1:], false)
	case "gateway":
		return serve(args[1:], true)
	case "worker":
		return runWorker(args[1:])
	case "version", "--version", "-version":
		fmt.Fprintln(usageOutput, versionString())
		return nil
	case "model":
		if len(args) == 2 && isHelp(args[1]) {
			fmt.Fprintln(usageOutput, "usage: skein model init-tiny DIR [flags] (see skein model init-tiny --help)")
			return nil
		}
		if len(args) >= 2 && args[1] == "to-gguf" {
			return toGGUF(args[2:])
		}
		if len(args) >= 2 && args[1] == "export-gguf" {
			return exportGGUF(args[2:])
		}
		if len(args) >= 2 && args[1] == "export-peft" {
			return exportPEFT(args[2:])
		}
		if len(args) < 2 || args[1] != "init-tiny" {
			return errors.New("usage: skein model init-tiny DIR [--arch A] [--preset P] | to-gguf DIR OUT.gguf | export-gguf CHECKPOINT OUT.gguf --base MODEL | export-peft CHECKPOINT OUT_DIR --base MODEL")
		}
		return initTiny(args[2:])
	case "bench":
		if len(args) == 2 && isHelp(args[1]) {
			fmt.Fprintln(usageOutput, "usage: skein bench engine --model DIR [flags] (see skein bench engine --help)\n       skein bench serve --workload FILE [--url URL] [flags] (see skein bench serve --help)")
			return nil
		}
		if len(args) >= 2 && args[1] == "serve" {
			return benchServe(args[2:])
		}
		if len(args) < 2 || args[1] != "engine" {
			return errors.New("usage: skein bench engine --model DIR, or skein bench serve --workload FILE")
		}
		return benchEngine(args[2:])
	case "keys":
		return keysCommand(args[1:], usageOutput, os.Stderr)
	case "help", "-h", "-help", "--help":
		fmt.Fprint(usageOutput, usage)
		return nil
	}
	return fmt.Errorf("unknown command %q\n%s", args[0], usage)
}

// isHelp says whether a subcommand's argument asks for its usage.
func isHelp(arg string) bool {
	return arg == "help" || arg == "-h" || arg == "-help" || arg == "--help"
}

// envDefault reads SKEIN_<NAME> for a flag default.
func envDefault(name, def string) string {
	if v := os.Getenv("SKEIN_" + strings.ToUpper(name)); v != "" {
		return v
	}
	return def
}

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

// splitFlags lets flags and positional arguments come in any order.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

func initTiny(args []string) error {
	fs := flag.NewFlagSet("init-tiny", flag.ContinueOnError)
	arch := fs.String("arch", "qwen3", "llama, qwen2, qwen3, qwen3_vl, qwen3_5, qwen3_5_text, qwen3_moe or qwen3_5_moe")
	preset := fs.String("preset", "tiny", "tiny, tiny-quant, tiny-moe, tiny-quant-moe, small, small-moe, 1b, 8b (Llama-3.1-8B's shape, with --arch llama), qwen3_5-4b (Qwen3.5-4B's shape, with --arch qwen3_5), qwen3-30b-a3b (with --arch qwen3_moe) or qwen3_5-35b-a3b (with --arch qwen3_5_moe)")
	seed := fs.Uint64("seed", 1, "random seed")
	pos, err := parseArgs(fs, args, "skein model init-tiny DIR [flags]")
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return errors.New("usage: skein model init-tiny DIR [--arch llama|qwen2|qwen3|qwen3_vl|qwen3_5|qwen3_5_text] [--preset tiny|tiny-quant|small|1b|8b|qwen3_5-4b]")
	}
	// Progress on stderr (the 1b preset takes a while); the result line stays on stdout.
	if err := engine.InitTinyLogged(pos[0], engine.Arch(*arch), *preset, *seed, slog.New(slog.NewTextHandler(os.Stderr, nil))); err != nil {
		return err
	}
	fmt.Printf("wrote %s model (%s preset) to %s\n", *arch, *preset, pos[0])
	return nil
}

// serve runs the gateway; with gatewayOnly it loads no model and waits for workers.
func serve(args []string, gatewayOnly bool) error {
	cfg, err := parseServeConfig(args)
	if err != nil {
		return err
	}
	mode, err := authMode(cfg.Auth, cfg.Addr)
	if err != nil {
		return err
	}
	log, notes, err := cfg.Log.setupLog()
	if err != nil {
		return err
	}
	if err := checkServeConfig(cfg); err != nil { // before any model is generated or loaded
		return err
	}
	cleanScratch, err := scratchData(cfg, gatewayOnly)
	if err != nil {
		return err
	}
	defer cleanScratch()
	// The address is taken before the models load, so that a port in use fails at once rather
	// than after minutes of loading; while they load, every request is answered at once with a
	// 503 saying so (loadingHandler), /api/v1/healthz included.
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return err
	}
	defer ln.Close()
	front := &switchHandler{}
	front.set(loadingHandler(time.Now()))
	hs := cfg.Limits.httpServer(cfg.Addr, front)
	defer hs.Close() // a load that fails ends here; after a shutdown, this does nothing
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(cfg.Limits.listener(ln, hs.Handler)) }()
	beforeLoad()
	if !gatewayOnly {
		if err := setupKernels(log); err != nil {
			return err
		}
	}
	if err = os.MkdirAll(cfg.Data, 0o755); err != nil {
		return err
	}
	st, closeState, err := openState(cfg.State)
	if err != nil {
		return err
	}
	defer closeState()
	discovering := cfg.Discover.Mode != "" && cfg.Discover.Mode != "register"
	token, err := settleWorkerToken(gatewayOnly || cfg.AcceptWorkers || discovering, cfg.Data, cfg.WorkerToken, cfg.Addr, st, notes)
	if err != nil {
		return err
	}
	models, err := servedModels(cfg, gatewayOnly, log)
	if err != nil {
		return err
	}
	stor, err := storage.Open(context.Background(), cfg.Storage, cfg.Data, cfg.S3Endpoint)
	if err != nil {
		return fmt.Errorf("--storage: %w", err)
	}
	log.Info("adapters, checkpoints and sampler weights are stored in", "storage", stor.String())
	reps, err := loadReplicas(cfg, models, stor, log)
	if err != nil {
		return err
	}
	w, err := parseWeights(cfg.RouterWeights)
	if err != nil {
		return err
	}
	disc, err := cfg.Discover.source(log)
	if err != nil {
		return err
	}
	srv, err := gateway.New(cfg.Limits.apply(gateway.Options{DataDir: cfg.Data, MaxBodyBytes: cfg.MaxBodyBytes, Logger: log, Store: st, Storage: stor,
		QueueTimeout: cfg.QueueTimeout, WorkerToken: token, AcceptWorkers: gatewayOnly || cfg.AcceptWorkers, FutureTTL: cfg.FutureTTL,
		SessionTimeout: cfg.SessionTimeout, MaxAdaptersPerTenant: cfg.MaxAdaptersPerTenant, Weights: w, Auth: mode, PublicURL: cfg.PublicURL,
		ImageDir: cfg.ImageDir, SamplerCopies: cfg.SamplerCopies, Discovery: disc,
		AdvertiseURL: cfg.AdvertiseURL, RunLeaseTTL: cfg.RunLeaseTTL}), reps...)
	if err != nil {
		return err
	}
	defer srv.Close()
	return runHTTP(cfg, srv, hs, front, errc, ln, log, mode)
}

// beforeLoad runs before the models are generated and loaded: a test holds the load there.
var beforeLoad = func() {}

// switchHandler serves the handler set last: the loading answer, then the server.
type switchHandler struct{ h atomic.Pointer[http.Handler] }

func (s *switchHandler) set(h http.Handler) { s.h.Store(&h) }
func (s *switchHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	(*s.h.Load()).ServeHTTP(w, r)
}

// loadingHandler answers every request while the models load: 503, Retry-After, and a message
// (JSON, in the API's error shape, with status "loading" for a health probe). Nothing is read or
// changed: the client retries.
func loadingHandler(since time.Time) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		msg := fmt.Sprintf("skein is loading its model (for %s so far): it answers once the model is loaded; retry in a few seconds",
			time.Since(since).Round(time.Second))
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Retry-After", "5")
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(http.StatusServiceUnavailable)
		_ = json.NewEncoder(w).Encode(map[string]string{"status": "loading", "detail": msg, "message": msg})
	})
}

// checkServeConfig refuses the settings that can be refused without touching a model.
func checkServeConfig(cfg *serveConfig) error {
	if err := engine.CheckPrecision(cfg.Precision); err != nil {
		return err
	}
	if _, err := engine.ParseActivations(cfg.Activations); err != nil {
		return err
	}
	if cfg.Replicas < 1 || cfg.MaxLoras < 1 {
		return errors.New("--replicas and --max-loras must be at least 1")
	}
	if cfg.SamplerCopies < 1 || cfg.SamplerCopies > 4096 {
		return fmt.Errorf("--sampler-copies %d: must be in [1, 4096]", cfg.SamplerCopies)
	}
	if cfg.StepMemoryMB < 1 {
		return errors.New("--step-memory-mb must be at least 1")
	}
	if err := checkKVCacheMB(cfg.KVCacheMB); err != nil {
		return err
	}
	if cfg.PrefillChunk < 16 || cfg.PrefillChunk > engine.MaxPrefillChunk {
		return fmt.Errorf("--prefill-chunk %d: must be in [16, %d]", cfg.PrefillChunk, engine.MaxPrefillChunk)
	}
	return cfg.Limits.check()
}

// servedModels is the model directories to serve: --model's, or with none (and not a bare
// gateway) the tiny model, generated into the data directory the first time.
func servedModels(cfg *serveConfig, gatewayOnly bool, log *slog.Logger) ([]string, error) {
	models := cfg.Models
	if len(models) > 0 || gatewayOnly {
		return models, nil
	}
	dir := filepath.Join(cfg.Data, "models", "tiny-qwen3")
	if _, err := os.Stat(filepath.Join(dir, "config.json")); err != nil {
		log.Info("no --model given: generating the tiny model", "dir", dir)
		if err := engine.InitTinyLogged(dir, engine.ArchQwen3, "tiny", 1, log); err != nil {
			return nil, err
		}
	}
	if err := engine.AddTinyChatTemplate(dir); err != nil { // a data dir from before chat templates
		return nil, err
	}
	return append(models, dir), nil
}

// loadReplicas loads each model once and serves it by --replicas replicas sharing its weights.
func loadReplicas(cfg *serveConfig, models []string, stor storage.Storage, log *slog.Logger) ([]*replica.Replica, error) {
	var reps []*replica.Replica
	seen := map[string]bool{}
	for i, dir := range models {
		name := ""
		if i < len(cfg.Names) {
			name = cfg.Names[i]
		}
		start := time.Now()
		e, name, err := loadModel(dir, name, engine.Options{MaxStepBytes: cfg.StepMemoryMB << 20, KVCacheMB: cfg.KVCacheMB, PrefillChunk: cfg.PrefillChunk, Precision: cfg.Precision, GGMLActivations: cfg.Activations == engine.ActivationsGGML, Device: cfg.Device, Logger: log})
		if err != nil {
			return nil, err
		}
		if seen[name] {
			return nil, fmt.Errorf("two models named %q: use --name", name)
		}
		seen[name] = true
		for k := range cfg.Replicas {
			eng := e
			if k > 0 {
				eng = e.Fork() // same weights in memory, its own adapters
			}
			var c engine.Compute = eng
			if stor != nil && storage.Local(stor) == "" { // object storage: the engine's files are copied through scratch
				sc, err := replica.NewStored(eng, stor, cfg.Data, filepath.Join(cfg.Data, "scratch"))
				if err != nil {
					return nil, err
				}
				c = sc
			}
			rep := replica.New(fmt.Sprintf("%s-%d", name, k), name, c, cfg.MaxLoras)
			rep.SetContinuousBatching(cfg.ContinuousBatching)
			reps = append(reps, rep)
		}
		log.Info("loaded base model", "name", name, "dir", dir, "arch", e.Config.Arch, "device", e.Device(), "replicas", cfg.Replicas,
			"max_loras", cfg.MaxLoras, "took", time.Since(start).Round(time.Millisecond))
	}
	return reps, nil
}

// openState opens --state's PostgreSQL (nil store, the gateway's SQLite, without one).
func openState(state string) (store.Store, func(), error) {
	if state == "" {
		return nil, func() {}, nil
	}
	if !strings.HasPrefix(state, "postgres://") && !strings.HasPrefix(state, "postgresql://") {
		return nil, nil, fmt.Errorf("--state: want a postgres:// URL, got %q", state)
	}
	pg, err := store.OpenPostgres(state)
	if err != nil {
		return nil, nil, err
	}
	return pg, func() { pg.Close() }, nil
}

// runHTTP serves srv on ln until it fails or a signal asks for a graceful shutdown.
// hs already serves ln (answering "loading" through front); from here front serves srv.
func runHTTP(cfg *serveConfig, srv *gateway.Server, hs *http.Server, front *switchHandler, errc <-chan error, ln net.Listener, log *slog.Logger, mode string) error {
	var handler http.Handler = srv
	if cfg.Record != "" {
		var err error
		if handler, err = gateway.Recorder(srv, cfg.Record); err != nil {
			return err
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	front.set(handler)
	log.Info("skein serving the Tinker API", "addr", "http://"+ln.Addr().String(), "data", cfg.Data, "auth", mode)
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	return shutdownOnSignal(ctx, hs, log, cfg.ShutdownTimeout, srv.Close)
}

// parseWeights reads "capacity=4,queue=1,held=2" (any subset; the rest keep their defaults).
func parseWeights(s string) (router.Weights, error) {
	var w router.Weights
	if s == "" {
		return w, nil
	}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		f, err := strconv.ParseFloat(v, 64)
		if !ok || err != nil || f <= 0 {
			return w, fmt.Errorf("--router-weights: %q is not name=positive-number", kv)
		}
		switch k {
		case "capacity":
			w.Capacity = f
		case "queue":
			w.QueueDepth = f
		case "held":
			w.Held = f
		default:
			return w, fmt.Errorf("--router-weights: unknown scorer %q (capacity, queue, held)", k)
		}
	}
	return w, nil
}
