package kernels

// Float is the element type of the generic kernels: float32 in production, float64 for the
// engine's gradient checks.
type Float interface{ float32 | float64 }
