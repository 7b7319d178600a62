//go:build goexperiment.simd && amd64

package kernels

// vectorBuild: this build has the archsimd and assembly kernels.
const vectorBuild = true

// amxBuilt: the AMX kernel is assembled into this build.
const amxBuilt = true

// Package variables are initialised before any init function runs, so the vector tables are in
// place when paths.go's init chooses a path.
var _ = registerVectorRows()

func registerVectorRows() bool {
	rowTables[AVX2] = &avx2Rows
	rowTables[AVX512] = &avx512Rows
	return true
}
