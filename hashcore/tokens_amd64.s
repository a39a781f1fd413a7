//go:build !purego

#include "textflag.h"

// Token encoders for the chains' block messages, eight tokens per step with AVX-512
// (F, BW, VBMI2): each token is laid out in its own 8-byte lane in its widest form,
// a byte mask picks the bytes its actual form uses, and VPCOMPRESSB packs the lanes.
// Every step stores 64 bytes, so the destination needs 64 bytes of room past what a
// step writes (the Go side checks).

// TOKENS_PROLOGUE loads the arguments: DI dst, SI tokens, CX steps, R9 dst start.
#define TOKENS_PROLOGUE \
	MOVQ dst+0(FP), DI; \
	MOVQ tokens+8(FP), SI; \
	MOVQ steps+16(FP), CX; \
	MOVQ DI, R9

// PACK_STORE packs the bytes of Z2 selected by the byte mask in Z4 to (DI) and
// advances DI past them.
#define PACK_STORE \
	VPMOVB2M Z4, K4; \
	VPCOMPRESSB.Z Z2, K4, Z5; \
	VMOVDQU8 Z5, (DI); \
	KMOVQ K4, R8; \
	POPCNTQ R8, R8; \
	ADDQ R8, DI

// func cborTokensAVX512(dst *byte, tokens *uint32, steps int) int
//
// CBOR unsigned ints: < 24 in the head byte; else head 0x18, 0x19 or 0x1a and the value
// big-endian in 1, 2 or 4 bytes. Lane layout: head, then the value's 4 bytes
// big-endian; the smaller forms take the head and the value's low bytes.
TEXT ·cborTokensAVX512(SB), NOSPLIT, $0-32
	TOKENS_PROLOGUE
	VPBROADCASTQ ·tokConst+0(SB), Z20  // 24
	VPBROADCASTQ ·tokConst+8(SB), Z21  // 256
	VPBROADCASTQ ·tokConst+16(SB), Z22 // 65536
	VPBROADCASTQ ·tokConst+24(SB), Z24 // 0x18
	VPBROADCASTQ ·tokConst+32(SB), Z25 // 1
	VPBROADCASTQ ·tokConst+40(SB), Z26 // select byte 4
	VPBROADCASTQ ·tokConst+48(SB), Z27 // select bytes 0, 4
	VPBROADCASTQ ·tokConst+56(SB), Z28 // select bytes 0, 3, 4
	VPBROADCASTQ ·tokConst+64(SB), Z29 // select bytes 0..4
	VBROADCASTI32X4 ·cborLaneShuffle(SB), Z23

cborLoop:
	VPMOVZXDQ (SI), Z1
	VPSHUFB Z23, Z1, Z2       // value big-endian in bytes 1..4
	VPCMPUQ $5, Z20, Z1, K1   // >= 24
	VPCMPUQ $5, Z21, Z1, K2   // >= 256
	VPCMPUQ $5, Z22, Z1, K3   // >= 65536
	VMOVDQA64 Z24, Z3
	VPADDQ Z25, Z3, K2, Z3
	VPADDQ Z25, Z3, K3, Z3
	VPORQ Z3, Z2, Z2          // head in byte 0
	VMOVDQA64 Z26, Z4
	VMOVDQA64 Z27, K1, Z4
	VMOVDQA64 Z28, K2, Z4
	VMOVDQA64 Z29, K3, Z4
	PACK_STORE
	ADDQ $32, SI
	DECQ CX
	JNZ cborLoop

	VZEROUPPER
	SUBQ R9, DI
	MOVQ DI, ret+24(FP)
	RET

// func pickleTokensAVX512(dst *byte, tokens *uint32, steps int) int
//
// Pickle ints: BININT1 'K' + 1 byte, BININT2 'M' + 2 bytes, BININT 'J' + 4 bytes
// little-endian, LONG1 0x8a 0x05 + 5 bytes for >= 1<<31. Lane layout: opcode, then the
// value little-endian (LONG1: 0x8a 0x05, then the value and a zero sign byte).
TEXT ·pickleTokensAVX512(SB), NOSPLIT, $0-32
	TOKENS_PROLOGUE
	VPBROADCASTQ ·tokConst+8(SB), Z21   // 256
	VPBROADCASTQ ·tokConst+16(SB), Z22  // 65536
	VPBROADCASTQ ·tokConst+72(SB), Z20  // 1<<31
	VPBROADCASTQ ·tokConst+80(SB), Z24  // 'K'
	VPBROADCASTQ ·tokConst+88(SB), Z25  // 'M'
	VPBROADCASTQ ·tokConst+96(SB), Z26  // 'J'
	VPBROADCASTQ ·tokConst+104(SB), Z27 // 0x8a 0x05
	VPBROADCASTQ ·tokConst+112(SB), Z28 // select bytes 0..1
	VPBROADCASTQ ·tokConst+120(SB), Z29 // select bytes 0..2
	VPBROADCASTQ ·tokConst+64(SB), Z30  // select bytes 0..4
	VPBROADCASTQ ·tokConst+128(SB), Z31 // select bytes 0..6

pickleLoop:
	VPMOVZXDQ (SI), Z1
	VPCMPUQ $5, Z21, Z1, K2   // >= 256
	VPCMPUQ $5, Z22, Z1, K3   // >= 65536
	VPCMPUQ $5, Z20, Z1, K5   // >= 1<<31
	VPSLLQ $8, Z1, Z2
	VMOVDQA64 Z24, Z3
	VMOVDQA64 Z25, K2, Z3
	VMOVDQA64 Z26, K3, Z3
	VPORQ Z3, Z2, Z2          // opcode, value
	VPSLLQ $16, Z1, Z6
	VPORQ Z27, Z6, Z6         // LONG1 form
	VMOVDQA64 Z6, K5, Z2
	VMOVDQA64 Z28, Z4
	VMOVDQA64 Z29, K2, Z4
	VMOVDQA64 Z30, K3, Z4
	VMOVDQA64 Z31, K5, Z4
	PACK_STORE
	ADDQ $32, SI
	DECQ CX
	JNZ pickleLoop

	VZEROUPPER
	SUBQ R9, DI
	MOVQ DI, ret+24(FP)
	RET

DATA ·tokConst+0(SB)/8, $24
DATA ·tokConst+8(SB)/8, $256
DATA ·tokConst+16(SB)/8, $65536
DATA ·tokConst+24(SB)/8, $0x18
DATA ·tokConst+32(SB)/8, $1
DATA ·tokConst+40(SB)/8, $0x0000008000000000
DATA ·tokConst+48(SB)/8, $0x0000008000000080
DATA ·tokConst+56(SB)/8, $0x0000008080000080
DATA ·tokConst+64(SB)/8, $0x0000008080808080
DATA ·tokConst+72(SB)/8, $0x80000000
DATA ·tokConst+80(SB)/8, $0x4b
DATA ·tokConst+88(SB)/8, $0x4d
DATA ·tokConst+96(SB)/8, $0x4a
DATA ·tokConst+104(SB)/8, $0x058a
DATA ·tokConst+112(SB)/8, $0x0000000000008080
DATA ·tokConst+120(SB)/8, $0x0000000000808080
DATA ·tokConst+128(SB)/8, $0x0080808080808080
GLOBL ·tokConst(SB), RODATA|NOPTR, $136

// VPSHUFB indices per 16 bytes (two lanes): bytes 1..4 of a lane get the lane's
// bytes 3, 2, 1, 0; the rest are zeroed (index with the top bit set).
DATA ·cborLaneShuffle+0(SB)/8, $0x8080800001020380
DATA ·cborLaneShuffle+8(SB)/8, $0x80808008090a0b80
GLOBL ·cborLaneShuffle(SB), RODATA|NOPTR, $16
