package engine

import (
	"os/exec"
	"strings"
	"testing"
)

// The model code reaches the CPU's kernels only through the CPU backend: among the engine's
// imports (go list -deps), every path from engine to internal/kernels, internal/cpu or
// internal/tensor passes through backend/cpu. (internal/quant, the block formats the loaders and
// the GGUF reader and writer use, imports none of them: its vector paths follow a gate the CPU
// backend sets.) The backend interface itself imports nothing of the engine's, so a device
// backend depends on no CPU code.
func TestModelCodeReachesKernelsOnlyThroughTheBackend(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", ".").Output()
	if err != nil {
		t.Skipf("go list: %v", err)
	}
	const mod = "github.com/skein-ai/skein/"
	imports := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || !strings.HasPrefix(f[0], mod) {
			continue
		}
		for _, imp := range f[1:] {
			if strings.HasPrefix(imp, mod) {
				imports[strings.TrimPrefix(f[0], mod)] = append(imports[strings.TrimPrefix(f[0], mod)], strings.TrimPrefix(imp, mod))
			}
		}
	}
	if got := imports["engine/internal/backend"]; len(got) != 0 {
		t.Errorf("engine/internal/backend imports %v: the interface must depend on no engine package", got)
	}
	through := map[string]bool{"engine/internal/backend/cpu": true}
	cpuOnly := map[string]bool{"engine/internal/kernels": true, "engine/internal/cpu": true, "engine/internal/tensor": true}
	// Walk from engine without entering the allowed gateways: no CPU-only package may be reached.
	seen := map[string]bool{}
	var walk func(p string, path []string)
	walk = func(p string, path []string) {
		if seen[p] {
			return
		}
		seen[p] = true
		for _, q := range imports[p] {
			if through[q] {
				continue
			}
			if cpuOnly[q] {
				t.Errorf("%s reaches %s around the CPU backend", strings.Join(append(path, p), " → "), q)
				continue
			}
			walk(q, append(path, p))
		}
	}
	walk("engine", nil)
	if len(imports["engine"]) == 0 {
		t.Fatal("go list gave no imports for engine")
	}
}
