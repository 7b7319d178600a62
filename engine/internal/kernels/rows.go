package kernels

import (
	"math"

	"github.com/skein-ai/skein/engine/internal/par"
)

// Element-wise kernels of the training and sampling passes. Each is one pass over its rows, split
// across the cores. Reductions accumulate in float64 (the 16-lane ones in float32 lanes whose
// sums are added in float64), so float32 passes stay close to float64 ones (tested to 1e-3).

// ParallelRows runs fn over [0,n) split into one range per core (par.Rows). A panic in any
// range is raised again in the caller's goroutine, where the pass's recover turns it into an
// error.
func ParallelRows(n int, fn func(lo, hi int)) { par.Rows(n, fn) }

// RMSNorm writes y = x·inv·w row by row (rows of len(w)) and inv = 1/√(mean(x²)+eps) per row.
func RMSNorm[T Float](x, w []T, eps float64, y, inv []T) {
	width := len(w)
	ParallelRows(len(x)/width, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			xr := x[r*width : (r+1)*width]
			iv := T(1 / math.Sqrt(rowDot(xr, xr)/float64(width)+eps))
			inv[r] = iv
			rowMulScaled(y[r*width:(r+1)*width], xr, w, iv)
		}
	})
}

// RMSNormGGML is RMSNorm rounded as ggml-cpu's rms_norm and the mul by the weight after it:
// the float32 squares summed in float64 in order, the mean rounded to float32, scale =
// 1/sqrtf(mean + eps) in float32, y = (x·scale)·w. It differs from RMSNorm by an ulp now and
// then, which matters only where a later rounding to integers (llama.cpp's activation
// quantization) turns an ulp into a step.
func RMSNormGGML(x, w []float32, eps float64, y, inv []float32) {
	width := len(w)
	ParallelRows(len(x)/width, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			inv[r] = RMSNormRowGGML(x[r*width:(r+1)*width], w, eps, y[r*width:(r+1)*width])
		}
	})
}

// RMSNormRowGGML is RMSNormGGML of one row; it returns the scale.
func RMSNormRowGGML(x, w []float32, eps float64, y []float32) float32 {
	var sum float64
	for _, v := range x {
		sum += float64(float32(v * v))
	}
	mean := float32(sum / float64(len(x)))
	scale := 1 / float32(math.Sqrt(float64(mean+float32(eps)))) // sqrtf: double rounding is exact for sqrt
	for i, v := range x {
		y[i] = float32(v*scale) * w[i]
	}
	return scale
}

// RMSNormBack writes (or, with accumulate, adds) into dx the gradient of RMSNorm at x:
// with u = dy·w, dx = inv·u − x·inv³·(Σ u·x)/width.
func RMSNormBack[T Float](dy, x, inv, w []T, dx []T, accumulate bool) {
	width := len(w)
	ParallelRows(len(x)/width, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			o := r * width
			iv := float64(inv[r])
			c := T(iv * iv * iv * rowDot3(dy[o:o+width], w, x[o:o+width]) / float64(width))
			rowRMSBack(dx[o:o+width], dy[o:o+width], w, x[o:o+width], inv[r], c, accumulate)
		}
	})
}

// AddScaled does dst += alpha·src.
func AddScaled[T Float](dst, src []T, alpha T) {
	ParallelRows(len(dst)/256+1, func(lo, hi int) {
		lo, hi = lo*256, min(hi*256, len(dst))
		rowAxpy(dst[lo:hi], src[lo:hi], alpha)
	})
}

// ScaleAdd does dst = x + alpha·dst.
func ScaleAdd[T Float](dst, x []T, alpha T) {
	ParallelRows(len(dst)/256+1, func(lo, hi int) {
		lo, hi = lo*256, min(hi*256, len(dst))
		rowAxpby(dst[lo:hi], x[lo:hi], alpha)
	})
}

// AddBias adds bias to every row of y.
func AddBias[T Float](y, bias []T) {
	width := len(bias)
	ParallelRows(len(y)/width, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			yr := y[r*width : (r+1)*width]
			for i, b := range bias {
				yr[i] += b
			}
		}
	})
}

// SiluGate writes sig = σ(g) and out = g·σ(g)·u.
func SiluGate[T Float](g, u, sig, out []T) {
	sigmoids(sig, g)
	ParallelRows(len(g)/256+1, func(lo, hi int) {
		lo, hi = lo*256, min(hi*256, len(g))
		rowSiluGate(g[lo:hi], u[lo:hi], sig[lo:hi], out[lo:hi])
	})
}

// SiluGateBack writes the gradients of SiluGate: dg = da·u·σ·(1 + g·(1−σ)), du = da·g·σ.
func SiluGateBack[T Float](da, g, u, sig, dg, du []T) {
	ParallelRows(len(g)/256+1, func(lo, hi int) {
		lo, hi = lo*256, min(hi*256, len(g))
		rowSiluGateBack(da[lo:hi], g[lo:hi], u[lo:hi], sig[lo:hi], dg[lo:hi], du[lo:hi])
	})
}

// Exp32 is e^x in float32: x = k·ln2 + r with |r| ≤ ln2/2, e^r by its degree-6 Taylor polynomial
// (relative error < 2e-7), times 2^k added to its exponent bits: e^r is in [0.7, 1.42], so the
// product stays a normal float32 for every k of the range, even k = 128 just below overflow.
func Exp32(x float32) float32 {
	const (
		log2e = 1.44269504088896341
		ln2hi = 0.693145751953125
		ln2lo = 1.42860682030941723212e-6
	)
	switch {
	case x != x: //nolint:gocritic // NaN
		return x
	case x > 88.72:
		return float32(math.Inf(1))
	case x < -87.33:
		return 0
	}
	kf := x * log2e
	var k int32
	if kf >= 0 {
		k = int32(kf + 0.5)
	} else {
		k = int32(kf - 0.5)
	}
	r := x - float32(k)*ln2hi - float32(k)*ln2lo
	p := 1 + r*(1+r*(0.5+r*(1.0/6+r*(1.0/24+r*(1.0/120+r*(1.0/720))))))
	return math.Float32frombits(math.Float32bits(p) + uint32(k)<<23)
}

func expScaledShiftScalar(v []float32, scale, shift float32) float64 {
	var sum float64
	for i, x := range v {
		e := Exp32(x*scale - shift)
		v[i] = e
		sum += float64(e)
	}
	return sum
}

func sigmoidScalar(dst, src []float32) {
	for i, x := range src {
		dst[i] = 1 / (1 + Exp32(-x))
	}
}

// ExpShift sets v[i] = e^(v[i]·scale − shift) and returns their sum (16 lanes at a time in float32).
func ExpShift[T Float](v []T, scale, shift T) float64 {
	if f, ok := any(v).([]float32); ok {
		return rows.expScaledShift(f, float32(scale), float32(shift))
	}
	var sum float64
	for i, x := range v {
		e := T(math.Exp(float64(x*scale - shift)))
		v[i] = e
		sum += float64(e)
	}
	return sum
}

// sigmoids sets dst = σ(src).
func sigmoids[T Float](dst, src []T) {
	ParallelRows(len(src)/1024+1, func(lo, hi int) {
		lo, hi = lo*1024, min(hi*1024, len(src))
		if f, ok := any(src).([]float32); ok {
			rows.sigmoid(any(dst).([]float32)[lo:hi], f[lo:hi])
			return
		}
		for i := lo; i < hi; i++ {
			dst[i] = T(1 / (1 + math.Exp(-float64(src[i]))))
		}
	})
}

// SoftmaxCausal turns scores [rows, S] into attention probabilities in place: row r is query
// position r mod S (rows are G groups of S positions), which sees keys 0..pos; later keys get 0.
func SoftmaxCausal[T Float](scores []T, S int, scale T) {
	ParallelRows(len(scores)/S, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			SoftmaxRow(scores[r*S:(r+1)*S], r%S, scale)
		}
	})
}

// SoftmaxRow turns one row of scores into probabilities over keys 0..last (scaled by scale > 0);
// later keys get 0.
func SoftmaxRow[T Float](row []T, last int, scale T) {
	m := RowMax(row[:last+1]) * scale
	inv := T(1 / ExpShift(row[:last+1], scale, m))
	for s := range row[:last+1] {
		row[s] *= inv
	}
	clear(row[last+1:])
}

// SoftmaxBack turns dP into the score gradient in place: dS = P·(dP − Σ P·dP)·scale.
func SoftmaxBack[T Float](p, dp []T, S int, scale T) {
	ParallelRows(len(p)/S, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			n := r%S + 1 // later keys have P = 0
			pr, dr := p[r*S:r*S+n], dp[r*S:(r+1)*S]
			rowSoftmaxBack(pr, dr[:n], T(rowDot(pr, dr[:n])), scale)
			clear(dr[n:])
		}
	})
}

// Axpy does dst += alpha·src over one row, on the calling goroutine: for small rows inside a
// caller's own ParallelRows (the DeltaNet's per-head state updates), where AddScaled's split
// into goroutines would cost more than the row.
func Axpy[T Float](dst, src []T, alpha T) { rowAxpy(dst, src, alpha) }

// Dot is Σ a·b over one row, on the calling goroutine (as Axpy).
func Dot[T Float](a, b []T) float64 { return rowDot(a, b) }

// MulScaled sets dst = a·b·s over one row, on the calling goroutine (as Axpy); with b all ones
// it scales a row (the DeltaNet's decay of its state).
func MulScaled[T Float](dst, a, b []T, s T) { rowMulScaled(dst, a, b, s) }
