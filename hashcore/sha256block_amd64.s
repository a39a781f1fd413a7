//go:build !purego

#include "textflag.h"

// SHA-256 compression with the Intel SHA extensions, written from the Intel SDM's
// description of SHA256RNDS2/SHA256MSG1/SHA256MSG2 and FIPS 180-4.
//
// Go assembly lists operands source first, so Intel's "sha256rnds2 xmm1, xmm2, <xmm0>"
// is SHA256RNDS2 X0, X2, X1 here: X1 holds C,D,G,H on entry and A,B,E,F two rounds
// later, X2 holds A,B,E,F, X0 the two W+K words.
//
// Registers:
//	DI  h          SI  message    DX  end of message    AX  &sha256K
//	X1  ABEF       X2  CDGH       X0  W+K (implicit operand of SHA256RNDS2)
//	X3..X6  the message schedule, four words each, rotating
//	X7  scratch    X8  byte-swap mask    X9, X10  state at block start

// ROUNDS4 runs four rounds with message words w and round constants at k(AX).
#define ROUNDS4(w, k) \
	MOVOU k(AX), X0; \
	PADDL w, X0; \
	SHA256RNDS2 X0, X1, X2; \
	PSHUFD $0x0E, X0, X0; \
	SHA256RNDS2 X0, X2, X1

// LOADW reads four big-endian message words at off(SI) into w.
#define LOADW(off, w) \
	MOVOU off(SI), w; \
	PSHUFB X8, w

// NEXTW finishes the next four schedule words in wn, which holds
// MSG1(W[j-4], W[j-3]) on entry: wn = MSG2(wn + (W[j-2]:W[j-1] shifted one word), W[j-1]),
// where w = W[j-1] and wp = W[j-2] (groups of four words).
#define NEXTW(wn, w, wp) \
	MOVO w, X7; \
	PALIGNR $4, wp, X7; \
	PADDL X7, wn; \
	SHA256MSG2 w, wn

// func sha256Blocks(h *[8]uint32, p []byte)
TEXT ·sha256Blocks(SB), NOSPLIT, $0-32
	MOVQ h+0(FP), DI
	MOVQ p_base+8(FP), SI
	MOVQ p_len+16(FP), DX
	ANDQ $~63, DX // whole blocks only
	TESTQ DX, DX
	JZ done
	ADDQ SI, DX
	LEAQ ·sha256K(SB), AX
	MOVOU ·sha256ByteSwap(SB), X8

	// h[0..3] = a b c d, h[4..7] = e f g h (lowest lane first) -> ABEF, CDGH.
	MOVOU 0(DI), X1
	MOVOU 16(DI), X2
	PSHUFD $0xB1, X1, X1   // b a d c
	PSHUFD $0x1B, X2, X2   // h g f e
	MOVO X1, X7
	PALIGNR $8, X2, X1     // f e b a = ABEF
	PBLENDW $0xF0, X7, X2  // h g d c = CDGH

loop:
	MOVO X1, X9
	MOVO X2, X10

	LOADW(0, X3)
	ROUNDS4(X3, 0)
	LOADW(16, X4)
	ROUNDS4(X4, 16)
	SHA256MSG1 X4, X3
	LOADW(32, X5)
	ROUNDS4(X5, 32)
	SHA256MSG1 X5, X4
	LOADW(48, X6)
	ROUNDS4(X6, 48)
	NEXTW(X3, X6, X5)
	SHA256MSG1 X6, X5

	ROUNDS4(X3, 64)
	NEXTW(X4, X3, X6)
	SHA256MSG1 X3, X6
	ROUNDS4(X4, 80)
	NEXTW(X5, X4, X3)
	SHA256MSG1 X4, X3
	ROUNDS4(X5, 96)
	NEXTW(X6, X5, X4)
	SHA256MSG1 X5, X4
	ROUNDS4(X6, 112)
	NEXTW(X3, X6, X5)
	SHA256MSG1 X6, X5

	ROUNDS4(X3, 128)
	NEXTW(X4, X3, X6)
	SHA256MSG1 X3, X6
	ROUNDS4(X4, 144)
	NEXTW(X5, X4, X3)
	SHA256MSG1 X4, X3
	ROUNDS4(X5, 160)
	NEXTW(X6, X5, X4)
	SHA256MSG1 X5, X4
	ROUNDS4(X6, 176)
	NEXTW(X3, X6, X5)
	SHA256MSG1 X6, X5

	ROUNDS4(X3, 192)
	NEXTW(X4, X3, X6)
	SHA256MSG1 X3, X6
	ROUNDS4(X4, 208)
	NEXTW(X5, X4, X3)
	ROUNDS4(X5, 224)
	NEXTW(X6, X5, X4)
	ROUNDS4(X6, 240)

	PADDL X9, X1
	PADDL X10, X2
	ADDQ $64, SI
	CMPQ SI, DX
	JNE loop

	// ABEF, CDGH -> a b c d, e f g h.
	PSHUFD $0x1B, X1, X1   // a b e f
	PSHUFD $0xB1, X2, X2   // g h c d
	MOVO X1, X7
	PBLENDW $0xF0, X2, X1  // a b c d
	PALIGNR $8, X7, X2     // e f g h
	MOVOU X1, 0(DI)
	MOVOU X2, 16(DI)

done:
	RET

// Round constants K[0..63] (FIPS 180-4 section 4.2.2), two per 8-byte word, low first.
DATA ·sha256K+0(SB)/8, $0x71374491428a2f98
DATA ·sha256K+8(SB)/8, $0xe9b5dba5b5c0fbcf
DATA ·sha256K+16(SB)/8, $0x59f111f13956c25b
DATA ·sha256K+24(SB)/8, $0xab1c5ed5923f82a4
DATA ·sha256K+32(SB)/8, $0x12835b01d807aa98
DATA ·sha256K+40(SB)/8, $0x550c7dc3243185be
DATA ·sha256K+48(SB)/8, $0x80deb1fe72be5d74
DATA ·sha256K+56(SB)/8, $0xc19bf1749bdc06a7
DATA ·sha256K+64(SB)/8, $0xefbe4786e49b69c1
DATA ·sha256K+72(SB)/8, $0x240ca1cc0fc19dc6
DATA ·sha256K+80(SB)/8, $0x4a7484aa2de92c6f
DATA ·sha256K+88(SB)/8, $0x76f988da5cb0a9dc
DATA ·sha256K+96(SB)/8, $0xa831c66d983e5152
DATA ·sha256K+104(SB)/8, $0xbf597fc7b00327c8
DATA ·sha256K+112(SB)/8, $0xd5a79147c6e00bf3
DATA ·sha256K+120(SB)/8, $0x1429296706ca6351
DATA ·sha256K+128(SB)/8, $0x2e1b213827b70a85
DATA ·sha256K+136(SB)/8, $0x53380d134d2c6dfc
DATA ·sha256K+144(SB)/8, $0x766a0abb650a7354
DATA ·sha256K+152(SB)/8, $0x92722c8581c2c92e
DATA ·sha256K+160(SB)/8, $0xa81a664ba2bfe8a1
DATA ·sha256K+168(SB)/8, $0xc76c51a3c24b8b70
DATA ·sha256K+176(SB)/8, $0xd6990624d192e819
DATA ·sha256K+184(SB)/8, $0x106aa070f40e3585
DATA ·sha256K+192(SB)/8, $0x1e376c0819a4c116
DATA ·sha256K+200(SB)/8, $0x34b0bcb52748774c
DATA ·sha256K+208(SB)/8, $0x4ed8aa4a391c0cb3
DATA ·sha256K+216(SB)/8, $0x682e6ff35b9cca4f
DATA ·sha256K+224(SB)/8, $0x78a5636f748f82ee
DATA ·sha256K+232(SB)/8, $0x8cc7020884c87814
DATA ·sha256K+240(SB)/8, $0xa4506ceb90befffa
DATA ·sha256K+248(SB)/8, $0xc67178f2bef9a3f7
GLOBL ·sha256K(SB), RODATA|NOPTR, $256

// PSHUFB mask reversing the bytes of each 32-bit lane.
DATA ·sha256ByteSwap+0(SB)/8, $0x0405060700010203
DATA ·sha256ByteSwap+8(SB)/8, $0x0c0d0e0f08090a0b
GLOBL ·sha256ByteSwap(SB), RODATA|NOPTR, $16
