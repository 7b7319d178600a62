package main

import (
	"fmt"
	"log/slog"
	"os"
	"runtime"

	"github.com/skein-ai/skein/engine"
)

// setupKernels applies SKEIN_GEMM (auto, avx2, avx512, avx512bf16, amx; unset: auto) before any
// engine runs and logs the path once: the path chosen, those this CPU has, and every kernel that
// failed its start-up check (the engine then runs the next slower path). A path the CPU lacks is
// an error, so a forced path never silently falls back to another.
func setupKernels(log *slog.Logger) error {
	warnSIMD(log, builtWithSIMD, runtime.GOARCH)
	name := os.Getenv("SKEIN_GEMM")
	faults, err := engine.UseKernelPath(name)
	if err != nil {
		return fmt.Errorf("SKEIN_GEMM=%s: %w", name, err)
	}
	for _, f := range append(engine.KernelFaults(), faults...) {
		log.Error("kernel check failed; using a slower path", "err", f)
	}
	log.Info("kernels", "path", engine.KernelPath(), "cpu_paths", engine.KernelPaths(), "gemm", engine.GEMMName())
	return nil
}

// simdWarning is what a binary built without GOEXPERIMENT=simd says at start-up on amd64, where
// the engine's vector kernels need it: everything works, only about 12× slower, which without a
// word looks like a slow machine. Elsewhere (or with it) there is nothing to say.
func simdWarning(built bool, goarch string) string {
	if built || goarch != "amd64" {
		return ""
	}
	return "built without GOEXPERIMENT=simd: the engine runs without its vector kernels, about 12x slower; " +
		"rebuild with `GOEXPERIMENT=simd go build ./cmd/skein` (or `make`)"
}

// warnSIMD logs simdWarning, if there is one.
func warnSIMD(log *slog.Logger, built bool, goarch string) {
	if msg := simdWarning(built, goarch); msg != "" {
		log.Warn(msg)
	}
}
