//go:build goexperiment.simd && amd64

#include "textflag.h"

// The few-row products x·Wᵀ over a weight read where it is ([N, K], rows ldw apart: a tied
// head, an input gradient), on every path with AVX2: the kernels of f32NTWide and bf16NTWide
// (nn_wide_amd64.go). Each sets y[i*ldy + j] = Σ_k x[i*ldx+k]·w[j*ldw+k] for its R rows of x
// and 4 rows of w, over the first 8·k8 values of k, exactly as the archsimd tiles nt2x4 and
// nt1x8 do: each output's 8 lanes are one chain of FMAs over its 8-value chunks of k from zero,
// then summed as ((l0+l1)+(l2+l3)) + ((l4+l5)+(l6+l7)) (two VHADDPS, the upper half added to the
// lower). The caller adds what is left of k. Y(4i+j) is row i's accumulator for weight row j,
// Y12–Y15 the weight rows' 8 values; x is read by the FMAs from memory. Rows of x are AX plus
// 0, 1 or 2 times ldx; rows of w BX plus 0, 1 or 2 times ldw, and R12. k8 ≥ 1.

#define SETUP(wshift) \
	MOVQ k8+0(FP), CX; \
	MOVQ x+8(FP), AX; \
	MOVQ ldx+16(FP), R10; \
	SHLQ $2, R10; \
	MOVQ w+24(FP), BX; \
	MOVQ ldw+32(FP), R9; \
	SHLQ wshift, R9; \
	LEAQ (BX)(R9*2), R12; \
	ADDQ R9, R12; \
	MOVQ y+40(FP), DX; \
	MOVQ ldy+48(FP), R8; \
	SHLQ $2, R8

// HSUM4 stores the sums of a row's four accumulators at DX (bfHsum4) and moves DX a row on.
#define HSUM4(a0, a1, a2, a3) \
	VHADDPS a1, a0, Y12; \
	VHADDPS a3, a2, Y13; \
	VHADDPS Y13, Y12, Y12; \
	VEXTRACTF128 $1, Y12, X13; \
	VADDPS X13, X12, X12; \
	VMOVUPS X12, (DX); \
	ADDQ R8, DX

// func nt3x4asm(k8 int, x *float32, ldx int, w *float32, ldw int, y *float32, ldy int)
TEXT ·nt3x4asm(SB), NOSPLIT, $0-56
	SETUP($2)
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	VXORPS Y4, Y4, Y4
	VXORPS Y5, Y5, Y5
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7
	VXORPS Y8, Y8, Y8
	VXORPS Y9, Y9, Y9
	VXORPS Y10, Y10, Y10
	VXORPS Y11, Y11, Y11

loop3f32:
	VMOVUPS (BX), Y12
	VMOVUPS (BX)(R9*1), Y13
	VMOVUPS (BX)(R9*2), Y14
	VMOVUPS (R12), Y15
	VFMADD231PS (AX), Y12, Y0
	VFMADD231PS (AX), Y13, Y1
	VFMADD231PS (AX), Y14, Y2
	VFMADD231PS (AX), Y15, Y3
	VFMADD231PS (AX)(R10*1), Y12, Y4
	VFMADD231PS (AX)(R10*1), Y13, Y5
	VFMADD231PS (AX)(R10*1), Y14, Y6
	VFMADD231PS (AX)(R10*1), Y15, Y7
	VFMADD231PS (AX)(R10*2), Y12, Y8
	VFMADD231PS (AX)(R10*2), Y13, Y9
	VFMADD231PS (AX)(R10*2), Y14, Y10
	VFMADD231PS (AX)(R10*2), Y15, Y11
	ADDQ $32, AX
	ADDQ $32, BX
	ADDQ $32, R12
	DECQ CX
	JNZ loop3f32

	HSUM4(Y0, Y1, Y2, Y3)
	HSUM4(Y4, Y5, Y6, Y7)
	HSUM4(Y8, Y9, Y10, Y11)
	VZEROUPPER
	RET

// func nt2x4asm(k8 int, x *float32, ldx int, w *float32, ldw int, y *float32, ldy int)
TEXT ·nt2x4asm(SB), NOSPLIT, $0-56
	SETUP($2)
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	VXORPS Y4, Y4, Y4
	VXORPS Y5, Y5, Y5
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7

loop2f32:
	VMOVUPS (BX), Y12
	VMOVUPS (BX)(R9*1), Y13
	VMOVUPS (BX)(R9*2), Y14
	VMOVUPS (R12), Y15
	VFMADD231PS (AX), Y12, Y0
	VFMADD231PS (AX), Y13, Y1
	VFMADD231PS (AX), Y14, Y2
	VFMADD231PS (AX), Y15, Y3
	VFMADD231PS (AX)(R10*1), Y12, Y4
	VFMADD231PS (AX)(R10*1), Y13, Y5
	VFMADD231PS (AX)(R10*1), Y14, Y6
	VFMADD231PS (AX)(R10*1), Y15, Y7
	ADDQ $32, AX
	ADDQ $32, BX
	ADDQ $32, R12
	DECQ CX
	JNZ loop2f32

	HSUM4(Y0, Y1, Y2, Y3)
	HSUM4(Y4, Y5, Y6, Y7)
	VZEROUPPER
	RET

// func nt3x4bf16asm(k8 int, x *float32, ldx int, w *uint16, ldw int, y *float32, ldy int)
TEXT ·nt3x4bf16asm(SB), NOSPLIT, $0-56
	SETUP($1)
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	VXORPS Y4, Y4, Y4
	VXORPS Y5, Y5, Y5
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7
	VXORPS Y8, Y8, Y8
	VXORPS Y9, Y9, Y9
	VXORPS Y10, Y10, Y10
	VXORPS Y11, Y11, Y11

loop3bf16:
	VPMOVZXWD (BX), Y12
	VPSLLD $16, Y12, Y12
	VPMOVZXWD (BX)(R9*1), Y13
	VPSLLD $16, Y13, Y13
	VPMOVZXWD (BX)(R9*2), Y14
	VPSLLD $16, Y14, Y14
	VPMOVZXWD (R12), Y15
	VPSLLD $16, Y15, Y15
	VFMADD231PS (AX), Y12, Y0
	VFMADD231PS (AX), Y13, Y1
	VFMADD231PS (AX), Y14, Y2
	VFMADD231PS (AX), Y15, Y3
	VFMADD231PS (AX)(R10*1), Y12, Y4
	VFMADD231PS (AX)(R10*1), Y13, Y5
	VFMADD231PS (AX)(R10*1), Y14, Y6
	VFMADD231PS (AX)(R10*1), Y15, Y7
	VFMADD231PS (AX)(R10*2), Y12, Y8
	VFMADD231PS (AX)(R10*2), Y13, Y9
	VFMADD231PS (AX)(R10*2), Y14, Y10
	VFMADD231PS (AX)(R10*2), Y15, Y11
	ADDQ $32, AX
	ADDQ $16, BX
	ADDQ $16, R12
	DECQ CX
	JNZ loop3bf16

	HSUM4(Y0, Y1, Y2, Y3)
	HSUM4(Y4, Y5, Y6, Y7)
	HSUM4(Y8, Y9, Y10, Y11)
	VZEROUPPER
	RET

// func nt2x4bf16asm(k8 int, x *float32, ldx int, w *uint16, ldw int, y *float32, ldy int)
TEXT ·nt2x4bf16asm(SB), NOSPLIT, $0-56
	SETUP($1)
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	VXORPS Y4, Y4, Y4
	VXORPS Y5, Y5, Y5
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7

loop2bf16:
	VPMOVZXWD (BX), Y12
	VPSLLD $16, Y12, Y12
	VPMOVZXWD (BX)(R9*1), Y13
	VPSLLD $16, Y13, Y13
	VPMOVZXWD (BX)(R9*2), Y14
	VPSLLD $16, Y14, Y14
	VPMOVZXWD (R12), Y15
	VPSLLD $16, Y15, Y15
	VFMADD231PS (AX), Y12, Y0
	VFMADD231PS (AX), Y13, Y1
	VFMADD231PS (AX), Y14, Y2
	VFMADD231PS (AX), Y15, Y3
	VFMADD231PS (AX)(R10*1), Y12, Y4
	VFMADD231PS (AX)(R10*1), Y13, Y5
	VFMADD231PS (AX)(R10*1), Y14, Y6
	VFMADD231PS (AX)(R10*1), Y15, Y7
	ADDQ $32, AX
	ADDQ $16, BX
	ADDQ $16, R12
	DECQ CX
	JNZ loop2bf16

	HSUM4(Y0, Y1, Y2, Y3)
	HSUM4(Y4, Y5, Y6, Y7)
	VZEROUPPER
	RET
