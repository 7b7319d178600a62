//go:build goexperiment.simd && amd64

#include "textflag.h"

// The few-row products over a weight read where it is ([K, N], rows ldw apart), on AVX2: the
// 8-lane kernels of f32NNWide and bf16NNWide (f32_wide_amd64.go). Each sets y[0:R, 0:16] (rows
// ldy apart) = Σ_k x[i*ldx+k]·w[k*ldw+j] for its R rows, each output one chain of FMAs over k in
// order from zero: the bits of the archsimd tiles and of the scalar loops. The bf16 kernels widen
// each weight row exactly (bits zero-extended and shifted into the high half), as the tiles do.
// Y(2i), Y(2i+1) are row i's accumulators, Y12 and Y13 the weight row, Y14 and Y15 the broadcast
// x values, alternating. Rows of x are reached from AX (rows 0–2) and R11 (3–5), each plus 0, 1
// or 2 times ldx. k ≥ 1. Go's register allocator spilled the same loops written with archsimd.

#define FMA_ROW(src, acc0, acc1, bc) \
	VBROADCASTSS src, bc; \
	VFMADD231PS bc, Y12, acc0; \
	VFMADD231PS bc, Y13, acc1

#define STORE_ROW(acc0, acc1) \
	VMOVUPS acc0, (DX); \
	VMOVUPS acc1, 32(DX); \
	ADDQ R8, DX

#define SETUP(wshift) \
	MOVQ k+0(FP), CX; \
	MOVQ x+8(FP), AX; \
	MOVQ ldx+16(FP), R10; \
	SHLQ $2, R10; \
	LEAQ (AX)(R10*2), R11; \
	ADDQ R10, R11; \
	MOVQ w+24(FP), BX; \
	MOVQ ldw+32(FP), R9; \
	SHLQ wshift, R9; \
	MOVQ y+40(FP), DX; \
	MOVQ ldy+48(FP), R8; \
	SHLQ $2, R8

// func nn6x16asm(k int, x *float32, ldx int, w *float32, ldw int, y *float32, ldy int)
TEXT ·nn6x16asm(SB), NOSPLIT, $0-56
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

loop6f32:
	VMOVUPS (BX), Y12
	VMOVUPS 32(BX), Y13
	FMA_ROW((AX), Y0, Y1, Y14)
	FMA_ROW((AX)(R10*1), Y2, Y3, Y15)
	FMA_ROW((AX)(R10*2), Y4, Y5, Y14)
	FMA_ROW((R11), Y6, Y7, Y15)
	FMA_ROW((R11)(R10*1), Y8, Y9, Y14)
	FMA_ROW((R11)(R10*2), Y10, Y11, Y15)
	ADDQ $4, AX
	ADDQ $4, R11
	ADDQ R9, BX
	DECQ CX
	JNZ loop6f32

	STORE_ROW(Y0, Y1)
	STORE_ROW(Y2, Y3)
	STORE_ROW(Y4, Y5)
	STORE_ROW(Y6, Y7)
	STORE_ROW(Y8, Y9)
	STORE_ROW(Y10, Y11)
	VZEROUPPER
	RET

// func nn4x16asm(k int, x *float32, ldx int, w *float32, ldw int, y *float32, ldy int)
TEXT ·nn4x16asm(SB), NOSPLIT, $0-56
	SETUP($2)
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	VXORPS Y4, Y4, Y4
	VXORPS Y5, Y5, Y5
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7

loop4f32:
	VMOVUPS (BX), Y12
	VMOVUPS 32(BX), Y13
	FMA_ROW((AX), Y0, Y1, Y14)
	FMA_ROW((AX)(R10*1), Y2, Y3, Y15)
	FMA_ROW((AX)(R10*2), Y4, Y5, Y14)
	FMA_ROW((R11), Y6, Y7, Y15)
	ADDQ $4, AX
	ADDQ $4, R11
	ADDQ R9, BX
	DECQ CX
	JNZ loop4f32

	STORE_ROW(Y0, Y1)
	STORE_ROW(Y2, Y3)
	STORE_ROW(Y4, Y5)
	STORE_ROW(Y6, Y7)
	VZEROUPPER
	RET

// func nn6x16bf16asm(k int, x *float32, ldx int, w *uint16, ldw int, y *float32, ldy int)
TEXT ·nn6x16bf16asm(SB), NOSPLIT, $0-56
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

loop6bf16:
	VPMOVZXWD (BX), Y12
	VPMOVZXWD 16(BX), Y13
	VPSLLD $16, Y12, Y12
	VPSLLD $16, Y13, Y13
	FMA_ROW((AX), Y0, Y1, Y14)
	FMA_ROW((AX)(R10*1), Y2, Y3, Y15)
	FMA_ROW((AX)(R10*2), Y4, Y5, Y14)
	FMA_ROW((R11), Y6, Y7, Y15)
	FMA_ROW((R11)(R10*1), Y8, Y9, Y14)
	FMA_ROW((R11)(R10*2), Y10, Y11, Y15)
	ADDQ $4, AX
	ADDQ $4, R11
	ADDQ R9, BX
	DECQ CX
	JNZ loop6bf16

	STORE_ROW(Y0, Y1)
	STORE_ROW(Y2, Y3)
	STORE_ROW(Y4, Y5)
	STORE_ROW(Y6, Y7)
	STORE_ROW(Y8, Y9)
	STORE_ROW(Y10, Y11)
	VZEROUPPER
	RET

// func nn4x16bf16asm(k int, x *float32, ldx int, w *uint16, ldw int, y *float32, ldy int)
TEXT ·nn4x16bf16asm(SB), NOSPLIT, $0-56
	SETUP($1)
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	VXORPS Y4, Y4, Y4
	VXORPS Y5, Y5, Y5
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7

loop4bf16:
	VPMOVZXWD (BX), Y12
	VPMOVZXWD 16(BX), Y13
	VPSLLD $16, Y12, Y12
	VPSLLD $16, Y13, Y13
	FMA_ROW((AX), Y0, Y1, Y14)
	FMA_ROW((AX)(R10*1), Y2, Y3, Y15)
	FMA_ROW((AX)(R10*2), Y4, Y5, Y14)
	FMA_ROW((R11), Y6, Y7, Y15)
	ADDQ $4, AX
	ADDQ $4, R11
	ADDQ R9, BX
	DECQ CX
	JNZ loop4bf16

	STORE_ROW(Y0, Y1)
	STORE_ROW(Y2, Y3)
	STORE_ROW(Y4, Y5)
	STORE_ROW(Y6, Y7)
	VZEROUPPER
	RET
