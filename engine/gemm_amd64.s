//go:build goexperiment.simd && amd64

#include "textflag.h"

// func micro6x16asm(kc int, a, b, c *float32, ldc int, first bool)
//
// c[0:6, 0:16] (rows ldc apart) = (first) or += Σ_p a[p*6+i]·b[p*16+j]: the GEMM's micro-kernel
// (gemm_avx2_amd64.go). Y0–Y11 are the 12 accumulators (row i in Y(2i), Y(2i+1)), Y12 and Y13
// the B row, Y14 and Y15 the broadcast A values, alternating so consecutive rows do not wait
// on one register. kc ≥ 1. Go's register allocator spilled the same loop written with archsimd.
TEXT ·micro6x16asm(SB), NOSPLIT, $0-41
	MOVQ kc+0(FP), CX
	MOVQ a+8(FP), AX
	MOVQ b+16(FP), BX
	MOVQ c+24(FP), DX
	MOVQ ldc+32(FP), R8
	SHLQ $2, R8
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

loop:
	VMOVUPS (BX), Y12
	VMOVUPS 32(BX), Y13
	VBROADCASTSS (AX), Y14
	VBROADCASTSS 4(AX), Y15
	VFMADD231PS Y14, Y12, Y0
	VFMADD231PS Y14, Y13, Y1
	VFMADD231PS Y15, Y12, Y2
	VFMADD231PS Y15, Y13, Y3
	VBROADCASTSS 8(AX), Y14
	VBROADCASTSS 12(AX), Y15
	VFMADD231PS Y14, Y12, Y4
	VFMADD231PS Y14, Y13, Y5
	VFMADD231PS Y15, Y12, Y6
	VFMADD231PS Y15, Y13, Y7
	VBROADCASTSS 16(AX), Y14
	VBROADCASTSS 20(AX), Y15
	VFMADD231PS Y14, Y12, Y8
	VFMADD231PS Y14, Y13, Y9
	VFMADD231PS Y15, Y12, Y10
	VFMADD231PS Y15, Y13, Y11
	ADDQ $24, AX
	ADDQ $64, BX
	DECQ CX
	JNZ loop

	MOVBLZX first+40(FP), R9
	TESTQ R9, R9
	JNZ store

	// Accumulate: add what c holds.
	VADDPS (DX), Y0, Y0
	VADDPS 32(DX), Y1, Y1
	ADDQ R8, DX
	VADDPS (DX), Y2, Y2
	VADDPS 32(DX), Y3, Y3
	ADDQ R8, DX
	VADDPS (DX), Y4, Y4
	VADDPS 32(DX), Y5, Y5
	ADDQ R8, DX
	VADDPS (DX), Y6, Y6
	VADDPS 32(DX), Y7, Y7
	ADDQ R8, DX
	VADDPS (DX), Y8, Y8
	VADDPS 32(DX), Y9, Y9
	ADDQ R8, DX
	VADDPS (DX), Y10, Y10
	VADDPS 32(DX), Y11, Y11
	MOVQ c+24(FP), DX

store:
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
