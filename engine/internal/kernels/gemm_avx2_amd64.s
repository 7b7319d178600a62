//go:build goexperiment.simd && amd64

#include "textflag.h"

// func micro6x16asmA(kc int, a *float32, lda int, b, c *float32, ldc int, first bool)
//
// c[0:6, 0:16] (rows ldc apart) = Σ_p a[i*lda+p]·b[p*16+j], the chains of FMAs starting from zero
// (first) or from what c holds: the GEMM's micro-kernel (gemm_avx2_amd64.go). Y0–Y11 are the 12
// accumulators (row i in Y(2i), Y(2i+1)), Y12 and Y13 the B row, Y14 and Y15 the broadcast A
// values, alternating so consecutive rows do not wait on one register. kc ≥ 1. Go's register
// allocator spilled the same loop written with archsimd.
TEXT ·micro6x16asmA(SB), NOSPLIT, $0-49
	MOVQ kc+0(FP), CX
	MOVQ a+8(FP), AX
	MOVQ lda+16(FP), R10
	SHLQ $2, R10
	LEAQ (AX)(R10*2), R11
	ADDQ R10, R11          // R11: row 3 of a
	MOVQ b+24(FP), BX
	MOVQ c+32(FP), DX
	MOVQ ldc+40(FP), R8
	SHLQ $2, R8
	MOVBLZX first+48(FP), R9
	TESTQ R9, R9
	JNZ zeroA
	// Go on from what c holds: each output stays one chain of FMAs over k, across blocks.
	MOVQ DX, R12
	VMOVUPS (R12), Y0
	VMOVUPS 32(R12), Y1
	ADDQ R8, R12
	VMOVUPS (R12), Y2
	VMOVUPS 32(R12), Y3
	ADDQ R8, R12
	VMOVUPS (R12), Y4
	VMOVUPS 32(R12), Y5
	ADDQ R8, R12
	VMOVUPS (R12), Y6
	VMOVUPS 32(R12), Y7
	ADDQ R8, R12
	VMOVUPS (R12), Y8
	VMOVUPS 32(R12), Y9
	ADDQ R8, R12
	VMOVUPS (R12), Y10
	VMOVUPS 32(R12), Y11
	JMP loopA

zeroA:
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

loopA:
	VMOVUPS (BX), Y12
	VMOVUPS 32(BX), Y13
	VBROADCASTSS (AX), Y14
	VBROADCASTSS (AX)(R10*1), Y15
	VFMADD231PS Y14, Y12, Y0
	VFMADD231PS Y14, Y13, Y1
	VFMADD231PS Y15, Y12, Y2
	VFMADD231PS Y15, Y13, Y3
	VBROADCASTSS (AX)(R10*2), Y14
	VBROADCASTSS (R11), Y15
	VFMADD231PS Y14, Y12, Y4
	VFMADD231PS Y14, Y13, Y5
	VFMADD231PS Y15, Y12, Y6
	VFMADD231PS Y15, Y13, Y7
	VBROADCASTSS (R11)(R10*1), Y14
	VBROADCASTSS (R11)(R10*2), Y15
	VFMADD231PS Y14, Y12, Y8
	VFMADD231PS Y14, Y13, Y9
	VFMADD231PS Y15, Y12, Y10
	VFMADD231PS Y15, Y13, Y11
	ADDQ $4, AX
	ADDQ $4, R11
	ADDQ $64, BX
	DECQ CX
	JNZ loopA

storeA:
	VMOVUPS Y0, (DX)
	VMOVUPS Y1, 32(DX)
	ADDQ R8, DX
	VMOVUPS Y2, (DX)
	VMOVUPS Y3, 32(DX)
	ADDQ R8, DX
	VMOVUPS Y4, (DX)
	VMOVUPS Y5, 32(DX)
	ADDQ R8, DX
	VMOVUPS Y6, (DX)
	VMOVUPS Y7, 32(DX)
	ADDQ R8, DX
	VMOVUPS Y8, (DX)
	VMOVUPS Y9, 32(DX)
	ADDQ R8, DX
	VMOVUPS Y10, (DX)
	VMOVUPS Y11, 32(DX)
	VZEROUPPER
	RET
