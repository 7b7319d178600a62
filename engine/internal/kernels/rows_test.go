package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// The float32 exponentials (scalar and 16-lane) stay within a few float32 ulps of math.Exp
// over the range softmax and sigmoid feed them, including the lanes left over after the last
// full vector.
func TestFastExpMatchesMathExp(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	xs := []float32{0, -0, 1, -1, 0.5, 80, -80, 88, -87}
	for range 10_000 {
		xs = append(xs, float32(rng.Float64()*170-85))
	}
	xs = append(xs, 3, -2, 7) // 10,012 values: not a multiple of 16
	const tol = 4e-7
	for _, x := range xs {
		want := math.Exp(float64(x))
		if got := float64(Exp32(x)); math.Abs(got-want) > tol*want {
			t.Fatalf("Exp32(%v) = %v, want %v", x, got, want)
		}
	}
	v := append([]float32(nil), xs...)
	sum := ExpShift(v, 1, 0)
	var wantSum float64
	for i, x := range xs {
		want := math.Exp(float64(x))
		wantSum += want
		if math.Abs(float64(v[i])-want) > tol*want {
			t.Fatalf("ExpShift lane %d: e^%v = %v, want %v", i, x, v[i], want)
		}
	}
	if math.Abs(sum-wantSum) > 1e-6*wantSum {
		t.Fatalf("ExpShift sum %v, want %v", sum, wantSum)
	}
	// Scaled and shifted, as softmax calls it.
	w := []float32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17}
	ExpShift(w, 0.5, 8.5)
	for i, x := range w {
		want := math.Exp(float64(i+1)*0.5 - 8.5)
		if math.Abs(float64(x)-want) > tol*want {
			t.Fatalf("ExpShift scaled lane %d: %v, want %v", i, x, want)
		}
	}
	sig := make([]float32, len(xs))
	sigmoids(sig, xs)
	for i, x := range xs {
		want := 1 / (1 + math.Exp(-float64(x)))
		if math.Abs(float64(sig[i])-want) > 1e-6*want+1e-38 {
			t.Fatalf("sigmoid(%v) = %v, want %v", x, sig[i], want)
		}
	}
}

// Each token's loss derivative matches a central difference of its loss in lp, on both sides
// of the ppo and cispo clips (cispo's ratio is not differentiated: its derivative is −clip(r)·A).
// The 16-lane row kernels give what the scalar ones give (to float32 rounding), for lengths
// with and without a tail.
func TestRowKernelsMatchScalar(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	vec := func(n int) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(rng.NormFloat64())
		}
		return v
	}
	near := func(what string, n int, got, want float64) {
		t.Helper()
		if math.Abs(got-want) > 1e-5*(1+math.Abs(want)) {
			t.Fatalf("%s, n=%d: %v, scalar %v", what, n, got, want)
		}
	}
	nearAll := func(what string, got, want []float32) {
		t.Helper()
		for i := range got {
			near(what, len(got), float64(got[i]), float64(want[i]))
		}
	}
	for _, n := range []int{1, 15, 16, 17, 100, 513} {
		a, b, c := vec(n), vec(n), vec(n)
		near("max", n, float64(rows.max(a)), float64(maxScalar(a)))
		near("dot", n, rows.dot(a, b), dotScalar(a, b))
		near("dot3", n, rows.dot3(a, b, c), dot3Scalar(a, b, c))
		two := func(f32, scalar func(dst []float32)) ([]float32, []float32) {
			x, y := append([]float32(nil), c...), append([]float32(nil), c...)
			f32(x)
			scalar(y)
			return x, y
		}
		x, y := two(func(d []float32) { rows.axpby(d, a, 0.7) }, func(d []float32) { axpbyScalar(d, a, 0.7) })
		nearAll("axpby", x, y)
		x, y = two(func(d []float32) { rows.axpy(d, a, -1.3) }, func(d []float32) { axpyScalar(d, a, -1.3) })
		nearAll("axpy", x, y)
		x, y = two(func(d []float32) { rows.mulScaled(d, a, b, 0.4) }, func(d []float32) { mulScaledScalar(d, a, b, 0.4) })
		nearAll("mulScaled", x, y)
		for _, acc := range []bool{false, true} {
			x, y = two(func(d []float32) { rows.rmsBack(d, a, b, c, 1.5, 0.25, acc) }, func(d []float32) { rmsBackScalar(d, a, b, c, 1.5, 0.25, acc) })
			nearAll("rmsBack", x, y)
		}
		p := vec(n)
		x, y = two(func(d []float32) { rows.softmaxBackRow(p, d, 0.3, 0.125) }, func(d []float32) { softmaxBackRowScalar(p, d, 0.3, 0.125) })
		nearAll("SoftmaxBack", x, y)
		sig := make([]float32, n)
		sigmoidScalar(sig, a)
		out32, outS := make([]float32, n), make([]float32, n)
		rows.siluGate(a, b, sig, out32)
		siluGateScalar(a, b, sig, outS)
		nearAll("SiluGate", out32, outS)
		dg32, du32, dgS, duS := make([]float32, n), make([]float32, n), make([]float32, n), make([]float32, n)
		rows.siluGateBack(c, a, b, sig, dg32, du32)
		siluGateBackScalar(c, a, b, sig, dgS, duS)
		nearAll("SiluGateBack dg", dg32, dgS)
		nearAll("SiluGateBack du", du32, duS)
	}
}

// A panic inside a parallel kernel reaches the caller's goroutine, so a pass's recover sees it.
func TestParallelRowsPanicReachesCaller(t *testing.T) {
	err := func() (err error) {
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("%v", r)
			}
		}()
		ParallelRows(100, func(lo, hi int) {
			if hi == 100 {
				panic("kernel bug")
			}
		})
		return nil
	}()
	if err == nil || !strings.Contains(err.Error(), "kernel bug") {
		t.Fatalf("error %v, want the kernel's panic", err)
	}
}

// The float32 pass (16-lane kernels, fast exp) gives the gradients of the float64 pass (scalar
// kernels, checked against finite differences) to float32 accuracy, on every architecture and
// with a rank that leaves a partial lane group.
