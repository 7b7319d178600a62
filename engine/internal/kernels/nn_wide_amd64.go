//go:build goexperiment.simd && amd64

package kernels

// The few-row products x·W over a weight read where it is ([K, N]: a decode step's products)
// run in assembly where they can (nn_avx512_amd64.s, nn_avx2_amd64.s): the archsimd tiles that
// did them ran at a third of the FMA units' rate in cache (Go's vector code moved accumulators
// between registers and checked bounds at every load), and a decode step of 8 rows read the
// weights at half the rate the kernels below do. Each output is the same chain of FMAs over k,
// so the bits are the tiles' and the scalar loops'.

// assembly turns the kernels of this file on (tests compare them with the tiles they replace).
var assembly = true

// nnKernel sets y[0:rows, 0:width] (rows ldy apart) = x[0:rows, 0:k]·w[0:k, 0:width] (x's rows
// ldx apart, w's ldw), for its own rows and width.
type nnKernel[W float32 | uint16] func(k int, x *float32, ldx int, w *W, ldw int, y *float32, ldy int)

// f32NNWide runs what it can of f32NN's columns [j0, j1): on an AVX-512 path rows in groups of
// 12, 8 and 4 over 32-column panels, and a 16-column panel left over (a LoRA's x·A of rank 16
// is one) through the AVX2 kernels; on AVX2 groups of 6 and 4 over 16 columns. It returns the
// rows and columns it did, [0, rows) × [j0, cols); (0, j0) when it did nothing.
func f32NNWide(y, x []float32, w []float32, R, K, N, j0, j1 int) (rows, cols int) {
	narrow := func(n int) nnKernel[float32] { return [...]nnKernel[float32]{4: nn4x16asm, 6: nn6x16asm}[n] }
	switch {
	case !assembly:
	case rowPath(active) >= AVX512:
		rows, cols = nnWide(y, x, w, R, K, N, j0, j1, 32, R/4*4, groupOf4s, func(n int) nnKernel[float32] {
			return [...]nnKernel[float32]{4: nn4x32asm, 8: nn8x32asm, 12: nn12x32asm}[n]
		})
		if r, c := nnWide(y, x, w, R, K, N, cols, j1, 16, R/4*4, groupOf6s, narrow); r > 0 {
			return r, c
		}
		return rows, cols
	case active >= AVX2:
		return nnWide(y, x, w, R, K, N, j0, j1, 16, evenFrom4(R), groupOf6s, narrow)
	}
	return 0, j0
}

// bf16NNWide is f32NNWide over bf16 weights kept as rows (an AVX2 path's: with the bf16 unit
// they are packed in pairs and never reach bf16NN), each weight row widened exactly in the kernel.
func bf16NNWide(y, x []float32, w []uint16, R, K, N, j0, j1 int) (rows, cols int) {
	if !assembly || active < AVX2 {
		return 0, j0
	}
	return nnWide(y, x, w, R, K, N, j0, j1, 16, evenFrom4(R), groupOf6s, func(n int) nnKernel[uint16] {
		return [...]nnKernel[uint16]{4: nn4x16bf16asm, 6: nn6x16bf16asm}[n]
	})
}

// f32NTWide runs what it can of f32NT's outputs [n0, n1) (x·Wᵀ, W [N, K]): every row of x
// when there are at least two, in groups of 3 and 2 against 4 rows of W at a time, over the
// whole blocks of 8 outputs the tiles would have taken (so an output sums in the same order
// whether the tiles or these kernels compute it, and whatever the split across cores). It
// returns [0, rows) × [n0, cols); (0, n0) when it did nothing.
func f32NTWide(y, x []float32, w []float32, R, K, N, n0, n1 int) (rows, cols int) {
	if !assembly || active < AVX2 {
		return 0, n0
	}
	return ntWide(y, x, w, R, K, N, n0, n1, dotF32Scalar, func(n int) ntKernel[float32] {
		return [...]ntKernel[float32]{2: nt2x4asm, 3: nt3x4asm}[n]
	})
}

// bf16NTWide is f32NTWide over bf16 rows, each weight row widened exactly in the kernel.
func bf16NTWide(y, x []float32, w []uint16, R, K, N, n0, n1 int) (rows, cols int) {
	if !assembly || active < AVX2 {
		return 0, n0
	}
	return ntWide(y, x, w, R, K, N, n0, n1, dotBF16Scalar, func(n int) ntKernel[uint16] {
		return [...]ntKernel[uint16]{2: nt2x4bf16asm, 3: nt3x4bf16asm}[n]
	})
}

// ntKernel sets y[i*ldy + j] = x[i]·w[j] over the first 8·k8 values of k, for its rows i of x
// and j < 4 of w.
type ntKernel[W float32 | uint16] func(k8 int, x *float32, ldx int, w *W, ldw int, y *float32, ldy int)

func ntWide[W float32 | uint16](y, x []float32, w []W, R, K, N, n0, n1 int, tail func(x []float32, w []W) float32, kernel func(n int) ntKernel[W]) (int, int) {
	rows, cols, k8 := R, n0+(n1-n0)/8*8, K/8
	if R < 2 || k8 == 0 || cols == n0 {
		return 0, n0
	}
	_, _, _ = y[(rows-1)*N+cols-1], x[rows*K-1], w[cols*K-1] // every kernel's reach, checked once
	for n := n0; n < cols; n += 4 {
		for r := 0; r < rows; {
			g := 3
			if left := rows - r; left < 3 || left == 4 {
				g = 2 // 3s and 2s cover any count from 2
			}
			kernel(g)(k8, &x[r*K], K, &w[n*K], K, &y[r*N+n], N)
			r += g
		}
	}
	if k := k8 * 8; k < K { // the tiles' scalar tails (bfAddTails4)
		for r := range rows {
			for n := n0; n < cols; n++ {
				y[r*N+n] += tail(x[r*K+k:(r+1)*K], w[n*K+k:(n+1)*K])
			}
		}
	}
	return rows, cols
}

// nnWide runs rows [0, rows) of columns [j0, cols) in panels of width, the rows of each panel
// in the groups group(rows left) gives, each through kernel(group).
func nnWide[W float32 | uint16](y, x []float32, w []W, R, K, N, j0, j1, width, rows int, group func(left int) int, kernel func(n int) nnKernel[W]) (int, int) {
	cols := j0 + (j1-j0)/width*width
	if rows == 0 || K == 0 || cols == j0 {
		return 0, j0
	}
	_, _, _ = y[(rows-1)*N+cols-1], x[rows*K-1], w[(K-1)*N+cols-1] // every kernel's reach, checked once
	for j := j0; j < cols; j += width {
		for r := 0; r < rows; {
			n := group(rows - r)
			kernel(n)(K, &x[r*K], K, &w[j], N, &y[r*N+j], N)
			r += n
		}
	}
	return rows, cols
}

// groupOf4s covers a multiple of 4 rows with 12s, then an 8 or a 4.
func groupOf4s(left int) int { return min(12, left/4*4) }

// evenFrom4 is the most rows groups of 6 and 4 cover: R rounded down to even, none under 4.
func evenFrom4(R int) int {
	if R < 4 {
		return 0
	}
	return R / 2 * 2
}

// groupOf6s covers an even number of rows, at least 4, with 6s and 4s: a 6 unless it would
// leave 2 (8 is two 4s).
func groupOf6s(left int) int {
	if left >= 6 && left != 8 {
		return 6
	}
	return 4
}

//go:noescape
func nn12x32asm(k int, x *float32, ldx int, w *float32, ldw int, y *float32, ldy int)

//go:noescape
func nn8x32asm(k int, x *float32, ldx int, w *float32, ldw int, y *float32, ldy int)

//go:noescape
func nn4x32asm(k int, x *float32, ldx int, w *float32, ldw int, y *float32, ldy int)

//go:noescape
func nn6x16asm(k int, x *float32, ldx int, w *float32, ldw int, y *float32, ldy int)

//go:noescape
func nn4x16asm(k int, x *float32, ldx int, w *float32, ldw int, y *float32, ldy int)

//go:noescape
func nn6x16bf16asm(k int, x *float32, ldx int, w *uint16, ldw int, y *float32, ldy int)

//go:noescape
func nn4x16bf16asm(k int, x *float32, ldx int, w *uint16, ldw int, y *float32, ldy int)

//go:noescape
func nt3x4asm(k8 int, x *float32, ldx int, w *float32, ldw int, y *float32, ldy int)

//go:noescape
func nt2x4asm(k8 int, x *float32, ldx int, w *float32, ldw int, y *float32, ldy int)

//go:noescape
func nt3x4bf16asm(k8 int, x *float32, ldx int, w *uint16, ldw int, y *float32, ldy int)

//go:noescape
func nt2x4bf16asm(k8 int, x *float32, ldx int, w *uint16, ldw int, y *float32, ldy int)
