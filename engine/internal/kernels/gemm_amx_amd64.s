//go:build goexperiment.simd && amd64

#include "textflag.h"

// amxTileConfig is LDTILECFG's 64 bytes: palette 1 (byte 0); tiles 0–7 each 64 bytes a row
// (colsb, uint16s at 16–31) and 16 rows (bytes 48–55): c 16 float32, A 16 pairs, B 16 columns.
DATA amxTileConfig<>+0(SB)/8, $1
DATA amxTileConfig<>+8(SB)/8, $0
DATA amxTileConfig<>+16(SB)/8, $0x0040004000400040
DATA amxTileConfig<>+24(SB)/8, $0x0040004000400040
DATA amxTileConfig<>+32(SB)/8, $0
DATA amxTileConfig<>+40(SB)/8, $0
DATA amxTileConfig<>+48(SB)/8, $0x1010101010101010
DATA amxTileConfig<>+56(SB)/8, $0
GLOBL amxTileConfig<>(SB), RODATA|NOPTR, $64

// func micro32x32amxasm(kp int, a *uint32, lda int, b *uint32, c *float32, ldc int, first bool)
//
// c[0:32, 0:32] (rows ldc apart) = Σ_p dot(a[i*lda+p], b[p*32+j]) over kp pairs of k (a multiple of
// 16), from zero (first) or from what c holds: the AMX path's micro-kernel (gemm_amx.go). Four
// 16×16 float32 tiles of c (tmm0–3), two 16-row tiles of A's pairs (tmm4, tmm5: rows 0–15 and
// 16–31, 16 pairs each) and two 16-pair tiles of B's panel (tmm6, tmm7: columns 0–15 and 16–31,
// rows 128 bytes apart), four TDPBF16PS per 16 pairs. The tiles are configured (amxTileConfig, below),
// used and released inside this one function: tile state belongs to the thread, and Go does not
// move a goroutine in the middle of an assembly function. Go's assembler knows no AMX: each
// instruction is its VEX bytes, taken from GNU as, with the mnemonic beside it. Not run on any
// machine of this project yet (none had AMX): SKEIN_GEMM=amx only, never chosen by itself.
TEXT ·micro32x32amxasm(SB), NOSPLIT, $0-49
	MOVQ kp+0(FP), CX
	SHRQ $4, CX           // steps of 16 pairs
	MOVQ a+8(FP), AX
	MOVQ lda+16(FP), R10
	SHLQ $2, R10          // A's row stride in bytes
	MOVQ R10, SI
	SHLQ $4, SI
	ADDQ AX, SI           // SI: A's row 16
	MOVQ b+24(FP), BX
	MOVQ $128, R9         // B's panel row stride: 32 pairs
	MOVQ c+32(FP), DX
	MOVQ ldc+40(FP), R8
	SHLQ $2, R8           // c's row stride in bytes
	MOVQ R8, R12
	SHLQ $4, R12
	ADDQ DX, R12          // R12: c's row 16
	LEAQ amxTileConfig<>(SB), R11
	BYTE $0xc4; BYTE $0xc2; BYTE $0x78; BYTE $0x49; BYTE $0x03 // LDTILECFG (R11)
	MOVBLZX first+48(FP), R13
	TESTQ R13, R13
	JNZ amxzero
	BYTE $0xc4; BYTE $0xa2; BYTE $0x7b; BYTE $0x4b; BYTE $0x04; BYTE $0x02 // TILELOADD (RDX,R8,1), TMM0
	BYTE $0xc4; BYTE $0xa2; BYTE $0x7b; BYTE $0x4b; BYTE $0x4c; BYTE $0x02; BYTE $0x40 // TILELOADD 64(RDX,R8,1), TMM1
	BYTE $0xc4; BYTE $0x82; BYTE $0x7b; BYTE $0x4b; BYTE $0x14; BYTE $0x04 // TILELOADD (R12,R8,1), TMM2
	BYTE $0xc4; BYTE $0x82; BYTE $0x7b; BYTE $0x4b; BYTE $0x5c; BYTE $0x04; BYTE $0x40 // TILELOADD 64(R12,R8,1), TMM3
	JMP amxloop
amxzero:
	BYTE $0xc4; BYTE $0xe2; BYTE $0x7b; BYTE $0x49; BYTE $0xc0 // TILEZERO TMM0
	BYTE $0xc4; BYTE $0xe2; BYTE $0x7b; BYTE $0x49; BYTE $0xc8 // TILEZERO TMM1
	BYTE $0xc4; BYTE $0xe2; BYTE $0x7b; BYTE $0x49; BYTE $0xd0 // TILEZERO TMM2
	BYTE $0xc4; BYTE $0xe2; BYTE $0x7b; BYTE $0x49; BYTE $0xd8 // TILEZERO TMM3
amxloop:
	BYTE $0xc4; BYTE $0xa2; BYTE $0x7b; BYTE $0x4b; BYTE $0x24; BYTE $0x10 // TILELOADD (RAX,R10,1), TMM4
	BYTE $0xc4; BYTE $0xa2; BYTE $0x7b; BYTE $0x4b; BYTE $0x2c; BYTE $0x16 // TILELOADD (RSI,R10,1), TMM5
	BYTE $0xc4; BYTE $0xa2; BYTE $0x7b; BYTE $0x4b; BYTE $0x34; BYTE $0x0b // TILELOADD (RBX,R9,1), TMM6
	BYTE $0xc4; BYTE $0xa2; BYTE $0x7b; BYTE $0x4b; BYTE $0x7c; BYTE $0x0b; BYTE $0x40 // TILELOADD 64(RBX,R9,1), TMM7
	BYTE $0xc4; BYTE $0xe2; BYTE $0x4a; BYTE $0x5c; BYTE $0xc4 // TDPBF16PS TMM6, TMM4, TMM0
	BYTE $0xc4; BYTE $0xe2; BYTE $0x42; BYTE $0x5c; BYTE $0xcc // TDPBF16PS TMM7, TMM4, TMM1
	BYTE $0xc4; BYTE $0xe2; BYTE $0x4a; BYTE $0x5c; BYTE $0xd5 // TDPBF16PS TMM6, TMM5, TMM2
	BYTE $0xc4; BYTE $0xe2; BYTE $0x42; BYTE $0x5c; BYTE $0xdd // TDPBF16PS TMM7, TMM5, TMM3
	ADDQ $64, AX
	ADDQ $64, SI
	ADDQ $2048, BX        // 16 pairs of the panel
	DECQ CX
	JNZ amxloop
	BYTE $0xc4; BYTE $0xa2; BYTE $0x7a; BYTE $0x4b; BYTE $0x04; BYTE $0x02 // TILESTORED TMM0, (RDX,R8,1)
	BYTE $0xc4; BYTE $0xa2; BYTE $0x7a; BYTE $0x4b; BYTE $0x4c; BYTE $0x02; BYTE $0x40 // TILESTORED TMM1, 64(RDX,R8,1)
	BYTE $0xc4; BYTE $0x82; BYTE $0x7a; BYTE $0x4b; BYTE $0x14; BYTE $0x04 // TILESTORED TMM2, (R12,R8,1)
	BYTE $0xc4; BYTE $0x82; BYTE $0x7a; BYTE $0x4b; BYTE $0x5c; BYTE $0x04; BYTE $0x40 // TILESTORED TMM3, 64(R12,R8,1)
	BYTE $0xc4; BYTE $0xe2; BYTE $0x78; BYTE $0x49; BYTE $0xc0 // TILERELEASE
	RET
