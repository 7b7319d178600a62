package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/skein-ai/skein/engine"
	"github.com/skein-ai/skein/replica"
	"github.com/skein-ai/skein/worker"
)

// runWorker serves one replica of a model to a gateway: it registers, heartbeats every second,
// and runs the gateway's calls on its engine. Checkpoint and state paths in the calls are on
// storage it shares with the gateway.
func runWorker(args []string) error {
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	gw := fs.String("gateway", envDefault("gateway", ""), "gateway base URL, e.g. http://127.0.0.1:8000")
	model := fs.String("model", "", "Hugging Face model directory")
	name := fs.String("name", "", "base-model name (default: the directory name)")
	maxLoras := fs.Int("max-loras", replica.DefaultMaxLoras, "LoRA adapter slots")
	stepMemory := fs.Int("step-memory-mb", 4096, "activation memory one training pass may hold; bigger batches run in chunks")
	precision := fs.String("precision", envDefault("precision", engine.PrecisionF32), "base weights in memory: f32, or bf16 (half the memory, widened per product)")
	addr := fs.String("addr", "127.0.0.1:0", "listen address for the gateway's calls")
	token := fs.String("worker-token", envDefault("worker_token", ""), "the gateway's cluster token (default: DATA/worker-token, if the data directory has one)")
	data := fs.String("data", envDefault("data", "./skein-data"), "the data directory shared with the gateway: checkpoint loads and saves stay inside it")
	fs.String("config", "", "YAML file of flag: value settings (also SKEIN_CONFIG)")
	if err := applyConfigFile(fs, args); err != nil {
		return err
	}
	if _, err := parseInterspersed(fs, args); err != nil {
		return err
	}
	if *gw == "" || *model == "" {
		return errors.New("usage: skein worker --gateway URL --model DIR --worker-token T [--data DIR] [--max-loras K]")
	}
	if *token == "" {
		t, err := readToken(filepath.Join(*data, tokenFile))
		if err != nil {
			return fmt.Errorf("a worker needs the gateway's cluster token: --worker-token T or SKEIN_WORKER_TOKEN (a gateway given none writes one to DATA/%s): %w", tokenFile, err)
		}
		*token = t
	}
	if *name == "" {
		*name = filepath.Base(filepath.Clean(*model))
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if *stepMemory < 1 {
		return errors.New("--step-memory-mb must be at least 1")
	}
	e, err := engine.Load(*model, engine.Options{MaxStepBytes: *stepMemory << 20, Precision: *precision})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	url := "http://" + ln.Addr().String()
	ws := worker.NewServer(e, *token, *data)
	// No read or write timeout: one call can compute for minutes. Idle connections are closed.
	hs := &http.Server{Handler: ws, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
	go func() { _ = hs.Serve(ln) }()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	reg := worker.Registration{ID: worker.ID(*name, ln.Addr().String()), URL: url, BaseModel: *name, MaxLoras: *maxLoras, Info: e.Info()}
	log.Info("skein worker serving", "id", reg.ID, "url", url, "gateway", *gw)
	worker.Announce(ctx, *gw, *token, reg, func() worker.Heartbeat { return ws.Status(*maxLoras) }, log)
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return hs.Shutdown(shutdown)
}
