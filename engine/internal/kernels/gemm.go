package kernels

import (
	"runtime"
	"sync"
)

// A float32 GEMM, BLIS-style: B is packed in panels of nr columns for a block of kc contracting
// steps, A is read in place mr rows at a time, and an mr×nr micro-kernel in assembly keeps its
// accumulators in registers. Each path brings its micro-kernel (gemm_*_amd64.s) and blocking; the
// packing, the blocks, the edges and the split across cores below are shared. Each output is one
// chain of FMAs over k in order (a block of k goes on from what the last one left in c), whatever
// the number of cores (the cores split the rows): results do not depend on scheduling, and are
// the bits the few-row kernels (bf16.go) compute for x·W.

// microKernel is one path's micro-kernel and its blocking. E is the unit of A and of packed B
// along k: a float32, or a pair of bf16 values in one uint32 (k even in the low half), which
// the bf16 kernels multiply two at a time.
type microKernel[E float32 | uint32] struct {
	name   string
	mr, nr int // rows and columns of the register tile
	kc     int // steps of k (units of E) per packed block: a B micro-panel (kc·nr) stays in L1
	kunit  int // the kernel takes k in multiples of this (AMX: 16 pairs); 0 or 1: any
	mc     int // rows per block of A (a multiple of mr, kc·mc units in L2), the unit the cores split
	nc     int // columns per packed block of B
	// run sets c[0:mr, 0:nr] (row stride ldc) to a[0:mr, 0:kc]·B for a packed B micro-panel (kc
	// steps of nr), A rows lda apart, each output's chain starting from zero (first) or from c.
	run func(kc int, a *E, lda int, b *E, c *float32, ldc int, first bool)
}

// gemmKernel is the active path's float32 micro-kernel, nil where the path has none (scalar:
// the engine multiplies with its backend).
func gemmKernel() *microKernel[float32] {
	if !vectorBuild {
		return nil
	}
	switch rowPath(active) {
	case AVX512:
		return &avx512Micro
	case AVX2:
		return &avx2Micro
	}
	return nil
}

// HaveGEMM reports whether the active path has a float32 GEMM (MatMul); without one the engine
// multiplies with its backend.
func HaveGEMM() bool { return gemmKernel() != nil }

// GEMMName names the float32 GEMM in use (the bench reports it beside the peak it measures).
func GEMMName() string {
	if km := gemmKernel(); km != nil {
		return km.name
	}
	return "f32 backend matmul"
}

// MatMul sets c = a·b for batch independent products laid out one after another, each a [M, K]
// times b [K, N] (or [N, K] when transB). The batches are split across the cores (each product
// then runs on one), or, for one, its rows. Products of at most FewRowsF32() rows take the
// few-row kernels instead: packing B would cost as much as multiplying by it once. The active
// path must have a GEMM (HaveGEMM).
func MatMul(c, a, b []float32, batch, M, K, N int, transB bool) {
	km := gemmKernel()
	if km == nil {
		panic("kernels: MatMul on a path without a GEMM")
	}
	if N <= avx2Micro.nr && km == &avx512Micro {
		// Sixteen columns or fewer (x·Aᵀ of a LoRA of rank ≤ 16) fill the 6×16 tile exactly; the
		// 12×32 one would run every tile half empty, through the edge buffer.
		km = &avx2Micro
	}
	if M <= FewRowsF32() {
		for i := range batch {
			F32Product(c[i*M*N:][:M*N], a[i*M*K:][:M*K], b[i*K*N:][:K*N], M, K, N, transB)
		}
		return
	}
	one := func(i int, parallel bool) {
		gemmF32(km, c[i*M*N:][:M*N], a[i*M*K:][:M*K], b[i*K*N:][:K*N], M, K, N, transB, parallel)
	}
	if batch == 1 {
		one(0, true)
		return
	}
	_, _, _ = c[batch*M*N-1], a[batch*M*K-1], b[batch*K*N-1]
	if batch*M*K*N < 1<<18 {
		for i := range batch {
			one(i, false)
		}
		return
	}
	ParallelRows(batch, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			one(i, false)
		}
	})
}

// MatMulAdd adds a [M, K] · b to c [M, N], b given as [K, N] (or [N, K] when transB): each output's
// chain of FMAs starts from what c holds, so a product and a sum are one pass over c (a LoRA's
// rank-r term added to the base product). The active path must have a GEMM (HaveGEMM).
func MatMulAdd(c, a, b []float32, M, K, N int, transB bool) {
	km := gemmKernel()
	if km == nil {
		panic("kernels: MatMulAdd on a path without a GEMM")
	}
	if N <= avx2Micro.nr && km == &avx512Micro {
		km = &avx2Micro // as MatMul
	}
	if M == 0 || N == 0 {
		return
	}
	_, _, _ = c[M*N-1], a[M*K-1], b[K*N-1]
	if M <= FewRowsF32() { // a decode step: no packing, as MatMul
		p := getBuffer[float32](M * N)
		defer putBuffer(p)
		F32Product(p, a, b, M, K, N, transB)
		rows.axpy(c[:M*N], p, 1)
		return
	}
	km.gemmInto(c, a, M, K, N, func(dst []float32, pc, kc, jc, nc int) {
		packB(dst, b, K, N, pc, kc, jc, nc, km.nr, transB)
	}, true, true)
}

// gemmF32 sets c [M, N] = a [M, K] · b, b given as [K, N], or [N, K] when transB.
func gemmF32(km *microKernel[float32], c, a, b []float32, M, K, N int, transB, parallel bool) {
	km.gemm(c, a, M, K, N, func(dst []float32, pc, kc, jc, nc int) {
		packB(dst, b, K, N, pc, kc, jc, nc, km.nr, transB)
	}, parallel)
}

// gemm sets c [M, N] = a [M, K] · B, where pack writes B's rows pc…pc+kc, columns jc…jc+nc as
// panels of nr columns (each kc rows of nr, zero-padded past nc); parallel splits the row blocks
// across the cores.
func (km *microKernel[E]) gemm(c []float32, a []E, M, K, N int, pack func(dst []E, pc, kc, jc, nc int), parallel bool) {
	km.gemmInto(c, a, M, K, N, pack, parallel, false)
}

// gemmInto is gemm, adding to what c holds when accumulate (each output's chain starts from c).
func (km *microKernel[E]) gemmInto(c []float32, a []E, M, K, N int, pack func(dst []E, pc, kc, jc, nc int), parallel, accumulate bool) {
	if M == 0 || N == 0 {
		return
	}
	_, _ = c[M*N-1], a[M*K-1]
	if K == 0 {
		if !accumulate {
			clear(c[:M*N])
		}
		return
	}
	nc := min(N, km.nc)
	bp := getBuffer[E](min(K, km.kc) * roundUp(nc, km.nr))
	defer putBuffer(bp)
	for jc := 0; jc < N; jc += km.nc {
		ncur := min(km.nc, N-jc)
		for pc := 0; pc < K; pc += km.kc {
			kc := min(km.kc, K-pc)
			km.packPanels(bp, pack, pc, kc, jc, ncur, parallel)
			first := pc == 0 && !accumulate
			blocks := (M + km.mc - 1) / km.mc
			work := func(lo, hi int) {
				edgeA := getBuffer[E](km.mr * kc) // a last panel of fewer than mr rows, padded
				defer putBuffer(edgeA)
				for blk := lo; blk < hi; blk++ {
					ic := blk * km.mc
					km.macro(c, a, edgeA, bp, K, N, ic, min(km.mc, M-ic), pc, jc, ncur, kc, first)
				}
			}
			panels := (ncur + km.nr - 1) / km.nr
			cores := runtime.GOMAXPROCS(0)
			switch {
			case !parallel || M*kc*ncur < 1<<18 || blocks == 1 && panels == 1:
				work(0, blocks)
			case blocks >= 2*cores:
				ParallelRows(blocks, work)
			default:
				// Too few row blocks to keep every core busy (a LoRA gradient's rank-r rows, a
				// short product, many cores): each block's panels of columns split into groups
				// too, every task one block over one group, at least two tasks a core. Each
				// output is the same chain over k either way.
				groups := min(panels, (2*cores+blocks-1)/blocks)
				ParallelRows(blocks*groups, func(lo, hi int) {
					edgeA := getBuffer[E](km.mr * kc)
					defer putBuffer(edgeA)
					for t := lo; t < hi; t++ {
						blk, g := t/groups, t%groups
						p0, p1 := panels*g/groups, panels*(g+1)/groups
						if p0 == p1 {
							continue
						}
						ic := blk * km.mc
						j0, j1 := p0*km.nr, min(ncur, p1*km.nr)
						km.macro(c, a, edgeA, bp[p0*kc*km.nr:], K, N, ic, min(km.mc, M-ic), pc, jc+j0, j1-j0, kc, first)
					}
				})
			}
		}
	}
}

func roundUp(n, m int) int { return (n + m - 1) / m * m }

// packPanels is pack over columns jc…jc+nc, its panels of nr columns split across the cores when
// parallel and the block is large: each panel is written alone, at (j/nr)·kc·nr, so a range of
// panels is the same pack of fewer columns at an offset (the same numbers; packing was a serial
// tenth of a 2-core training step on the small preset).
func (km *microKernel[E]) packPanels(dst []E, pack func(dst []E, pc, kc, jc, nc int), pc, kc, jc, nc int, parallel bool) {
	panels := (nc + km.nr - 1) / km.nr
	if !parallel || panels < 2 || kc*nc < 1<<15 {
		pack(dst, pc, kc, jc, nc)
		return
	}
	ParallelRows(panels, func(lo, hi int) {
		j0, j1 := lo*km.nr, min(nc, hi*km.nr)
		pack(dst[lo*kc*km.nr:], pc, kc, jc+j0, j1-j0)
	})
}

// packB copies b[pc:pc+kc, jc:jc+nc] (or its transpose's) into panels of nr columns, each kc
// rows of nr contiguous values, zero-padded past nc.
func packB(dst, b []float32, K, N, pc, kc, jc, nc, nr int, transB bool) {
	for j0 := 0; j0 < nc; j0 += nr {
		w := min(nr, nc-j0)
		panel := dst[(j0/nr)*kc*nr:][:kc*nr]
		if transB { // b is [N, K]: column j of the panel is a row of b
			if w < nr {
				clear(panel)
			}
			for j := range w {
				src := b[(jc+j0+j)*K+pc:][:kc]
				for p, v := range src {
					panel[p*nr+j] = v
				}
			}
			continue
		}
		for p := range kc {
			row := panel[p*nr : p*nr+nr : p*nr+nr]
			copy(row, b[(pc+p)*N+jc+j0:][:w])
			clear(row[w:])
		}
	}
}

// padRows copies rows r0…r0+h of a (columns pc…pc+kc) into dst as an [mr, kc] block, the rows
// past h zero: a last panel of fewer than mr rows, which the kernel then reads in place like any
// other (lda kc).
func padRows[E float32 | uint32](dst, a []E, K, r0, h, pc, kc, mr int) {
	dst = dst[:mr*kc]
	for i := range h {
		copy(dst[i*kc:][:kc], a[(r0+i)*K+pc:][:kc])
	}
	clear(dst[h*kc:])
}

// macro multiplies rows ic…ic+mc of a (columns pc…pc+kc, read in place) by a packed B block
// into c's tile at (ic, jc). A last panel of fewer than mr rows is copied, zero-padded.
func (km *microKernel[E]) macro(c []float32, a, edgeA, bp []E, K, N, ic, mc, pc, jc, nc, kc int, first bool) {
	mr, nr := km.mr, km.nr
	var edgeBuf [maxMR * maxNR]float32
	edge := edgeBuf[:mr*nr]
	full := mc / mr * mr
	if h := mc - full; h > 0 {
		padRows(edgeA, a, K, ic+full, h, pc, kc, mr)
	}
	for j0 := 0; j0 < nc; j0 += nr {
		bpan := bp[(j0/nr)*kc*nr:][:kc*nr]
		w := min(nr, nc-j0)
		for i0 := 0; i0 < mc; i0 += mr {
			h := min(mr, mc-i0)
			if h == mr && w == nr {
				km.micro(kc, a[(ic+i0)*K+pc:], K, bpan, c[(ic+i0)*N+jc+j0:], N, first)
				continue
			}
			// A partial tile runs whole in edge, which starts from c's valid part (so each output
			// stays one chain over k) and is copied back.
			if !first {
				for i := range h {
					copy(edge[i*nr:][:w], c[(ic+i0+i)*N+jc+j0:][:w])
				}
			}
			if h == mr {
				km.micro(kc, a[(ic+i0)*K+pc:], K, bpan, edge, nr, first)
			} else {
				km.micro(kc, edgeA, kc, bpan, edge, nr, first)
			}
			for i := range h {
				copy(c[(ic+i0+i)*N+jc+j0:][:w], edge[i*nr:][:w])
			}
		}
	}
}

// The largest register tile of any path (the edge buffer's size).
const maxMR, maxNR = 32, 32

// micro runs the micro-kernel over checked slices: the assembly reads and writes exactly these
// ranges, so they are checked here, once.
func (km *microKernel[E]) micro(kc int, a []E, lda int, b []E, c []float32, ldc int, first bool) {
	if kc <= 0 {
		return
	}
	_ = a[(km.mr-1)*lda+kc-1]
	_ = b[kc*km.nr-1]
	_ = c[(km.mr-1)*ldc+km.nr-1]
	km.run(kc, &a[0], lda, &b[0], &c[0], ldc, first)
}

// Packing buffers are reused between calls, one pool per element type.
var f32Buffers, u32Buffers sync.Pool

func getBuffer[E float32 | uint32](n int) []E {
	pool := bufferPool[E]()
	if v, ok := pool.Get().(*[]E); ok && cap(*v) >= n {
		return (*v)[:n]
	}
	return make([]E, n)
}

func putBuffer[E float32 | uint32](s []E) { bufferPool[E]().Put(&s) }

func bufferPool[E float32 | uint32]() *sync.Pool {
	var zero E
	if _, ok := any(zero).(float32); ok {
		return &f32Buffers
	}
	return &u32Buffers
}
