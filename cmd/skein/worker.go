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
	"github.com/skein-ai/skein/engine/imageproc"
	"github.com/skein-ai/skein/replica"
	"github.com/skein-ai/skein/storage"
	"github.com/skein-ai/skein/worker"
)

// runWorker serves one replica of a model to a gateway: it registers, heartbeats every second,
// and runs the gateway's calls on its engine. Checkpoint and state paths in the calls are on
// storage it shares with the gateway.
// workerConfig is the whole configuration of `skein worker`, one field per flag.
type workerConfig struct {
	Gateway, Model, Name   string
	MaxLoras, StepMemoryMB int
	KVCacheMB              int
	Precision, Addr        string
	Device                 string
	Activations            string
	WorkerToken, Data      string
	Config, ImageDir       string
	Storage, S3Endpoint    string
	ShutdownTimeout        time.Duration
	DrainDelay             time.Duration
	Log                    logConfig
}

// workerFlags defines the worker's flags, each with its default once.
func workerFlags() (*flag.FlagSet, *workerConfig) {
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	c := &workerConfig{}
	fs.StringVar(&c.Gateway, "gateway", "", "gateway base URL to register with, e.g. http://127.0.0.1:8000 (empty: wait to be discovered by a gateway started with --discover)")
	fs.StringVar(&c.Model, "model", "", "Hugging Face model directory, a hub cache entry models--Org--Name (its refs/main snapshot), a GGUF file or an Ollama manifest")
	fs.StringVar(&c.Name, "name", "", "base-model name (default: the directory name, Org/Name for a hub cache entry or snapshot)")
	fs.IntVar(&c.MaxLoras, "max-loras", replica.DefaultMaxLoras, "LoRA adapter slots")
	fs.IntVar(&c.StepMemoryMB, "step-memory-mb", 4096, "activation memory one training pass may hold; bigger batches run in chunks")
	fs.IntVar(&c.KVCacheMB, "kv-cache-mb", DefaultKVCacheMB, "memory each base model's sampler keeps for prompts' keys and values across requests (a later prompt starting with a cached prefix, on the same weights, prefills only the rest; the least recently used go first); 0: off")
	fs.StringVar(&c.Activations, "activations", engine.ActivationsF32, "forward products of quantized base weights: f32 (float32 activations times the dequantized blocks) or ggml (activations rounded to Q8_0/Q8_K blocks and integer dots, as llama.cpp's CPU backend: its logits on the same GGUF; slower)")
	fs.StringVar(&c.Device, "device", "auto", "where the engine computes: auto (the first working NVIDIA GPU, else the CPU), cpu, cuda or cuda:N; the CUDA backend does not run the model yet, so auto computes on the CPU (logging why) and cuda is refused")
	fs.StringVar(&c.Precision, "precision", engine.PrecisionF32, "base weights in memory: f32; bf16 (half the memory; products in bf16 where the CPU has AVX512_BF16, else widened); q8_0, q6_k or q4_k (projections in GGUF Q8_0, Q6_K or Q4_K blocks, about a quarter, a fifth or an eighth of f32); q4_k_m (llama.cpp's Q4_K_M mix: Q4_K with Q6_K for the head and some layers' v and down projections); LoRA, norms and gradients in f32")
	fs.StringVar(&c.Addr, "addr", "127.0.0.1:0", "listen address for the gateway's calls")
	fs.StringVar(&c.WorkerToken, "worker-token", "", "the gateway's cluster token (default: DATA/worker-token, if the data directory has one)")
	fs.StringVar(&c.Data, "data", "./skein-data", "the data directory shared with the gateway (without --storage): checkpoint loads and saves stay inside it; with --storage s3://…, scratch space for copies")
	fs.StringVar(&c.Storage, "storage", "", "the gateway's --storage: empty for the data directory shared with it, or s3://bucket/prefix (then nothing is shared but the bucket)")
	fs.StringVar(&c.S3Endpoint, "s3-endpoint", "", "address of an S3-compatible server for --storage s3://…: http(s)://host:port")
	fs.StringVar(&c.Config, "config", "", "YAML file of flag-name: value settings")
	fs.StringVar(&c.ImageDir, "image-dir", "", "directory image_asset_pointer chunks may name files in (empty: file pointers refused)")
	fs.DurationVar(&c.ShutdownTimeout, "shutdown-timeout", 10*time.Second, "on SIGINT or SIGTERM, how long calls in flight may finish before their connections are closed")
	fs.DurationVar(&c.DrainDelay, "drain-delay", 0, "on SIGINT or SIGTERM, how long the worker keeps serving while /readyz fails and it reports draining, so that gateways stop placing adapters on it first (Kubernetes: a few seconds)")
	c.Log.register(fs)
	return fs, c
}

// workerHTTPServer is the server of a worker's calls. No read or write timeout: one call can
// compute for minutes. Idle connections are closed, and call bodies must come at least rate
// bytes/s after grace (the gateway sends at network speed; anyone else reaching the port is cut
// as on the gateway). No connection caps: the worker's one legitimate client, the gateway,
// holds many connections from one address, and the cluster token already refuses everyone else's
// calls.
func workerHTTPServer(h http.Handler, rate int, grace time.Duration) *http.Server {
	return &http.Server{Handler: minRateBodies(h, rate, grace, 0), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
}

const workerSynopsis = "skein worker [--gateway URL] --model DIR --worker-token T [flags]"

func runWorker(args []string) error {
	fs, c := workerFlags()
	if _, err := parseSettings(fs, args, workerSynopsis); err != nil {
		return err
	}
	// Signals are caught from the start: a SIGTERM while the model loads, or in the moment after
	// the server's first ready answer, must end the worker cleanly, not kill it.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	gw, model, name, token, data, maxLoras := &c.Gateway, &c.Model, &c.Name, &c.WorkerToken, &c.Data, &c.MaxLoras
	ggmlAct, err := checkWorkerConfig(c)
	if err != nil {
		return err
	}
	log, _, err := c.Log.setupLog()
	if err != nil {
		return err
	}
	// The address first, as serve does: a port in use fails before the model loads.
	ln, err := net.Listen("tcp", c.Addr)
	if err != nil {
		return err
	}
	defer ln.Close()
	if err := setupKernels(log); err != nil {
		return err
	}
	// The base model's name: --name, or as resolveModel names --model (a Hugging Face cache
	// entry's Org/Name, else the directory's name).
	e, served, err := loadModel(*model, *name, engine.Options{MaxStepBytes: c.StepMemoryMB << 20, KVCacheMB: c.KVCacheMB, Precision: c.Precision, GGMLActivations: ggmlAct, Device: c.Device, Logger: log})
	if err != nil {
		return err
	}
	*name = served
	log.Info("loaded base model", "name", served, "device", e.Device())
	if ctx.Err() != nil {
		log.Info("a signal came while the model loaded; exiting without serving")
		return nil
	}
	url := "http://" + ln.Addr().String()
	ctx0 := context.Background()
	ws := worker.NewServer(e, *token, *data)
	if err := useWorkerStorage(ctx0, ws, c, e, log); err != nil {
		return err
	}
	ws.SetIdentity(*name, *maxLoras)
	hs := workerHTTPServer(ws, defaultMinBodyRate, defaultMinBodyRateGrace)
	go func() { _ = hs.Serve(ln) }()
	reg := worker.Registration{ID: worker.ID(*name, ln.Addr().String()), URL: url, Instance: ws.Instance(), BaseModel: *name, MaxLoras: *maxLoras, Info: e.Info()}
	// The registration loop outlives the signal by the drain: its heartbeats then say draining.
	announce, endAnnounce := context.WithCancel(context.Background())
	defer endAnnounce()
	announced := make(chan struct{})
	if *gw != "" {
		log.Info("skein worker serving", "id", reg.ID, "url", url, "gateway", *gw)
		go func() {
			defer close(announced)
			worker.Announce(announce, *gw, *token, reg, func() worker.Heartbeat { return ws.Status(*maxLoras) }, log)
		}()
	} else {
		close(announced)
		log.Info("skein worker serving, waiting to be discovered", "url", url, "base_model", *name)
	}
	<-ctx.Done()
	drainWorker(ws, c.DrainDelay, log)
	endAnnounce()
	<-announced
	return shutdownOnSignal(ctx, hs, log, c.ShutdownTimeout, func() {})
}

// checkWorkerConfig refuses a worker's settings before anything starts (and reads the cluster
// token from the data directory when none was given); it returns Options.GGMLActivations.
func checkWorkerConfig(c *workerConfig) (ggmlAct bool, err error) {
	if c.Model == "" {
		return false, errors.New("usage: " + workerSynopsis + " (see skein worker --help)")
	}
	if err := imageproc.CheckImageDir(c.ImageDir); err != nil {
		return false, err
	}
	if c.WorkerToken == "" {
		t, err := readToken(filepath.Join(c.Data, tokenFile))
		if err != nil {
			return false, fmt.Errorf("a worker needs the gateway's cluster token: --worker-token T or SKEIN_WORKER_TOKEN (a gateway given none writes one to DATA/%s): %w", tokenFile, err)
		}
		c.WorkerToken = t
	}
	if c.StepMemoryMB < 1 {
		return false, errors.New("--step-memory-mb must be at least 1")
	}
	if err := checkKVCacheMB(c.KVCacheMB); err != nil {
		return false, err
	}
	if c.DrainDelay < 0 || c.DrainDelay > 10*time.Minute {
		return false, errors.New("--drain-delay must be in [0, 10m]")
	}
	if err := engine.CheckPrecision(c.Precision); err != nil {
		return false, err
	}
	return engine.ParseActivations(c.Activations)
}

// useWorkerStorage points the worker's adapters at --storage (none: the data directory, as
// before) and, on object storage, publishes the model's tokenizer files there for gateways.
func useWorkerStorage(ctx context.Context, ws *worker.Server, c *workerConfig, e *engine.Engine, log *slog.Logger) error {
	if c.Storage == "" {
		return nil
	}
	st, err := storage.Open(ctx, c.Storage, c.Data, c.S3Endpoint)
	if err != nil {
		return fmt.Errorf("--storage: %w", err)
	}
	if err := ws.UseStorage(st, filepath.Join(c.Data, "scratch")); err != nil {
		return fmt.Errorf("--storage: %w", err)
	}
	if storage.Local(st) == "" {
		// In the background, retried: the bucket may come up after the worker, and the worker
		// serves training without it (only a gateway's tokenizer endpoint waits for it).
		go publishModelFiles(ctx, st, c.Name, e.Dir, log)
	}
	log.Info("adapters load and save in storage", "storage", st.String())
	return nil
}

// publishModelFiles copies the model's tokenizer files into storage, retrying every few seconds
// for up to ten minutes while the storage cannot be reached.
func publishModelFiles(ctx context.Context, st storage.Storage, name, dir string, log *slog.Logger) {
	deadline := time.Now().Add(10 * time.Minute)
	for {
		err := worker.PublishModelFiles(ctx, st, name, dir)
		if err == nil {
			log.Info("published the model's tokenizer files", "storage", st.String(), "model", name)
			return
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			log.Error("could not publish the model's tokenizer files; a gateway without the model cannot serve its tokenizer", "err", err)
			return
		}
		log.Warn("publishing the model's tokenizer files failed; retrying", "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(3 * time.Second):
		}
	}
}

// drainWorker marks the worker as leaving (/readyz fails, its status and heartbeats say
// draining) and keeps serving for delay, so that gateways place nothing new on it and move what
// they can before its connections close.
func drainWorker(ws *worker.Server, delay time.Duration, log *slog.Logger) {
	ws.Drain()
	if delay <= 0 {
		return
	}
	log.Info("draining: readiness fails; serving calls for the drain delay", "delay", delay)
	time.Sleep(delay)
}
