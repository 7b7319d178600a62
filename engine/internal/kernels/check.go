package kernels

import (
	"errors"
	"fmt"
	"math"
	"os"
)

// A wrong kernel must never train anyone's adapter: at start each path's kernels multiply a small
// fixed problem and are compared with their references (the scalar row loops, a float64 product,
// the Go model of the bf16 instruction). A path that disagrees is not used; the next slower one
// that agrees is.

// startFaults are the disagreements found when init chose the path (StartFaults).
var startFaults []error

// init starts on the best path, or on the one SKEIN_GEMM names (so that a test run can put a
// whole suite on a slower path); the binary applies SKEIN_GEMM again at start and refuses a name
// that is no path, or a path the CPU lacks.
func init() {
	want := Best()
	if p, err := ParsePath(os.Getenv("SKEIN_GEMM")); err == nil && Supported(p) {
		want = p
	}
	var p Path
	p, startFaults = choose(want)
	use(p)
}

// StartFaults returns what the check at init found wrong with the paths it passed over (nil
// when the best path agreed); the server logs them.
func StartFaults() []error { return startFaults }

// Choose switches to path p once its kernels pass the check, else to the fastest slower path
// whose kernels do; it returns the path in use and each fault found on the way. A path the CPU
// lacks is an error and changes nothing.
func Choose(p Path) (Path, []error, error) {
	if !Supported(p) {
		return active, nil, fmt.Errorf("kernel path %s: CPU lacks it (this CPU has %v)", p, SupportedPaths())
	}
	chosen, faults := choose(p)
	use(chosen)
	return chosen, faults, nil
}

func choose(p Path) (Path, []error) {
	var faults []error
	for ; p > Scalar; p-- {
		if !Supported(p) {
			continue
		}
		err := Check(p)
		if err == nil {
			return p, faults
		}
		faults = append(faults, err)
	}
	return Scalar, faults
}

// Check runs path p's kernels on a fixed problem and returns how they disagree with their
// references (nil: they agree). It switches to p for the check and back after.
func Check(p Path) error {
	if !Supported(p) {
		return fmt.Errorf("kernel path %s: CPU lacks it", p)
	}
	old := active
	use(p)
	defer use(old)
	var errs []error
	if err := checkRows(); err != nil {
		errs = append(errs, err)
	}
	if km := gemmKernel(); km != nil {
		if err := checkF32GEMM(km); err != nil {
			errs = append(errs, err)
		}
	}
	if km := bf16Kernel(); km != nil {
		if err := checkBF16GEMM(km); err != nil {
			errs = append(errs, err)
		}
		if km == &amxMicro { // products of few rows take AVX512_BF16's kernel (bf16KernelFor)
			if err := checkBF16GEMM(&avx512bf16Micro); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if p >= AVX2 {
		if err := checkFewRows(); err != nil {
			errs = append(errs, err)
		}
	}
	if pairsProduct() {
		if err := checkBF16Pairs(); err != nil {
			errs = append(errs, err)
		}
	}
	if pairsNN[0] != nil && bf16Kernel() != nil {
		if err := checkPairsNN(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("kernel path %s disagrees with its reference: %w", p, err)
	}
	return nil
}

// checkValue is a fixed, irregular value in about [-1, 1].
func checkValue(i, salt int) float32 { return float32(math.Sin(float64(i*7+salt*13)*0.37)) * 0.9 }

func checkRows() error {
	const n = 37 // one vector or two and a tail on every path
	a, b := make([]float32, n), make([]float32, n)
	for i := range n {
		a[i], b[i] = checkValue(i, 1), checkValue(i, 2)
	}
	if got, want := rows.dot(a, b), dotScalar(a, b); math.Abs(got-want) > 1e-5 {
		return fmt.Errorf("dot: %v, want %v", got, want)
	}
	x, y := append([]float32(nil), b...), append([]float32(nil), b...)
	rows.axpy(x, a, 0.75)
	axpyScalar(y, a, 0.75)
	for i := range x {
		if math.Abs(float64(x[i]-y[i])) > 1e-6 {
			return fmt.Errorf("axpy: element %d is %v, want %v", i, x[i], y[i])
		}
	}
	e, s := append([]float32(nil), a...), append([]float32(nil), a...)
	rows.expScaledShift(e, 1.5, 0.5)
	expScaledShiftScalar(s, 1.5, 0.5)
	for i := range e {
		if math.Abs(float64(e[i]-s[i])) > 1e-6*float64(s[i]) {
			return fmt.Errorf("exp: element %d is %v, want %v", i, e[i], s[i])
		}
	}
	return nil
}

// The GEMM checks multiply 29×67 by 67×45: two row panels and a short one, a column panel and a
// short one, odd k.
const checkM, checkK, checkN = 29, 67, 45

func checkF32GEMM(km *microKernel[float32]) error {
	a, b := make([]float32, checkM*checkK), make([]float32, checkK*checkN)
	for i := range a {
		a[i] = checkValue(i, 3)
	}
	for i := range b {
		b[i] = checkValue(i, 4)
	}
	c := make([]float32, checkM*checkN)
	gemmF32(km, c, a, b, checkM, checkK, checkN, false, false)
	return compareProduct(km.name, c, func(i, k, j int) float64 { return float64(a[i*checkK+k]) * float64(b[k*checkN+j]) })
}

// checkFewRows runs the few-row products over float32 and over bf16 rows (a decode step's x·W
// and x·Wᵀ, the assembly kernels of nn_wide_amd64.go) over 29 rows (AVX-512's 12-, 12- and 4-row
// kernels, AVX2's 6s and a 4, and a row for the tiles; x·Wᵀ's 3s and a 2) and over 8 (AVX-512's
// 8-row kernel, AVX2's two 4s); 45 outputs are whole panels and blocks and a tail. The column kernels are called whole: split
// across cores, a part may be narrower than a panel.
func checkFewRows() error {
	a, b, b16 := make([]float32, checkM*checkK), make([]float32, checkK*checkN), make([]uint16, checkK*checkN)
	for i := range a {
		a[i] = checkValue(i, 8)
	}
	for i := range b {
		b[i] = checkValue(i, 9)
		b16[i] = BF16Of(b[i])
	}
	c := make([]float32, checkM*checkN)
	for _, R := range []int{checkM, 8} {
		for _, kind := range []struct {
			name    string
			product func(c []float32)
			w       func(i int) float64
		}{
			{"f32", func(c []float32) { f32NN(c, a, b, R, checkK, checkN, 0, checkN) }, func(i int) float64 { return float64(b[i]) }},
			{"bf16", func(c []float32) { bf16NN(c, a, b16, R, checkK, checkN, 0, checkN) }, func(i int) float64 { return float64(BF16To32(b16[i])) }},
			// x·Wᵀ reads the same values as W [checkN, checkK].
			{"f32 transposed", func(c []float32) { f32NT(c, a, b, R, checkK, checkN, 0, checkN) }, func(i int) float64 { return float64(b[i%checkN*checkK+i/checkN]) }},
			{"bf16 transposed", func(c []float32) { bf16NT(c, a, b16, R, checkK, checkN, 0, checkN) }, func(i int) float64 { return float64(BF16To32(b16[i%checkN*checkK+i/checkN])) }},
		} {
			clear(c)
			kind.product(c[:R*checkN])
			if err := compareProduct(fmt.Sprintf("%s few-row product of %d rows", kind.name, R), c, func(i, k, j int) float64 {
				if i >= R {
					return 0
				}
				return float64(a[i*checkK+k]) * kind.w(k*checkN+j)
			}); err != nil {
				return err
			}
		}
	}
	return nil
}

func checkBF16GEMM(km *microKernel[uint32]) error {
	a, w := make([]float32, checkM*checkK), make([]uint16, checkK*checkN)
	for i := range a {
		a[i] = checkValue(i, 5)
	}
	for i := range w {
		w[i] = BF16Of(checkValue(i, 6))
	}
	c := make([]float32, checkM*checkN)
	bf16GEMM(km, c, a, w, checkM, checkK, checkN, false)
	return compareProduct(km.name, c, func(i, k, j int) float64 {
		return float64(BF16To32(BF16Of(a[i*checkK+k]))) * float64(BF16To32(w[k*checkN+j]))
	})
}

// compareProduct checks c against the float64 sums of product(i, k, j) over k, each within
// float32 rounding of the sum of the products' magnitudes.
func compareProduct(name string, c []float32, product func(i, k, j int) float64) error {
	return compareProductK(name, c, checkK, product)
}

func compareProductK(name string, c []float32, checkK int, product func(i, k, j int) float64) error {
	for i := range checkM {
		for j := range checkN {
			var ref, abs float64
			for k := range checkK {
				p := product(i, k, j)
				ref += p
				abs += math.Abs(p)
			}
			if d := math.Abs(float64(c[i*checkN+j]) - ref); !(d <= float64(checkK)*0x1p-23*abs) {
				return fmt.Errorf("%s: c[%d,%d] = %v, want %v", name, i, j, c[i*checkN+j], ref)
			}
		}
	}
	return nil
}

// checkBF16Pairs runs the few-row pairs product over 29 rows of 160 values (80 pairs: 64 through
// the kernel, 16 after it) by 45 weight rows (eleven groups of four and one row alone).
func checkBF16Pairs() error {
	const K = 160
	a, w := make([]float32, checkM*K), make([]uint16, checkN*K)
	for i := range a {
		a[i] = checkValue(i, 7)
	}
	for i := range w {
		w[i] = BF16Of(checkValue(i, 8))
	}
	c := make([]float32, checkM*checkN)
	bf16PairsProduct(c, a, w, checkM, K, checkN)
	return compareProductK("bf16 pairs product", c, K, func(i, k, j int) float64 {
		return float64(BF16To32(BF16Of(a[i*K+k]))) * float64(BF16To32(w[j*K+k]))
	})
}

// checkPairsNN runs the few-row product over a weight kept as pairs of rows: 29 rows by a
// [67, 45+128] weight (a strip of 128 columns, one of 32, and 13 columns in Go).
func checkPairsNN() error {
	const N = checkN + 128
	a, w := make([]float32, checkM*checkK), make([]uint16, checkK*N)
	for i := range a {
		a[i] = checkValue(i, 9)
	}
	for i := range w {
		w[i] = BF16Of(checkValue(i, 10))
	}
	c := make([]float32, checkM*N)
	pairsNNProduct(c, a, PackPairs(w, checkK, N), checkM, checkK, N)
	for i := range checkM {
		for j := range N {
			var ref, abs float64
			for k := range checkK {
				p := float64(BF16To32(BF16Of(a[i*checkK+k]))) * float64(BF16To32(w[k*N+j]))
				ref += p
				abs += math.Abs(p)
			}
			if d := math.Abs(float64(c[i*N+j]) - ref); !(d <= checkK*0x1p-23*abs) {
				return fmt.Errorf("pairs product: c[%d,%d] = %v, want %v", i, j, c[i*N+j], ref)
			}
		}
	}
	return nil
}
