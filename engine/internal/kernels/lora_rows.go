package kernels

// LoRARows adds a rank-r term to rows of y, serially (the caller spreads runs over the cores):
// for each of R rows, xa = x_row·Aᵀ (r dot products over A [r, K]), then y_row += Σ_j xa_j·Bs_j
// over the rows of Bs [r, N] (the pre-scaled Bᵀ). For rows of a decode step, where a call of
// the GEMM costs more than these products. Every row sums in the same order.
func LoRARows(y, x, a, bs []float32, R, K, r, N int) {
	if R == 0 || r == 0 {
		return
	}
	_, _, _, _ = y[R*N-1], x[R*K-1], a[r*K-1], bs[r*N-1] // sizes checked once, up front
	xa := make([]float32, r)
	for row := range R {
		f32NT(xa, x[row*K:(row+1)*K], a, 1, K, r, 0, r)
		yr := y[row*N : (row+1)*N]
		for j, v := range xa {
			rowAxpy(yr, bs[j*N:(j+1)*N], v)
		}
	}
}
