package engine

// Scalar row kernels: the float64 path, machines without AVX2, and the tails of the 8- and
// 16-lane versions in simd_avx2_amd64.go and simd_amd64.go.

func maxScalar[T float](v []T) T {
	m := v[0]
	for _, x := range v[1:] {
		m = max(m, x)
	}
	return m
}

func dotScalar[T float](a, b []T) float64 {
	var s float64
	for i, x := range a {
		s += float64(x) * float64(b[i])
	}
	return s
}

func dot3Scalar[T float](a, b, c []T) float64 {
	var s float64
	for i, x := range a {
		s += float64(x) * float64(b[i]) * float64(c[i])
	}
	return s
}

func axpbyScalar[T float](dst, x []T, alpha T) {
	for i := range dst {
		dst[i] = x[i] + alpha*dst[i]
	}
}

func axpyScalar[T float](dst, x []T, alpha T) {
	for i := range dst {
		dst[i] += alpha * x[i]
	}
}

func mulScaledScalar[T float](dst, a, b []T, s T) {
	for i := range dst {
		dst[i] = a[i] * b[i] * s
	}
}

func rmsBackScalar[T float](dx, dy, w, x []T, inv, c T, accumulate bool) {
	for i := range dx {
		g := inv*dy[i]*w[i] - x[i]*c
		if accumulate {
			g += dx[i]
		}
		dx[i] = g
	}
}

func softmaxBackRowScalar[T float](p, dr []T, d, scale T) {
	for i, v := range p {
		dr[i] = v * (dr[i] - d) * scale
	}
}

func siluGateScalar[T float](g, u, sig, out []T) {
	for i := range g {
		out[i] = g[i] * sig[i] * u[i]
	}
}

func siluGateBackScalar[T float](da, g, u, sig, dg, du []T) {
	for i := range g {
		s := sig[i]
		dg[i] = da[i] * u[i] * s * (1 + g[i]*(1-s))
		du[i] = da[i] * g[i] * s
	}
}

// The dispatchers below send float32 rows to the vector kernels (kernelPath picks which).

func rowMax[T float](v []T) T {
	if f, ok := any(v).([]float32); ok {
		return T(max32(f))
	}
	return maxScalar(v)
}

func rowDot[T float](a, b []T) float64 {
	if f, ok := any(a).([]float32); ok {
		return dot32(f, any(b).([]float32))
	}
	return dotScalar(a, b)
}

func rowDot3[T float](a, b, c []T) float64 {
	if f, ok := any(a).([]float32); ok {
		return dot3_32(f, any(b).([]float32), any(c).([]float32))
	}
	return dot3Scalar(a, b, c)
}

func rowAxpby[T float](dst, x []T, alpha T) {
	if f, ok := any(dst).([]float32); ok {
		axpby32(f, any(x).([]float32), float32(alpha))
		return
	}
	axpbyScalar(dst, x, alpha)
}

func rowAxpy[T float](dst, x []T, alpha T) {
	if f, ok := any(dst).([]float32); ok {
		axpy32(f, any(x).([]float32), float32(alpha))
		return
	}
	axpyScalar(dst, x, alpha)
}

func rowMulScaled[T float](dst, a, b []T, s T) {
	if f, ok := any(dst).([]float32); ok {
		mulScaled32(f, any(a).([]float32), any(b).([]float32), float32(s))
		return
	}
	mulScaledScalar(dst, a, b, s)
}

func rowRMSBack[T float](dx, dy, w, x []T, inv, c T, accumulate bool) {
	if f, ok := any(dx).([]float32); ok {
		rmsBack32(f, any(dy).([]float32), any(w).([]float32), any(x).([]float32), float32(inv), float32(c), accumulate)
		return
	}
	rmsBackScalar(dx, dy, w, x, inv, c, accumulate)
}

func rowSoftmaxBack[T float](p, dr []T, d, scale T) {
	if f, ok := any(p).([]float32); ok {
		softmaxBackRow32(f, any(dr).([]float32), float32(d), float32(scale))
		return
	}
	softmaxBackRowScalar(p, dr, d, scale)
}

func rowSiluGate[T float](g, u, sig, out []T) {
	if f, ok := any(g).([]float32); ok {
		siluGate32(f, any(u).([]float32), any(sig).([]float32), any(out).([]float32))
		return
	}
	siluGateScalar(g, u, sig, out)
}

func rowSiluGateBack[T float](da, g, u, sig, dg, du []T) {
	if f, ok := any(da).([]float32); ok {
		siluGateBack32(f, any(g).([]float32), any(u).([]float32), any(sig).([]float32), any(dg).([]float32), any(du).([]float32))
		return
	}
	siluGateBackScalar(da, g, u, sig, dg, du)
}
