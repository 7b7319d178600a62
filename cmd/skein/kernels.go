package main

import (
	"fmt"
	"log/slog"
	"os"

	"github.com/skein-ai/skein/engine"
)

// setupKernels applies SKEIN_GEMM (auto, avx2, avx512, avx512bf16, amx; unset: auto) before any
// engine runs and logs the path once: the path chosen, those this CPU has, and every kernel that
// failed its start-up check (the engine then runs the next slower path). A path the CPU lacks is
// an error, so a forced path never silently falls back to another.
func setupKernels(log *slog.Logger) error {
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
