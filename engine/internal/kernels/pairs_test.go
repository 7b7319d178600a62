package kernels

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// Packing a weight as pairs of rows and unpacking it gives the weight back, odd K included.
func TestPairsRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(2, 2))
	for _, sh := range []struct{ K, N int }{{1, 1}, {2, 3}, {7, 5}, {64, 33}} {
		_, w := bf16Operands(rng, 1, sh.K, sh.N)
		w2 := PackPairs(w, sh.K, sh.N)
		if got := UnpackPairs(w2, sh.K, sh.N); !slices.Equal(got, w) {
			t.Fatalf("%v: unpacked %v, want %v", sh, got, w)
		}
		f := make([]float32, sh.K*sh.N)
		WidenPairs(f, w2, sh.K, sh.N)
		for i, v := range f {
			if v != BF16To32(w[i]) {
				t.Fatalf("%v: widened element %d is %v, want %v", sh, i, v, BF16To32(w[i]))
			}
		}
	}
}

var pairsNNShapes = []struct{ R, K, N int }{{1, 2, 1}, {1, 64, 128}, {2, 65, 161}, {3, 512, 300}, {5, 31, 40}}

// pairsReference is x·W in float64 over x rounded to bf16.
func pairsReference(t *testing.T, name string, y, x []float32, w []uint16, R, K, N int) {
	t.Helper()
	for r := range R {
		for n := range N {
			var ref, abs float64
			for k := range K {
				p := float64(BF16To32(BF16Of(x[r*K+k]))) * float64(BF16To32(w[k*N+n]))
				ref += p
				abs += math.Abs(p)
			}
			if d := math.Abs(float64(y[r*N+n]) - ref); !(d <= float64(K)*0x1p-23*abs) {
				t.Fatalf("%s [%d,%d,%d]: y[%d,%d] = %v, want %v", name, R, K, N, r, n, y[r*N+n], ref)
			}
		}
	}
}

// The few-row product over pairs of rows, with the Go models of its kernels (any CPU), is x·W
// over the rounded rows to float32 accuracy.
func TestPairsNNProductModelMatchesFloat64(t *testing.T) {
	saved := pairsNN
	t.Cleanup(func() { pairsNN = saved })
	pairsNN = [2]func(kp int, x, w *uint32, ldw int, y *float32){pairsNNModel(128), pairsNNModel(32)}
	rng := rand.New(rand.NewPCG(5, 5))
	for _, sh := range pairsNNShapes {
		x, w := bf16Operands(rng, sh.R, sh.K, sh.N)
		y := make([]float32, sh.R*sh.N)
		pairsNNProduct(y, x, PackPairs(w, sh.K, sh.N), sh.R, sh.K, sh.N)
		pairsReference(t, "model", y, x, w, sh.R, sh.K, sh.N)
	}
}

// Where the CPU has AVX512_BF16: the pairs kernels give their models' bits; PairsMatMul gives
// BF16MatMul's bits over the unpacked weight, both ways round; PairsProduct's x·Wᵀ (unpacked)
// gives BF16Product's.
func TestPairsKernelsMatchModels(t *testing.T) {
	usePath(t, AVX512BF16)
	if pairsNN[0] == nil {
		t.Skip("no pairs kernels in this build")
	}
	rng := rand.New(rand.NewPCG(5, 6))
	for _, sh := range pairsNNShapes {
		x, w := bf16Operands(rng, sh.R, sh.K, sh.N)
		w2 := PackPairs(w, sh.K, sh.N)
		got := make([]float32, sh.R*sh.N)
		PairsProduct(got, x, w2, sh.R, sh.K, sh.N, false)
		saved := pairsNN
		pairsNN = [2]func(kp int, x, w *uint32, ldw int, y *float32){pairsNNModel(128), pairsNNModel(32)}
		want := make([]float32, sh.R*sh.N)
		pairsNNProduct(want, x, w2, sh.R, sh.K, sh.N)
		pairsNN = saved
		for i := range got {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Fatalf("%v: output %d is %v from the assembly, %v from the model", sh, i, got[i], want[i])
			}
		}
	}
	for _, sh := range bf16Shapes {
		M, K, N := sh.M, sh.K, sh.N
		a, w := bf16Operands(rng, M, K, N)
		for _, transB := range []bool{false, true} {
			wl, rows, cols := w, K, N
			if transB {
				wl, rows, cols = TransposeBF16(w, K, N), N, K
			}
			got, want := make([]float32, M*N), make([]float32, M*N)
			PairsMatMul(got, a, PackPairs(wl, rows, cols), M, K, N, transB)
			BF16MatMul(want, a, wl, M, K, N, transB)
			for i := range got {
				if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
					t.Fatalf("%v transB=%v: output %d is %v over pairs, %v over rows", sh, transB, i, got[i], want[i])
				}
			}
			if M <= 24 && transB {
				PairsProduct(got, a, PackPairs(wl, rows, cols), M, K, N, true)
				BF16Product(want, a, wl, M, K, N, true)
				if !slices.Equal(got, want) {
					t.Fatalf("%v: x·Wᵀ over pairs differs from over rows", sh)
				}
			}
		}
	}
}
