package kernels

import (
	"math"
	"math/rand/v2"
	"os"
	"testing"
)

// Exp32 is accurate up to its overflow threshold: e^x for x in [88.38, 88.72] is below
// MaxFloat32 but its k = 128, whose 2^k alone is not a float32. The lower end (k = −126,
// the smallest normal 2^k) stays accurate too.
func TestExp32NearOverflow(t *testing.T) {
	var xs []float32
	for x := float32(88.3); x <= 88.72; x += 0.01 {
		xs = append(xs, x)
	}
	for x := float32(-87.33); x <= -87; x += 0.01 {
		xs = append(xs, x)
	}
	for _, x := range xs {
		want := math.Exp(float64(x))
		if got := float64(Exp32(x)); math.Abs(got-want) > 4e-7*want {
			t.Fatalf("Exp32(%v) = %v, want %v", x, got, want)
		}
	}
}

// usePath runs the rest of the test (or benchmark) on path p, or skips it with "CPU lacks p"
// where this CPU lacks it. Tests that call it must not run in parallel.
func usePath(tb testing.TB, p Path) {
	tb.Helper()
	undo, err := Use(p)
	if err != nil {
		tb.Skipf("CPU lacks %s", p)
	}
	tb.Cleanup(undo)
}

// The path is chosen once at init, the best the CPU has: on a CPU with AVX2 and FMA the
// kernels never run scalar. Asking for a path the CPU lacks is an error and changes nothing.
func TestPathChosenAtInit(t *testing.T) {
	best := Best()
	if os.Getenv("SKEIN_GEMM") != "" {
		t.Skip("SKEIN_GEMM chose the path")
	}
	if got := Active(); got != best {
		t.Fatalf("active kernel path %s, want %s", got, best)
	}
	for _, p := range Paths {
		if Supported(p) && p > best {
			t.Fatalf("best path %s, but the CPU also runs %s", best, p)
		}
		if !Supported(p) {
			if _, err := Use(p); err == nil {
				t.Fatalf("Use(%s) accepted a path the CPU lacks", p)
			}
			if got := Active(); got != best {
				t.Fatalf("after refusing %s the path is %s, want %s", p, got, best)
			}
		}
	}
	t.Logf("kernel path: %s (this CPU has %v)", best, SupportedPaths())
}

// rowPaths are the paths with row kernels of their own.
var rowPaths = []Path{Scalar, AVX2, AVX512}

// rowInputs are the operands of one row kernel call: a, b, c, d are N(0,1); p is in (0,1)
// (a probability or a sigmoid).
type rowInputs struct{ a, b, c, d, p []float32 }

func newRowInputs(rng *rand.Rand, n int) rowInputs {
	vec := func(f func() float64) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(f())
		}
		return v
	}
	return rowInputs{vec(rng.NormFloat64), vec(rng.NormFloat64), vec(rng.NormFloat64), vec(rng.NormFloat64),
		vec(func() float64 { return 0.01 + 0.98*rng.Float64() })}
}

func clone(v []float32) []float32 { return append([]float32(nil), v...) }

func widen(v ...[]float32) []float64 {
	var w []float64
	for _, s := range v {
		for _, x := range s {
			w = append(w, float64(x))
		}
	}
	return w
}

func absf(x float32) float64 { return math.Abs(float64(x)) }

func absAll(v []float64) []float64 {
	a := make([]float64, len(v))
	for i, x := range v {
		a[i] = math.Abs(x)
	}
	return a
}

// rowKernels are the float32 row  run calls the dispatched kernel (whichever path is
// active) and its scalar version on copies of the same inputs, returning both results and,
// per result, the size of the terms behind it, which rounding error is relative to; a result
// is right within tol·size. bench returns one call of the dispatched kernel.
var rowKernels = []struct {
	name  string
	tol   float64
	run   func(in rowInputs) (got, want, size []float64)
	bench func(in rowInputs) func()
}{
	{"max", 0, func(in rowInputs) (got, want, size []float64) {
		if len(in.a) == 0 {
			return nil, nil, nil // max of nothing is not defined
		}
		return widen([]float32{rows.max(in.a)}), widen([]float32{maxScalar(in.a)}), []float64{0}
	}, func(in rowInputs) func() { return func() { rows.max(in.a) } }},
	{"dot", 1e-5, func(in rowInputs) (got, want, size []float64) {
		var s float64
		for i, x := range in.a {
			s += absf(x * in.b[i])
		}
		return []float64{rows.dot(in.a, in.b)}, []float64{dotScalar(in.a, in.b)}, []float64{s}
	}, func(in rowInputs) func() { return func() { rows.dot(in.a, in.b) } }},
	{"dot3", 1e-5, func(in rowInputs) (got, want, size []float64) {
		var s float64
		for i, x := range in.a {
			s += absf(x * in.b[i] * in.c[i])
		}
		return []float64{rows.dot3(in.a, in.b, in.c)}, []float64{dot3Scalar(in.a, in.b, in.c)}, []float64{s}
	}, func(in rowInputs) func() { return func() { rows.dot3(in.a, in.b, in.c) } }},
	{"axpby", 1e-6, func(in rowInputs) (got, want, size []float64) {
		x, y := clone(in.c), clone(in.c)
		rows.axpby(x, in.a, 0.7)
		axpbyScalar(y, in.a, 0.7)
		for i, v := range in.c {
			size = append(size, absf(in.a[i])+absf(0.7*v))
		}
		return widen(x), widen(y), size
	}, func(in rowInputs) func() { return func() { rows.axpby(in.c, in.a, 0.7) } }},
	{"axpy", 1e-6, func(in rowInputs) (got, want, size []float64) {
		x, y := clone(in.c), clone(in.c)
		rows.axpy(x, in.a, -1.3)
		axpyScalar(y, in.a, -1.3)
		for i, v := range in.c {
			size = append(size, absf(v)+absf(1.3*in.a[i]))
		}
		return widen(x), widen(y), size
	}, func(in rowInputs) func() { return func() { rows.axpy(in.c, in.a, -1e-3) } }},
	{"mulScaled", 1e-6, func(in rowInputs) (got, want, size []float64) {
		x, y := make([]float32, len(in.a)), make([]float32, len(in.a))
		rows.mulScaled(x, in.a, in.b, 0.4)
		mulScaledScalar(y, in.a, in.b, 0.4)
		return widen(x), widen(y), absAll(widen(y))
	}, func(in rowInputs) func() { return func() { rows.mulScaled(in.d, in.a, in.b, 0.4) } }},
	{"rmsBack", 1e-6, func(in rowInputs) (got, want, size []float64) {
		for _, acc := range []bool{false, true} {
			x, y := clone(in.d), clone(in.d)
			rows.rmsBack(x, in.a, in.b, in.c, 1.5, 0.25, acc)
			rmsBackScalar(y, in.a, in.b, in.c, 1.5, 0.25, acc)
			got, want = append(got, widen(x)...), append(want, widen(y)...)
			for i, v := range in.d {
				s := absf(1.5*in.a[i]*in.b[i]) + absf(0.25*in.c[i])
				if acc {
					s += absf(v)
				}
				size = append(size, s)
			}
		}
		return got, want, size
	}, func(in rowInputs) func() { return func() { rows.rmsBack(in.d, in.a, in.b, in.c, 1.5, 0.25, false) } }},
	{"SoftmaxBack", 1e-6, func(in rowInputs) (got, want, size []float64) {
		x, y := clone(in.a), clone(in.a)
		rows.softmaxBackRow(in.p, x, 0.3, 0.125)
		softmaxBackRowScalar(in.p, y, 0.3, 0.125)
		for i, v := range in.a {
			size = append(size, absf(in.p[i])*(absf(v)+0.3)*0.125)
		}
		return widen(x), widen(y), size
	}, func(in rowInputs) func() {
		// dr converges to −p·d·s/(1−p·s), which is far from 0 (no denormals) for p in (0,1).
		return func() { rows.softmaxBackRow(in.p, in.a, 0.3, 0.5) }
	}},
	{"SiluGate", 1e-6, func(in rowInputs) (got, want, size []float64) {
		x, y := make([]float32, len(in.a)), make([]float32, len(in.a))
		rows.siluGate(in.a, in.b, in.p, x)
		siluGateScalar(in.a, in.b, in.p, y)
		return widen(x), widen(y), absAll(widen(y))
	}, func(in rowInputs) func() { return func() { rows.siluGate(in.a, in.b, in.p, in.d) } }},
	{"SiluGateBack", 1e-6, func(in rowInputs) (got, want, size []float64) {
		n := len(in.a)
		dg, du, dgS, duS := make([]float32, n), make([]float32, n), make([]float32, n), make([]float32, n)
		rows.siluGateBack(in.c, in.a, in.b, in.p, dg, du)
		siluGateBackScalar(in.c, in.a, in.b, in.p, dgS, duS)
		for i, s := range in.p {
			size = append(size, absf(in.c[i]*in.b[i]*s)*(1+absf(in.a[i]*(1-s))))
		}
		return widen(dg, du), widen(dgS, duS), append(size, absAll(widen(duS))...)
	}, func(in rowInputs) func() {
		dg, du := make([]float32, len(in.a)), make([]float32, len(in.a))
		return func() { rows.siluGateBack(in.c, in.a, in.b, in.p, dg, du) }
	}},
	{"ExpShift", 0x1p-23, func(in rowInputs) (got, want, size []float64) {
		x, y := clone(in.a), clone(in.a)
		for i := range x {
			x[i] *= 12 // about ±40 after the scale: e^x from 1e-17 to 1e17
			y[i] = x[i]
		}
		sum := rows.expScaledShift(x, 1.5, 2)
		sumS := expScaledShiftScalar(y, 1.5, 2)
		// Both exps are within 4e-7 (< 4 ulps) of e^t, and t = v·1.5 − 2 itself may round
		// differently (one FMA against a multiply and a subtract): |t| ulps of relative error.
		// The sum adds up to n/8 float32 roundings of the lanes on top.
		sumSize := sumS * float64(len(y)) / 8
		for i, v := range in.a {
			size = append(size, float64(y[i])*(8+absf(12*v*1.5-2)))
			sumSize += size[i]
		}
		return append(widen(x), sum), append(widen(y), sumS), append(size, sumSize)
	}, func(in rowInputs) func() {
		// v ← e^(−v) settles at 0.567, so every call exponentiates the same moderate values.
		return func() { rows.expScaledShift(in.d, -1, 0) }
	}},
	{"sigmoid", 1e-6, func(in rowInputs) (got, want, size []float64) {
		src := clone(in.a)
		for i := range src {
			src[i] *= 8
		}
		x, y := make([]float32, len(src)), make([]float32, len(src))
		rows.sigmoid(x, src)
		sigmoidScalar(y, src)
		return widen(x), widen(y), absAll(widen(y))
	}, func(in rowInputs) func() { return func() { rows.sigmoid(in.d, in.a) } }},
}

// Each vector path of every row kernel gives what its scalar version gives, to float32
// rounding, for every length 0..70 (every n%8 and n%16, with one to four full vectors before
// the partial one; rows below 8 and 16 are scalar) and a few long rows.
func TestKernelPathsMatchScalar(t *testing.T) {
	for _, p := range rowPaths[1:] {
		t.Run(p.String(), func(t *testing.T) {
			usePath(t, p)
			rng := rand.New(rand.NewPCG(8, uint64(p)))
			lengths := []int{255, 256, 257, 1000}
			for n := 70; n >= 0; n-- {
				lengths = append(lengths, n)
			}
			for _, n := range lengths {
				in := newRowInputs(rng, n)
				for _, k := range rowKernels {
					got, want, size := k.run(in)
					for i := range want {
						if d := math.Abs(got[i] - want[i]); !(d <= k.tol*size[i]+1e-30) {
							t.Fatalf("%s, n=%d, result %d: %v, scalar %v (size %v)", k.name, n, i, got[i], want[i], size[i])
						}
					}
				}
			}
		})
	}
}

// On every path exp (softmax's ExpShift) and sigmoid stay within 4e-7 of math.Exp over the
// whole clamped range, [−87.3, 88.7], ends included; NaN stays NaN (on the paths this CPU
// runs).
func TestKernelPathsExpMatchesMathExp(t *testing.T) {
	xs := []float32{-87.3, 88.7, -87.29, 88.69, 0, 1, -1}
	rng := rand.New(rand.NewPCG(5, 6))
	for range 4000 {
		xs = append(xs, float32(-87.3+rng.Float64()*(88.7+87.3)))
	}
	for x := float32(88.3); x < 88.7; x += 0.01 { // k = 128 in the top half of this stretch
		xs = append(xs, x)
	}
	xs = append(xs, 3, -2, 7) // not a multiple of 8 or 16: the tail runs too
	nan := float32(math.NaN())
	for _, p := range rowPaths {
		t.Run(p.String(), func(t *testing.T) {
			usePath(t, p)
			v := clone(xs)
			rows.expScaledShift(v, 1, 0)
			for i, x := range xs {
				want := math.Exp(float64(x))
				if got := float64(v[i]); !(math.Abs(got-want) <= 4e-7*want) {
					t.Fatalf("e^%v = %v, want %v", x, got, want)
				}
			}
			// The sum as softmax asks for it, shifted by the max so that no term exceeds 1
			// (the vector paths add in float32 lanes, which the unshifted sum would overflow).
			v = clone(xs)
			sum := rows.expScaledShift(v, 1, 88.7)
			var wantSum float64
			for _, x := range xs {
				wantSum += math.Exp(float64(x) - float64(float32(88.7)))
			}
			if !(math.Abs(sum-wantSum) <= 1e-6*wantSum) {
				t.Fatalf("sum %v, want %v", sum, wantSum)
			}
			sig := make([]float32, len(xs))
			rows.sigmoid(sig, xs)
			for i, x := range xs {
				want := 1 / (1 + math.Exp(-float64(x)))
				if got := float64(sig[i]); !(math.Abs(got-want) <= 1e-6*want+1e-38) {
					t.Fatalf("sigmoid(%v) = %v, want %v", x, got, want)
				}
			}
			if p == AVX512 {
				return // exp16 has no NaN rule, and no AVX-512 CPU was at hand to settle what it does
			}
			for n := 1; n <= 20; n++ { // NaN last: in a scalar row, a full vector, an overlapping last one
				v := make([]float32, n)
				v[n-1] = nan
				rows.expScaledShift(v, 1, 0)
				rows.sigmoid(v, v)
				if !math.IsNaN(float64(v[n-1])) {
					t.Fatalf("n=%d: e^NaN then sigmoid gave %v, want NaN", n, v[n-1])
				}
			}
		})
	}
}

// BenchmarkKernels compares the paths kernel by kernel on one row of 1024 floats (a hidden
// width; three operands fit in L1), e.g.
//
//	GOEXPERIMENT=simd go test ./engine -run '^$' -bench 'Kernels/^dot$/' -benchtime 200ms
func BenchmarkKernels(b *testing.B) {
	const n = 1024
	for _, k := range rowKernels {
		b.Run(k.name, func(b *testing.B) {
			for _, p := range rowPaths {
				b.Run(p.String(), func(b *testing.B) {
					usePath(b, p)
					call := k.bench(newRowInputs(rand.New(rand.NewPCG(1, 1)), n))
					b.SetBytes(n * 4)
					for b.Loop() {
						call()
					}
				})
			}
		})
	}
}
