//go:build !goexperiment.simd

package main

// builtWithSIMD: this binary was built without GOEXPERIMENT=simd; the engine runs scalar loops.
const builtWithSIMD = false
