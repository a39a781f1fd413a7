//go:build !purego

#include "textflag.h"

// STEP32 jumps to found with BX the mask of stop bytes among the 32 at SI+AX, if any.
#define STEP32 \
	VMOVDQU   (SI)(AX*1), Y0 \
	VPCMPEQB  Y0, Y1, Y4     \
	VPCMPEQB  Y0, Y2, Y5     \
	VPCMPGTB  Y0, Y3, Y6     \
	VPOR      Y4, Y5, Y4     \
	VPOR      Y4, Y6, Y4     \
	VPMOVMSKB Y4, BX         \
	TESTL     BX, BX         \
	JNZ       found

// func plainEndAVX2(s []byte) int
//
// The index of the first byte of s that a JSON string cannot hold as plain ASCII: the
// quote, the backslash, a control byte (< 0x20) or a byte from 0x80; len(s) if none. One
// signed compare finds both of the last two (0x20 > b as int8: b < 0x20, or b >= 0x80).
// 32 bytes a step; the last partial step reads the final 32 bytes again (overlapping)
// when s holds at least 32, else goes a byte at a time.
TEXT ·plainEndAVX2(SB), NOSPLIT, $0-32
	MOVQ s_base+0(FP), SI
	MOVQ s_len+8(FP), CX
	XORQ AX, AX
	CMPQ CX, $32
	JB   bytes
	VMOVDQU ·plainQuote(SB), Y1
	VMOVDQU ·plainBackslash(SB), Y2
	VMOVDQU ·plainSpace(SB), Y3
	MOVQ CX, DX
	SUBQ $32, DX // the last full step's start

loop:
	STEP32
	ADDQ     $32, AX
	CMPQ     AX, DX
	JBE      loop
	CMPQ     AX, CX
	JEQ      none
	MOVQ     DX, AX // the rest, as the last 32 bytes
	STEP32

none:
	VZEROUPPER
	MOVQ CX, ret+24(FP)
	RET

found:
	VZEROUPPER
	BSFL BX, BX
	ADDQ BX, AX
	MOVQ AX, ret+24(FP)
	RET

bytes:
	CMPQ AX, CX
	JEQ  done
	MOVBLZX (SI)(AX*1), BX
	CMPB BX, $0x22
	JEQ  done
	CMPB BX, $0x5c
	JEQ  done
	CMPB BX, $0x20
	JB   done
	CMPB BX, $0x80
	JAE  done
	INCQ AX
	JMP  bytes

done:
	MOVQ AX, ret+24(FP)
	RET

DATA ·plainQuote+0(SB)/8, $0x2222222222222222
DATA ·plainQuote+8(SB)/8, $0x2222222222222222
DATA ·plainQuote+16(SB)/8, $0x2222222222222222
DATA ·plainQuote+24(SB)/8, $0x2222222222222222
GLOBL ·plainQuote(SB), RODATA|NOPTR, $32

DATA ·plainBackslash+0(SB)/8, $0x5c5c5c5c5c5c5c5c
DATA ·plainBackslash+8(SB)/8, $0x5c5c5c5c5c5c5c5c
DATA ·plainBackslash+16(SB)/8, $0x5c5c5c5c5c5c5c5c
DATA ·plainBackslash+24(SB)/8, $0x5c5c5c5c5c5c5c5c
GLOBL ·plainBackslash(SB), RODATA|NOPTR, $32

DATA ·plainSpace+0(SB)/8, $0x2020202020202020
DATA ·plainSpace+8(SB)/8, $0x2020202020202020
DATA ·plainSpace+16(SB)/8, $0x2020202020202020
DATA ·plainSpace+24(SB)/8, $0x2020202020202020
GLOBL ·plainSpace(SB), RODATA|NOPTR, $32
