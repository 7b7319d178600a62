package kernels

// Scalar row kernels: the float64 path, machines without AVX2, and the tails of the 8- and
// 16-lane versions in rows_avx2_amd64.go and rows_avx512_amd64.go.

func maxScalar[T Float](v []T) T {
	m := v[0]
	for _, x := range v[1:] {
		m = max(m, x)
	}
	return m
}

func dotScalar[T Float](a, b []T) float64 {
	var s float64
	for i, x := range a {
		s += float64(x) * float64(b[i])
	}
	return s
}

func dot3Scalar[T Float](a, b, c []T) float64 {
	var s float64
	for i, x := range a {
		s += float64(x) * float64(b[i]) * float64(c[i])
	}
	return s
}

func axpbyScalar[T Float](dst, x []T, alpha T) {
	for i := range dst {
		dst[i] = x[i] + alpha*dst[i]
	}
}

func axpyScalar[T Float](dst, x []T, alpha T) {
	for i := range dst {
		dst[i] += alpha * x[i]
	}
}

func mulScaledScalar[T Float](dst, a, b []T, s T) {
	for i := range dst {
		dst[i] = a[i] * b[i] * s
	}
}

func rmsBackScalar[T Float](dx, dy, w, x []T, inv, c T, accumulate bool) {
	for i := range dx {
		g := inv*dy[i]*w[i] - x[i]*c
		if accumulate {
			g += dx[i]
		}
		dx[i] = g
	}
}

func softmaxBackRowScalar[T Float](p, dr []T, d, scale T) {
	for i, v := range p {
		dr[i] = v * (dr[i] - d) * scale
	}
}

func siluGateScalar[T Float](g, u, sig, out []T) {
	for i := range g {
		out[i] = g[i] * sig[i] * u[i]
	}
}

func siluGateBackScalar[T Float](da, g, u, sig, dg, du []T) {
	for i := range g {
		s := sig[i]
		dg[i] = da[i] * u[i] * s * (1 + g[i]*(1-s))
		du[i] = da[i] * g[i] * s
	}
}

// The dispatchers below send float32 rows to the active path's row kernels (paths.go).

func RowMax[T Float](v []T) T {
	if f, ok := any(v).([]float32); ok {
		return T(rows.max(f))
	}
	return maxScalar(v)
}

func rowDot[T Float](a, b []T) float64 {
	if f, ok := any(a).([]float32); ok {
		return rows.dot(f, any(b).([]float32))
	}
	return dotScalar(a, b)
}

func rowDot3[T Float](a, b, c []T) float64 {
	if f, ok := any(a).([]float32); ok {
		return rows.dot3(f, any(b).([]float32), any(c).([]float32))
	}
	return dot3Scalar(a, b, c)
}

func rowAxpby[T Float](dst, x []T, alpha T) {
	if f, ok := any(dst).([]float32); ok {
		rows.axpby(f, any(x).([]float32), float32(alpha))
		return
	}
	axpbyScalar(dst, x, alpha)
}

func rowAxpy[T Float](dst, x []T, alpha T) {
	if f, ok := any(dst).([]float32); ok {
		rows.axpy(f, any(x).([]float32), float32(alpha))
		return
	}
	axpyScalar(dst, x, alpha)
}

func rowMulScaled[T Float](dst, a, b []T, s T) {
	if f, ok := any(dst).([]float32); ok {
		rows.mulScaled(f, any(a).([]float32), any(b).([]float32), float32(s))
		return
	}
	mulScaledScalar(dst, a, b, s)
}

func rowRMSBack[T Float](dx, dy, w, x []T, inv, c T, accumulate bool) {
	if f, ok := any(dx).([]float32); ok {
		rows.rmsBack(f, any(dy).([]float32), any(w).([]float32), any(x).([]float32), float32(inv), float32(c), accumulate)
		return
	}
	rmsBackScalar(dx, dy, w, x, inv, c, accumulate)
}

func rowSoftmaxBack[T Float](p, dr []T, d, scale T) {
	if f, ok := any(p).([]float32); ok {
		rows.softmaxBackRow(f, any(dr).([]float32), float32(d), float32(scale))
		return
	}
	softmaxBackRowScalar(p, dr, d, scale)
}

func rowSiluGate[T Float](g, u, sig, out []T) {
	if f, ok := any(g).([]float32); ok {
		rows.siluGate(f, any(u).([]float32), any(sig).([]float32), any(out).([]float32))
		return
	}
	siluGateScalar(g, u, sig, out)
}

func rowSiluGateBack[T Float](da, g, u, sig, dg, du []T) {
	if f, ok := any(da).([]float32); ok {
		rows.siluGateBack(f, any(g).([]float32), any(u).([]float32), any(sig).([]float32), any(dg).([]float32), any(du).([]float32))
		return
	}
	siluGateBackScalar(da, g, u, sig, dg, du)
}

func roundBF16Scalar(dst []uint16, src []float32) {
	for i, v := range src {
		dst[i] = BF16Of(v)
	}
}
