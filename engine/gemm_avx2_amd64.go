//go:build goexperiment.simd && amd64

package engine

import (
	"sync"

	"simd/archsimd"
)

// A float32 GEMM for AVX2 + FMA, BLIS-style: B is packed in panels of 16 columns for a block of
// gemmKC contracting steps, A is read in place six rows at a time, and a 6×16 micro-kernel keeps its 12
// accumulators (8 lanes each) in registers: 12 independent FMA chains cover the FMA units'
// latency, where the backend's 4×16 kernel has 8. Each output is one chain of FMAs over k in
// order (a block of k goes on from what the last one left in c), whatever the number of cores
// (the cores split the rows): results do not depend on scheduling, and are the bits the few-row
// kernels (bf16_kernels.go) compute for x·W.

const (
	gemmMR = 6   // rows of the micro-kernel
	gemmNR = 16  // columns of the micro-kernel: two 8-lane vectors
	gemmKC = 256 // contracting steps per packed block: a B micro-panel (16 KB) stays in L1
	gemmMC = 96  // rows per block of A (96 × 256 floats, 96 KB: L2), the unit the cores split
	gemmNC = 2048
)

// haveGEMM: the CPU runs the assembly micro-kernel.
var haveGEMM = archsimd.X86.AVX2() && archsimd.X86.FMA()

func init() {
	if haveGEMM {
		gemmPath = gemmAVX2
	}
}

// gemmBatched runs gemmF32 over batch independent products laid out one after another: the
// batches are split across the cores (each product then runs on one), or, for one, its rows.
// Products of at most directF32Rows rows take the few-row kernels instead: packing B would cost
// as much as multiplying by it once.
func gemmBatched(c, a, b []float32, batch, M, K, N int, transB bool) {
	if M <= directF32Rows {
		for i := range batch {
			f32Product(c[i*M*N:][:M*N], a[i*M*K:][:M*K], b[i*K*N:][:K*N], M, K, N, transB)
		}
		return
	}
	if batch == 1 {
		gemmF32(c, a, b, M, K, N, transB, true)
		return
	}
	_, _, _ = c[batch*M*N-1], a[batch*M*K-1], b[batch*K*N-1]
	one := func(i int) {
		gemmF32(c[i*M*N:][:M*N], a[i*M*K:][:M*K], b[i*K*N:][:K*N], M, K, N, transB, false)
	}
	if batch*M*K*N < 1<<18 {
		for i := range batch {
			one(i)
		}
		return
	}
	parallelRows(batch, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			one(i)
		}
	})
}

// gemmF32 sets c [M, N] = a [M, K] · b, b given as [K, N], or [N, K] when transB; parallel
// splits its row blocks across the cores.
func gemmF32(c, a, b []float32, M, K, N int, transB, parallel bool) {
	if M == 0 || N == 0 {
		return
	}
	_, _, _ = c[M*N-1], a[M*K-1], b[K*N-1]
	if K == 0 {
		clear(c[:M*N])
		return
	}
	nc := min(N, gemmNC)
	bp := gemmBuffers.get((min(K, gemmKC)) * roundUp(nc, gemmNR))
	defer gemmBuffers.put(bp)
	for jc := 0; jc < N; jc += gemmNC {
		ncur := min(gemmNC, N-jc)
		for pc := 0; pc < K; pc += gemmKC {
			kc := min(gemmKC, K-pc)
			packB(bp, b, K, N, pc, kc, jc, ncur, transB)
			first := pc == 0
			blocks := (M + gemmMC - 1) / gemmMC
			work := func(lo, hi int) {
				edgeA := gemmBuffers.get(gemmMR * kc) // a last panel of fewer than 6 rows, padded
				defer gemmBuffers.put(edgeA)
				for blk := lo; blk < hi; blk++ {
					ic := blk * gemmMC
					macroKernel(c, a, edgeA, bp, K, N, ic, min(gemmMC, M-ic), pc, jc, ncur, kc, first)
				}
			}
			if !parallel || blocks == 1 || M*kc*ncur < 1<<18 {
				work(0, blocks)
			} else {
				parallelRows(blocks, work)
			}
		}
	}
}

func roundUp(n, m int) int { return (n + m - 1) / m * m }

// packB copies b[pc:pc+kc, jc:jc+nc] (or its transpose's) into panels of gemmNR columns, each
// kc rows of 16 contiguous values, zero-padded past nc.
func packB(dst, b []float32, K, N, pc, kc, jc, nc int, transB bool) {
	for j0 := 0; j0 < nc; j0 += gemmNR {
		w := min(gemmNR, nc-j0)
		panel := dst[(j0/gemmNR)*kc*gemmNR:][:kc*gemmNR]
		if transB { // b is [N, K]: column j of the panel is a row of b
			if w < gemmNR {
				clear(panel)
			}
			for j := range w {
				src := b[(jc+j0+j)*K+pc:][:kc]
				for p, v := range src {
					panel[p*gemmNR+j] = v
				}
			}
			continue
		}
		for p := range kc {
			row := panel[p*gemmNR : p*gemmNR+gemmNR : p*gemmNR+gemmNR]
			copy(row, b[(pc+p)*N+jc+j0:][:w])
			clear(row[w:])
		}
	}
}

// padRows copies rows r0…r0+h of a (columns pc…pc+kc) into dst as a [6, kc] block, the rows
// past h zero: a last panel of fewer than 6 rows, which the kernel then reads in place like any
// other (lda kc).
func padRows(dst, a []float32, K, r0, h, pc, kc int) {
	dst = dst[:gemmMR*kc]
	for i := range h {
		copy(dst[i*kc:][:kc], a[(r0+i)*K+pc:][:kc])
	}
	clear(dst[h*kc:])
}

// macroKernel multiplies rows ic…ic+mc of a (columns pc…pc+kc, read in place) by a packed B
// block into c's tile at (ic, jc). A last panel of fewer than 6 rows is copied, zero-padded.
func macroKernel(c, a, edgeA, bp []float32, K, N, ic, mc, pc, jc, nc, kc int, first bool) {
	var edge [gemmMR * gemmNR]float32
	full := mc / gemmMR * gemmMR
	if h := mc - full; h > 0 {
		padRows(edgeA, a, K, ic+full, h, pc, kc)
	}
	for j0 := 0; j0 < nc; j0 += gemmNR {
		bpan := bp[(j0/gemmNR)*kc*gemmNR:][:kc*gemmNR]
		w := min(gemmNR, nc-j0)
		for i0 := 0; i0 < mc; i0 += gemmMR {
			h := min(gemmMR, mc-i0)
			if h == gemmMR && w == gemmNR {
				micro6x16A(kc, a[(ic+i0)*K+pc:], K, bpan, c[(ic+i0)*N+jc+j0:], N, first)
				continue
			}
			// A partial tile runs whole in edge, which starts from c's valid part (so each output
			// stays one chain of FMAs over k) and is copied back.
			if !first {
				for i := range h {
					copy(edge[i*gemmNR:][:w], c[(ic+i0+i)*N+jc+j0:][:w])
				}
			}
			if h == gemmMR {
				micro6x16A(kc, a[(ic+i0)*K+pc:], K, bpan, edge[:], gemmNR, first)
			} else {
				micro6x16A(kc, edgeA, kc, bpan, edge[:], gemmNR, first)
			}
			for i := range h {
				copy(c[(ic+i0+i)*N+jc+j0:][:w], edge[i*gemmNR:][:w])
			}
		}
	}
}

// micro6x16A sets c[0:6, 0:16] (row stride ldc) to a[0:6, 0:kc]·B for a packed B panel (kc
// steps of 16), A read in place (rows lda apart), each output's chain of FMAs starting from zero
// (first) or from what c holds; in assembly (gemm_amd64.s). The slices are checked here, once:
// the assembly reads and writes exactly these ranges.
func micro6x16A(kc int, a []float32, lda int, b, c []float32, ldc int, first bool) {
	if kc <= 0 {
		return
	}
	_ = a[5*lda+kc-1]
	_ = b[kc*gemmNR-1]
	_ = c[5*ldc+gemmNR-1]
	micro6x16asmA(kc, &a[0], lda, &b[0], &c[0], ldc, first)
}

//go:noescape
func micro6x16asmA(kc int, a *float32, lda int, b, c *float32, ldc int, first bool)

// gemmBuffers reuses packing buffers between calls.
var gemmBuffers bufferPool

type bufferPool struct{ p sync.Pool }

func (b *bufferPool) get(n int) []float32 {
	if v, ok := b.p.Get().(*[]float32); ok && cap(*v) >= n {
		return (*v)[:n]
	}
	return make([]float32, n)
}

func (b *bufferPool) put(s []float32) { b.p.Put(&s) }
