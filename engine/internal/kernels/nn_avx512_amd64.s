//go:build goexperiment.simd && amd64

#include "textflag.h"

// The few-row float32 products over a weight read where it is ([K, N], rows ldw apart): on an
// AVX-512 path F32Product's x·W for a decode step (f32NNWide, f32_wide_amd64.go). Each kernel
// sets y[0:R, 0:32] (rows ldy apart) = Σ_k x[i*ldx+k]·w[k*ldw+j] for its R rows, each output one
// chain of FMAs over k in order from zero: the bits of the 8-lane tiles and of the scalar
// kernel. Z(2i), Z(2i+1) are row i's accumulators, Z24 and Z25 the weight row's 32 columns,
// Z26–Z31 the broadcast x values, rotating so consecutive rows do not wait on one register. Rows
// of x are reached from four bases: AX (rows 0–2), R11 (3–5), R12 (6–8), R13 (9–11), each plus
// 0, 1 or 2 times ldx. k ≥ 1. (Prefetching the weight rows ahead measured no faster: the
// loads already keep enough misses in flight.)

#define FMA_ROW(src, acc0, acc1, bc) \
	VBROADCASTSS src, bc; \
	VFMADD231PS bc, Z24, acc0; \
	VFMADD231PS bc, Z25, acc1

#define STORE_ROW(acc0, acc1) \
	VMOVUPS acc0, (DX); \
	VMOVUPS acc1, 64(DX); \
	ADDQ R8, DX

#define SETUP \
	MOVQ k+0(FP), CX; \
	MOVQ x+8(FP), AX; \
	MOVQ ldx+16(FP), R10; \
	SHLQ $2, R10; \
	LEAQ (AX)(R10*2), R11; \
	ADDQ R10, R11; \
	LEAQ (R11)(R10*2), R12; \
	ADDQ R10, R12; \
	LEAQ (R12)(R10*2), R13; \
	ADDQ R10, R13; \
	MOVQ w+24(FP), BX; \
	MOVQ ldw+32(FP), R9; \
	SHLQ $2, R9; \
	MOVQ y+40(FP), DX; \
	MOVQ ldy+48(FP), R8; \
	SHLQ $2, R8

// func nn12x32asm(k int, x *float32, ldx int, w *float32, ldw int, y *float32, ldy int)
TEXT ·nn12x32asm(SB), NOSPLIT, $0-56
	SETUP
	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1
	VPXORD Z2, Z2, Z2
	VPXORD Z3, Z3, Z3
	VPXORD Z4, Z4, Z4
	VPXORD Z5, Z5, Z5
	VPXORD Z6, Z6, Z6
	VPXORD Z7, Z7, Z7
	VPXORD Z8, Z8, Z8
	VPXORD Z9, Z9, Z9
	VPXORD Z10, Z10, Z10
	VPXORD Z11, Z11, Z11
	VPXORD Z12, Z12, Z12
	VPXORD Z13, Z13, Z13
	VPXORD Z14, Z14, Z14
	VPXORD Z15, Z15, Z15
	VPXORD Z16, Z16, Z16
	VPXORD Z17, Z17, Z17
	VPXORD Z18, Z18, Z18
	VPXORD Z19, Z19, Z19
	VPXORD Z20, Z20, Z20
	VPXORD Z21, Z21, Z21
	VPXORD Z22, Z22, Z22
	VPXORD Z23, Z23, Z23

loop12:
	VMOVUPS (BX), Z24
	VMOVUPS 64(BX), Z25
	FMA_ROW((AX), Z0, Z1, Z26)
	FMA_ROW((AX)(R10*1), Z2, Z3, Z27)
	FMA_ROW((AX)(R10*2), Z4, Z5, Z28)
	FMA_ROW((R11), Z6, Z7, Z29)
	FMA_ROW((R11)(R10*1), Z8, Z9, Z30)
	FMA_ROW((R11)(R10*2), Z10, Z11, Z31)
	FMA_ROW((R12), Z12, Z13, Z26)
	FMA_ROW((R12)(R10*1), Z14, Z15, Z27)
	FMA_ROW((R12)(R10*2), Z16, Z17, Z28)
	FMA_ROW((R13), Z18, Z19, Z29)
	FMA_ROW((R13)(R10*1), Z20, Z21, Z30)
	FMA_ROW((R13)(R10*2), Z22, Z23, Z31)
	ADDQ $4, AX
	ADDQ $4, R11
	ADDQ $4, R12
	ADDQ $4, R13
	ADDQ R9, BX
	DECQ CX
	JNZ loop12

	STORE_ROW(Z0, Z1)
	STORE_ROW(Z2, Z3)
	STORE_ROW(Z4, Z5)
	STORE_ROW(Z6, Z7)
	STORE_ROW(Z8, Z9)
	STORE_ROW(Z10, Z11)
	STORE_ROW(Z12, Z13)
	STORE_ROW(Z14, Z15)
	STORE_ROW(Z16, Z17)
	STORE_ROW(Z18, Z19)
	STORE_ROW(Z20, Z21)
	STORE_ROW(Z22, Z23)
	VZEROUPPER
	RET

// func nn8x32asm(k int, x *float32, ldx int, w *float32, ldw int, y *float32, ldy int)
TEXT ·nn8x32asm(SB), NOSPLIT, $0-56
	SETUP
	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1
	VPXORD Z2, Z2, Z2
	VPXORD Z3, Z3, Z3
	VPXORD Z4, Z4, Z4
	VPXORD Z5, Z5, Z5
	VPXORD Z6, Z6, Z6
	VPXORD Z7, Z7, Z7
	VPXORD Z8, Z8, Z8
	VPXORD Z9, Z9, Z9
	VPXORD Z10, Z10, Z10
	VPXORD Z11, Z11, Z11
	VPXORD Z12, Z12, Z12
	VPXORD Z13, Z13, Z13
	VPXORD Z14, Z14, Z14
	VPXORD Z15, Z15, Z15

loop8:
	VMOVUPS (BX), Z24
	VMOVUPS 64(BX), Z25
	FMA_ROW((AX), Z0, Z1, Z26)
	FMA_ROW((AX)(R10*1), Z2, Z3, Z27)
	FMA_ROW((AX)(R10*2), Z4, Z5, Z28)
	FMA_ROW((R11), Z6, Z7, Z29)
	FMA_ROW((R11)(R10*1), Z8, Z9, Z30)
	FMA_ROW((R11)(R10*2), Z10, Z11, Z31)
	FMA_ROW((R12), Z12, Z13, Z26)
	FMA_ROW((R12)(R10*1), Z14, Z15, Z27)
	ADDQ $4, AX
	ADDQ $4, R11
	ADDQ $4, R12
	ADDQ R9, BX
	DECQ CX
	JNZ loop8

	STORE_ROW(Z0, Z1)
	STORE_ROW(Z2, Z3)
	STORE_ROW(Z4, Z5)
	STORE_ROW(Z6, Z7)
	STORE_ROW(Z8, Z9)
	STORE_ROW(Z10, Z11)
	STORE_ROW(Z12, Z13)
	STORE_ROW(Z14, Z15)
	VZEROUPPER
	RET

// func nn4x32asm(k int, x *float32, ldx int, w *float32, ldw int, y *float32, ldy int)
TEXT ·nn4x32asm(SB), NOSPLIT, $0-56
	SETUP
	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1
	VPXORD Z2, Z2, Z2
	VPXORD Z3, Z3, Z3
	VPXORD Z4, Z4, Z4
	VPXORD Z5, Z5, Z5
	VPXORD Z6, Z6, Z6
	VPXORD Z7, Z7, Z7

loop4:
	VMOVUPS (BX), Z24
	VMOVUPS 64(BX), Z25
	FMA_ROW((AX), Z0, Z1, Z26)
	FMA_ROW((AX)(R10*1), Z2, Z3, Z27)
	FMA_ROW((AX)(R10*2), Z4, Z5, Z28)
	FMA_ROW((R11), Z6, Z7, Z29)
	ADDQ $4, AX
	ADDQ $4, R11
	ADDQ R9, BX
	DECQ CX
	JNZ loop4

	STORE_ROW(Z0, Z1)
	STORE_ROW(Z2, Z3)
	STORE_ROW(Z4, Z5)
	STORE_ROW(Z6, Z7)
	VZEROUPPER
	RET
