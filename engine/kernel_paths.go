package engine

// kernelPath is one implementation of the float32 row kernels (exp, sigmoid, max, dot, axpy and
// the fused RMSNorm/softmax/SiLU rows). The best one the CPU has is chosen once at init:
// AVX-512 (16 lanes), else AVX2 with FMA (8 lanes), else scalar. Tests and benchmarks switch
// with setKernelPath to compare the paths on one machine.
type kernelPath uint8

const (
	pathScalar kernelPath = iota
	pathAVX2
	pathAVX512
)

// kernelPaths lists every path, slowest first.
var kernelPaths = [...]kernelPath{pathScalar, pathAVX2, pathAVX512}

func (p kernelPath) String() string {
	switch p {
	case pathScalar:
		return "scalar"
	case pathAVX2:
		return "avx2"
	case pathAVX512:
		return "avx512"
	}
	return "unknown"
}

// bestKernelPath is the fastest path this CPU supports.
func bestKernelPath() kernelPath {
	for _, p := range [...]kernelPath{pathAVX512, pathAVX2} {
		if kernelPathSupported(p) {
			return p
		}
	}
	return pathScalar
}
