package engine

// gemmKind is how the engine multiplies float32 matrices: the backend's matmul (GoMLX's Go
// backend, everywhere), or the AVX2 GEMM (gemm_avx2_amd64.go: a 6×16 micro-kernel in assembly,
// 2.5–3× the backend on this kind), chosen at init where the CPU has AVX2 and FMA. Tests switch
// with setGEMMPath to check each against the other on one machine.
type gemmKind uint8

const (
	gemmBackend gemmKind = iota
	gemmAVX2
)

var gemmPath = gemmBackend

// GEMMName names the float32 GEMM in use (the bench reports it beside the peak it measures).
func GEMMName() string {
	if gemmPath == gemmAVX2 {
		return "f32 AVX2 GEMM (6×16 kernel)"
	}
	return "f32 backend matmul"
}

// setGEMMPath switches the float32 GEMM (tests), returning a function that restores it.
func setGEMMPath(k gemmKind) (restore func()) {
	old := gemmPath
	if k == gemmAVX2 && !haveGEMM {
		return func() {}
	}
	gemmPath = k
	return func() { gemmPath = old }
}
