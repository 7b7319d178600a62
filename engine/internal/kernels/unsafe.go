package kernels

import "unsafe"

// unsafeSlice is the n elements from p: the Go models of the micro-kernels take the assembly's
// pointer arguments, whose ranges micro has already checked.
func unsafeSlice[E any](p *E, n int) []E { return unsafe.Slice(p, n) }
