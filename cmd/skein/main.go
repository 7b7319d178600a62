// Command skein is the one binary: serve, model, bench.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/skein-ai/skein/engine"
	"github.com/skein-ai/skein/gateway"
	"github.com/skein-ai/skein/replica"
	"github.com/skein-ai/skein/router"
	"github.com/skein-ai/skein/store"
)

const usage = `skein: multi-tenant LoRA fine-tuning and sampling (Tinker API)

  skein serve [--addr 127.0.0.1:8000] [--data ./skein-data] [--model DIR [--name NAME]]... [--replicas N] [--max-loras K] [--accept-workers [--worker-token T]]
  skein gateway [--addr …] [--data …] [--state postgres://…] [--worker-token T]   (replicas come from workers)
  skein worker --gateway URL --model DIR --worker-token T [--data DIR] [--name NAME] [--max-loras K] [--addr 127.0.0.1:0]
  skein model init-tiny DIR [--arch llama|qwen2|qwen3] [--preset tiny|small] [--seed N]
  skein bench engine --model DIR [--batch 8] [--seq 256] [--rank 16] [--json]
  skein keys create --name NAME [--admin] | list | revoke ID   [--data DIR | --state postgres://…]
`

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "skein:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
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
	case "model":
		if len(args) < 2 || args[1] != "init-tiny" {
			return errors.New("usage: skein model init-tiny DIR [--arch A] [--preset P]")
		}
		return initTiny(args[2:])
	case "bench":
		if len(args) < 2 || args[1] != "engine" {
			return errors.New("usage: skein bench engine --model DIR")
		}
		return benchEngine(args[2:])
	case "keys":
		return keysCommand(args[1:], os.Stdout, os.Stderr)
	case "help", "-h", "--help":
		fmt.Print(usage)
		return nil
	}
	return fmt.Errorf("unknown command %q\n%s", args[0], usage)
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
	arch := fs.String("arch", "qwen3", "llama, qwen2 or qwen3")
	preset := fs.String("preset", "tiny", "tiny or small")
	seed := fs.Uint64("seed", 1, "random seed")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return errors.New("usage: skein model init-tiny DIR [--arch llama|qwen2|qwen3] [--preset tiny|small]")
	}
	if err := engine.InitTiny(pos[0], engine.Arch(*arch), *preset, *seed); err != nil {
		return err
	}
	fmt.Printf("wrote %s model (%s preset) to %s\n", *arch, *preset, pos[0])
	return nil
}

// serve runs the gateway; with gatewayOnly it loads no model and waits for workers.
func serve(args []string, gatewayOnly bool) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	addr := fs.String("addr", envDefault("addr", "127.0.0.1:8000"), "listen address")
	data := fs.String("data", envDefault("data", "./skein-data"), "data directory")
	var models, names multiFlag
	fs.Var(&models, "model", "Hugging Face model directory (repeatable); default: a generated tiny model")
	fs.Var(&names, "name", "base-model name clients use for the matching --model (default: directory name)")
	maxBody := fs.Int64("max-body-bytes", 64<<20, "largest request body")
	nReplicas := fs.Int("replicas", 1, "replicas of each base model in this process (they share one copy of the base weights)")
	maxLoras := fs.Int("max-loras", replica.DefaultMaxLoras, "LoRA adapter slots per replica")
	stepMemory := fs.Int("step-memory-mb", 4096, "activation memory one training pass may hold; bigger batches run in chunks")
	precision := fs.String("precision", envDefault("precision", engine.PrecisionF32), "base weights in memory: f32, or bf16 (half the memory, widened per product)")
	queueTimeout := fs.Duration("queue-timeout", 10*time.Minute, "how long an op waits for a free LoRA slot")
	futureTTL := fs.Duration("future-ttl", 24*time.Hour, "how long request results are kept")
	sessionTimeout := fs.Duration("session-timeout", 5*time.Minute, "sessions without a heartbeat for this long expire")
	maxPerTenant := fs.Int("tenant-max-loras", 30, "live adapters per tenant")
	weights := fs.String("router-weights", "", "router scorer weights, e.g. capacity=4,queue=1,held=2")
	fs.String("config", "", "YAML file of flag: value settings (also SKEIN_CONFIG)")
	workerToken := fs.String("worker-token", envDefault("worker_token", ""), "shared secret of workers (register, heartbeat, calls)")
	stateURL := fs.String("state", envDefault("state", ""), "state store: empty for SQLite in the data directory, or a postgres:// URL shared by several gateways")
	auth := fs.String("auth", envDefault("auth", ""), "open (any key is a tenant; loopback only, the default there) or keys (keys from `skein keys create`)")
	publicURL := fs.String("public-url", envDefault("public_url", ""), "base URL clients reach this server at, used in download links (default: the listen address when it is loopback)")
	record := fs.String("record", "", "append every request and response to this JSONL file (for replay tests)")
	acceptWorkers := fs.Bool("accept-workers", false, "let `skein worker` processes register (skein gateway always does); without --worker-token a cluster token is generated into the data directory")
	limits := addLimitFlags(fs)
	if err := applyConfigFile(fs, args); err != nil {
		return err
	}
	if _, err := parseInterspersed(fs, args); err != nil {
		return err
	}
	mode, err := authMode(*auth, *addr)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err = os.MkdirAll(*data, 0o755); err != nil {
		return err
	}
	token, err := settleWorkerToken(gatewayOnly || *acceptWorkers, *data, *workerToken, *addr, os.Stderr)
	if err != nil {
		return err
	}
	if len(models) == 0 && !gatewayOnly {
		dir := filepath.Join(*data, "models", "tiny-qwen3")
		if _, err := os.Stat(filepath.Join(dir, "config.json")); err != nil {
			log.Info("no --model given: generating the tiny model", "dir", dir)
			if err := engine.InitTiny(dir, engine.ArchQwen3, "tiny", 1); err != nil {
				return err
			}
		}
		models = append(models, dir)
	}
	if *nReplicas < 1 || *maxLoras < 1 {
		return errors.New("--replicas and --max-loras must be at least 1")
	}
	if *stepMemory < 1 {
		return errors.New("--step-memory-mb must be at least 1")
	}
	if err := limits.check(); err != nil {
		return err
	}
	var reps []*replica.Replica
	names2 := map[string]bool{}
	for i, dir := range models {
		name := filepath.Base(filepath.Clean(dir))
		if i < len(names) {
			name = names[i]
		}
		start := time.Now()
		e, err := engine.Load(dir, engine.Options{MaxStepBytes: *stepMemory << 20, Precision: *precision})
		if err != nil {
			return err
		}
		if names2[name] {
			return fmt.Errorf("two models named %q: use --name", name)
		}
		names2[name] = true
		for k := range *nReplicas {
			eng := e
			if k > 0 {
				eng = e.Fork() // same weights in memory, its own adapters
			}
			reps = append(reps, replica.New(fmt.Sprintf("%s-%d", name, k), name, eng, *maxLoras))
		}
		log.Info("loaded base model", "name", name, "dir", dir, "arch", e.Config.Arch, "replicas", *nReplicas,
			"max_loras", *maxLoras, "took", time.Since(start).Round(time.Millisecond))
	}
	var st store.Store
	if *stateURL != "" {
		if !strings.HasPrefix(*stateURL, "postgres://") && !strings.HasPrefix(*stateURL, "postgresql://") {
			return fmt.Errorf("--state: want a postgres:// URL, got %q", *stateURL)
		}
		pg, err := store.OpenPostgres(*stateURL)
		if err != nil {
			return err
		}
		defer pg.Close()
		st = pg
	}
	w, err := parseWeights(*weights)
	if err != nil {
		return err
	}
	srv, err := gateway.New(limits.apply(gateway.Options{DataDir: *data, MaxBodyBytes: *maxBody, Logger: log, Store: st,
		QueueTimeout: *queueTimeout, WorkerToken: token, AcceptWorkers: gatewayOnly || *acceptWorkers, FutureTTL: *futureTTL,
		SessionTimeout: *sessionTimeout, MaxLoras: *maxPerTenant, Weights: w, Auth: mode, PublicURL: *publicURL}), reps...)
	if err != nil {
		return err
	}
	defer srv.Close()
	var handler http.Handler = srv
	if *record != "" {
		if handler, err = gateway.Recorder(srv, *record); err != nil {
			return err
		}
	}
	hs := limits.httpServer(*addr, handler)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	errc := make(chan error, 1)
	go func() { errc <- hs.ListenAndServe() }()
	log.Info("skein serving the Tinker API", "addr", "http://"+*addr, "data", *data, "auth", mode)
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return hs.Shutdown(shutdown)
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
