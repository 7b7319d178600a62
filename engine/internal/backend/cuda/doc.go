// Package cuda is the foundation of the CUDA backend (issue 35): it finds and loads NVIDIA's
// libraries at run time through purego (no cgo: a CGO_ENABLED=0 binary runs on the CPU without
// them), probes GPUs through the driver API, compiles the backend's CUDA C kernels (kernels/*.cu,
// embedded, header-free) with NVRTC into a disk cache, loads and launches them on a GPU's
// primary context (a minimal layer, enough for their tests), and decides --device (SelectDevice).
// README.md beside this file says what is found where, how kernels are compiled and cached, and
// the register budget they are held to.
//
// It does not implement backend.Step yet and imports neither engine/internal/kernels nor the
// CPU backend.
package cuda
