//go:build goexperiment.simd

package main

// builtWithSIMD: this binary was built with GOEXPERIMENT=simd, so the engine has its vector kernels.
const builtWithSIMD = true
