//go:build !purego

#include "textflag.h"

// SHA-256 compression with the Intel SHA extensions, written from the Intel SDM's
// description of SHA256RNDS2/SHA256MSG1/SHA256MSG2 and FIPS 180-4.
//
// Go assembly lists operands source first: Intel's "sha256rnds2 xmm1, xmm2, <xmm0>"
// (xmm1: C,D,G,H in, A,B,E,F two rounds later out; xmm2: A,B,E,F; xmm0: two W+K
// words) is written SHA256RNDS2 X0, xmm2, xmm1 here.
//
// Registers:
//	DI  h, out or d   SI  message    DX  end of message    AX  &sha256K
//	X1  ABEF          X2  CDGH       X0  W+K (implicit operand of SHA256RNDS2)
//	X3..X6  the message schedule, four words each, rotating
//	X7  scratch       X8  byte-swap mask    X9, X10  state at block start
//	X11..X13  the parent digest and scratch (PARENT_AT)

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

// STATE_IN turns a b c d in X1 and e f g h in X2 (lowest lane first) into ABEF in X1
// and CDGH in X2, the layout SHA256RNDS2 works on.
#define STATE_IN \
	PSHUFD $0xB1, X1, X1; \
	PSHUFD $0x1B, X2, X2; \
	MOVO X1, X7; \
	PALIGNR $8, X2, X1; \
	PBLENDW $0xF0, X7, X2

// STATE_OUT is STATE_IN's inverse.
#define STATE_OUT \
	PSHUFD $0x1B, X1, X1; \
	PSHUFD $0xB1, X2, X2; \
	MOVO X1, X7; \
	PBLENDW $0xF0, X2, X1; \
	PALIGNR $8, X7, X2

// ROUNDS64W compresses one block whose schedule groups 0..3 are loaded in X3..X6 into
// ABEF (X1), CDGH (X2). Group g (words 4g..4g+3) lives in X3..X6 by g mod 4; in group
// g's rounds the next group is finished (NEXTW, g = 3..14) and then MSG1 starts group
// g+3 (g = 1..12). After each group of four rounds comes the step w (labels l0..l15),
// and after groups 7 and 15 the step t (labels t7, t15): the scalar fused loops write
// the next message there (ROUNDS64 has no steps).
#define ROUNDS64W(w, t, l0, l1, l2, l3, l4, l5, l6, l7, l8, l9, l10, l11, l12, l13, l14, l15, t7, t15) \
	MOVO X1, X9; \
	MOVO X2, X10; \
	ROUNDS4(X3, 0); \
	w(l0); \
	ROUNDS4(X4, 16); \
	SHA256MSG1 X4, X3; \
	w(l1); \
	ROUNDS4(X5, 32); \
	SHA256MSG1 X5, X4; \
	w(l2); \
	ROUNDS4(X6, 48); \
	NEXTW(X3, X6, X5); \
	SHA256MSG1 X6, X5; \
	w(l3); \
	ROUNDS4(X3, 64); \
	NEXTW(X4, X3, X6); \
	SHA256MSG1 X3, X6; \
	w(l4); \
	ROUNDS4(X4, 80); \
	NEXTW(X5, X4, X3); \
	SHA256MSG1 X4, X3; \
	w(l5); \
	ROUNDS4(X5, 96); \
	NEXTW(X6, X5, X4); \
	SHA256MSG1 X5, X4; \
	w(l6); \
	ROUNDS4(X6, 112); \
	NEXTW(X3, X6, X5); \
	SHA256MSG1 X6, X5; \
	w(l7); \
	t(t7); \
	ROUNDS4(X3, 128); \
	NEXTW(X4, X3, X6); \
	SHA256MSG1 X3, X6; \
	w(l8); \
	ROUNDS4(X4, 144); \
	NEXTW(X5, X4, X3); \
	SHA256MSG1 X4, X3; \
	w(l9); \
	ROUNDS4(X5, 160); \
	NEXTW(X6, X5, X4); \
	SHA256MSG1 X5, X4; \
	w(l10); \
	ROUNDS4(X6, 176); \
	NEXTW(X3, X6, X5); \
	SHA256MSG1 X6, X5; \
	w(l11); \
	ROUNDS4(X3, 192); \
	NEXTW(X4, X3, X6); \
	SHA256MSG1 X3, X6; \
	w(l12); \
	ROUNDS4(X4, 208); \
	NEXTW(X5, X4, X3); \
	w(l13); \
	ROUNDS4(X5, 224); \
	NEXTW(X6, X5, X4); \
	w(l14); \
	ROUNDS4(X6, 240); \
	w(l15); \
	t(t15); \
	PADDL X9, X1; \
	PADDL X10, X2

#define NO_STEP(label)

#define ROUNDS64 ROUNDS64W(NO_STEP, NO_STEP, l0, l1, l2, l3, l4, l5, l6, l7, l8, l9, l10, l11, l12, l13, l14, l15, t7, t15)

// BLOCK compresses the 64 bytes at SI (BLOCKW: with ROUNDS64W's steps).
#define BLOCKW(w, t, l0, l1, l2, l3, l4, l5, l6, l7, l8, l9, l10, l11, l12, l13, l14, l15, t7, t15) \
	LOADW(0, X3); \
	LOADW(16, X4); \
	LOADW(32, X5); \
	LOADW(48, X6); \
	ROUNDS64W(w, t, l0, l1, l2, l3, l4, l5, l6, l7, l8, l9, l10, l11, l12, l13, l14, l15, t7, t15)

#define BLOCK BLOCKW(NO_STEP, NO_STEP, l0, l1, l2, l3, l4, l5, l6, l7, l8, l9, l10, l11, l12, l13, l14, l15, t7, t15)

// HASH_MSG hashes the padded message at SI..DX: its first block, whose schedule
// words parent loads, with the rounds first, each later one with next (labels
// blocks, last), and leaves the digest's bytes in X1 and X2.
#define HASH_MSG(parent, first, next, blocks, last) \
	parent; \
	first; \
	ADDQ $64, SI; \
	CMPQ SI, DX; \
	JEQ last; \
blocks: \
	next; \
	ADDQ $64, SI; \
	CMPQ SI, DX; \
	JNE blocks; \
last: \
	STATE_OUT; \
	PSHUFB X8, X1; \
	PSHUFB X8, X2

// PARENT_AT(at, rest, mask) loads the first block of a message whose bytes at..at+31
// are the 32-byte digest at (DI) instead of what p holds there (0 < at < 16, rest =
// 16-at, mask: at 0xff bytes then zeros). The digest comes from DI as two 16-byte
// loads: DI is where the previous call stored it the same way, so the loads take it
// straight from the store buffer, and the chain never waits for a parent written into
// the message to reach the cache.
#define PARENT_AT(at, rest, mask) \
	MOVOU 0(DI), X11; \
	MOVOU 16(DI), X12; \
	PARENT_SPLICE(at, rest, mask)

// PARENT_SPLICE is PARENT_AT with the digest already in X11 (bytes 0..15) and X12
// (bytes 16..31).
#define PARENT_SPLICE(at, rest, mask) \
	MOVOU mask, X7; \
	MOVOU 0(SI), X3; \
	PAND X7, X3; \
	MOVO X11, X13; \
	PSLLO $at, X13; \
	POR X13, X3; \
	MOVO X12, X4; \
	PALIGNR $rest, X11, X4; \
	MOVOU 32(SI), X13; \
	PANDN X13, X7; \
	MOVO X12, X5; \
	PSRLO $rest, X5; \
	POR X7, X5; \
	MOVOU 48(SI), X6; \
	PSHUFB X8, X3; \
	PSHUFB X8, X4; \
	PSHUFB X8, X5; \
	PSHUFB X8, X6

// PARENT_AT0 is PARENT_AT for a digest at bytes 0..31.
#define PARENT_AT0 \
	MOVOU 0(DI), X3; \
	MOVOU 16(DI), X4; \
	LOADW(32, X5); \
	LOADW(48, X6); \
	PSHUFB X8, X3; \
	PSHUFB X8, X4

// CHAIN is the body of the sha256ChainAt functions, loading the first block with the
// given PARENT_AT macro.
#define CHAIN(parent) \
	MOVQ d+0(FP), DI; \
	MOVQ p_base+8(FP), SI; \
	MOVQ p_len+16(FP), DX; \
	ANDQ $~63, DX; \
	JZ done; \
	ADDQ SI, DX; \
	LEAQ ·sha256K(SB), AX; \
	MOVOU ·sha256ByteSwap(SB), X8; \
	MOVOU ·sha256Init+0(SB), X1; \
	MOVOU ·sha256Init+16(SB), X2; \
	STATE_IN; \
	HASH_MSG(parent, ROUNDS64, BLOCK, loop, final); \
	MOVOU X1, 0(DI); \
	MOVOU X2, 16(DI); \
done: \
	RET

// sha256ChainCBORAVX512, sha256ChainPickleAVX512 and sha256ChainSGLangAVX512: the vLLM
// sha256_cbor and sha256 (pickle) chains and SGLang's page chain in one loop that, for each block, writes the next block's message
// (AVX-512 token encoding, extras, padding), then hashes the current one with the
// parent digest spliced in from registers. The writing depends on no digest, so the
// out-of-order core runs it under the SHA rounds' latency chain (writing it after the
// current message's first 64-byte block instead measured slower); no Go call, digest
// store/reload or key append per block.
//
// The AVX-512 part works on 256-bit vectors (AVX-512 VL), four tokens a step, in
// Y16..Y31 and K1..K5. 256 bits because a 512-bit µop in flight takes port 1's vector
// unit away on current Intel cores, leaving the SHA rounds' shuffles one port (about
// 10% slower, measured); Y16..Y31 because SSE code (the SHA rounds, X0..X13) after AVX
// code that left only those registers' upper halves dirty pays no transition cost.
//
// Registers: AX &sha256K, SI/DX block and end of the message being hashed, R12 its
// slot, BX its length in 64-byte blocks, R13 the other slot (being written), DI write
// cursor, R8 next token, R9 end of the block's tokens then the written message's
// block count, R10 plan, R11 next key, CX scratch.
//
// Plan layout (sha256FusedPlan): 0 prefix, 64 extras, 128 0x80 and zeros, 192 prefix
// length, 200 extras length, 208 bytes of tokens per block.

// CBOR_CONSTS and CBOR_STEP: CBOR_STEP encodes 4 tokens at (R8) as CBOR unsigned ints
// to (DI) and advances DI (cborTokensAVX512's step on 256-bit vectors).
#define CBOR_CONSTS \
	VPBROADCASTQ ·tokConst+0(SB), Y20; \
	VPBROADCASTQ ·tokConst+8(SB), Y21; \
	VPBROADCASTQ ·tokConst+16(SB), Y22; \
	VPBROADCASTQ ·tokConst+24(SB), Y24; \
	VPBROADCASTQ ·tokConst+32(SB), Y25; \
	VPBROADCASTQ ·tokConst+40(SB), Y26; \
	VPBROADCASTQ ·tokConst+48(SB), Y27; \
	VPBROADCASTQ ·tokConst+56(SB), Y28; \
	VPBROADCASTQ ·tokConst+64(SB), Y29; \
	VBROADCASTI32X4 ·cborLaneShuffle(SB), Y23

#define CBOR_STEP \
	VPMOVZXDQ (R8), Y16; \
	VPSHUFB Y23, Y16, Y17; \
	VPCMPUQ $5, Y20, Y16, K1; \
	VPCMPUQ $5, Y21, Y16, K2; \
	VPCMPUQ $5, Y22, Y16, K3; \
	VMOVDQA64 Y24, Y18; \
	VPADDQ Y25, Y18, K2, Y18; \
	VPADDQ Y25, Y18, K3, Y18; \
	VPORQ Y18, Y17, Y17; \
	VMOVDQA64 Y26, Y19; \
	VMOVDQA64 Y27, K1, Y19; \
	VMOVDQA64 Y28, K2, Y19; \
	VMOVDQA64 Y29, K3, Y19; \
	VPMOVB2M Y19, K4; \
	VPCOMPRESSB.Z Y17, K4, Y30; \
	VMOVDQU8 Y30, (DI); \
	KMOVD K4, CX; \
	POPCNTL CX, CX; \
	ADDQ CX, DI

// PICKLE_CONSTS and PICKLE_STEP: PICKLE_STEP encodes 4 tokens at (R8) as pickle int
// opcodes to (DI) and advances DI (pickleTokensAVX512's step on 256-bit vectors).
#define PICKLE_CONSTS \
	VPBROADCASTQ ·tokConst+72(SB), Y20; \
	VPBROADCASTQ ·tokConst+8(SB), Y21; \
	VPBROADCASTQ ·tokConst+16(SB), Y22; \
	VPBROADCASTQ ·tokConst+80(SB), Y23; \
	VPBROADCASTQ ·tokConst+88(SB), Y24; \
	VPBROADCASTQ ·tokConst+96(SB), Y25; \
	VPBROADCASTQ ·tokConst+104(SB), Y26; \
	VPBROADCASTQ ·tokConst+112(SB), Y27; \
	VPBROADCASTQ ·tokConst+120(SB), Y28; \
	VPBROADCASTQ ·tokConst+64(SB), Y29; \
	VPBROADCASTQ ·tokConst+128(SB), Y30

#define PICKLE_STEP \
	VPMOVZXDQ (R8), Y16; \
	VPCMPUQ $5, Y21, Y16, K2; \
	VPCMPUQ $5, Y22, Y16, K3; \
	VPCMPUQ $5, Y20, Y16, K5; \
	VPSLLQ $8, Y16, Y17; \
	VMOVDQA64 Y23, Y18; \
	VMOVDQA64 Y24, K2, Y18; \
	VMOVDQA64 Y25, K3, Y18; \
	VPORQ Y18, Y17, Y17; \
	VPSLLQ $16, Y16, Y18; \
	VPORQ Y26, Y18, Y18; \
	VMOVDQA64 Y18, K5, Y17; \
	VMOVDQA64 Y27, Y19; \
	VMOVDQA64 Y28, K2, Y19; \
	VMOVDQA64 Y29, K3, Y19; \
	VMOVDQA64 Y30, K5, Y19; \
	VPMOVB2M Y19, K4; \
	VPCOMPRESSB.Z Y17, K4, Y16; \
	VMOVDQU8 Y16, (DI); \
	KMOVD K4, CX; \
	POPCNTL CX, CX; \
	ADDQ CX, DI

// SGLANG_STEP copies 4 tokens at (R8) to (DI), little-endian as they are, and
// advances DI: SGLang's page message is the parent digest then the tokens.
#define NO_CONSTS
#define SGLANG_STEP \
	VMOVDQU64 (R8), X16; \
	VMOVDQU64 X16, (DI); \
	ADDQ $16, DI

// PARENT_SPLICE0 is PARENT_SPLICE for a digest at bytes 0..31.
#define PARENT_SPLICE0 \
	MOVO X11, X3; \
	MOVO X12, X4; \
	LOADW(32, X5); \
	LOADW(48, X6); \
	PSHUFB X8, X3; \
	PSHUFB X8, X4

// KEY_LAST8 and KEY_FIRST8 take the digest's last (vLLM) or first (SGLang) 8 bytes
// into CX, to be byte-swapped into the big-endian key.
#define KEY_LAST8 PEXTRQ $1, X12, CX
#define KEY_FIRST8 MOVQ X11, CX

// NO_FRAME and PICKLE_FRAME run with the message length in DI: pickle writes its frame
// length (everything after the 11-byte PROTO and FRAME header) at bytes 3..10.
#define NO_FRAME
#define PICKLE_FRAME \
	LEAQ -11(DI), CX; \
	MOVQ CX, 3(R13)

// FUSED_ARGS loads the fused loops' arguments every loop keeps in the same registers:
// the parent digest's bytes (X11, X12), plan (R10), the two slots (R12, R13).
#define FUSED_ARGS \
	MOVQ d+0(FP), DI; \
	MOVOU 0(DI), X11; \
	MOVOU 16(DI), X12; \
	MOVQ plan+8(FP), R10; \
	MOVQ slots+16(FP), R12; \
	MOVQ slotSize+24(FP), R13; \
	ADDQ R12, R13

// FUSED is the body of the sha256Chain*AVX512 functions.
#define FUSED(consts, step, frame, parent, key) \
	FUSED_ARGS; \
	MOVQ blocks0+32(FP), BX; \
	MOVQ tokens+40(FP), R8; \
	MOVQ keys+48(FP), R11; \
	LEAQ ·sha256K(SB), AX; \
	MOVOU ·sha256ByteSwap(SB), X8; \
	consts; \
loop: \
	DECQ n+56(FP); \
	JZ written; \
	MOVQ 0(R10), CX; \
	MOVQ CX, 0(R13); \
	MOVQ 8(R10), CX; \
	MOVQ CX, 8(R13); \
	VMOVDQU64 32(R10), Y31; \
	VMOVDQU64 Y31, 32(R13); \
	MOVQ 192(R10), DI; \
	ADDQ R13, DI; \
	MOVQ 208(R10), R9; \
	ADDQ R8, R9; \
encloop: \
	step; \
	ADDQ $16, R8; \
	CMPQ R8, R9; \
	JNE encloop; \
	VMOVDQU64 64(R10), Y31; \
	VMOVDQU64 Y31, (DI); \
	ADDQ 200(R10), DI; \
	VMOVDQU64 128(R10), Y31; \
	VMOVDQU64 Y31, (DI); \
	VMOVDQU64 160(R10), Y31; \
	VMOVDQU64 Y31, 32(DI); \
	SUBQ R13, DI; \
	frame; \
	LEAQ 72(DI), R9; \
	ANDQ $~63, R9; \
	SHLQ $3, DI; \
	BSWAPQ DI; \
	MOVQ DI, -8(R13)(R9*1); \
	SHRQ $6, R9; \
written: \
	MOVOU ·sha256Init+0(SB), X1; \
	MOVOU ·sha256Init+16(SB), X2; \
	STATE_IN; \
	MOVQ R12, SI; \
	MOVQ BX, DX; \
	SHLQ $6, DX; \
	ADDQ SI, DX; \
	HASH_MSG(parent, ROUNDS64, BLOCK, blkloop, msgdone); \
	MOVO X1, X11; \
	MOVO X2, X12; \
	key; \
	BSWAPQ CX; \
	MOVQ CX, (R11); \
	ADDQ $8, R11; \
	CMPQ n+56(FP), $0; \
	JEQ done; \
	XCHGQ R12, R13; \
	MOVQ R9, BX; \
	JMP loop; \
done: \
	MOVQ d+0(FP), DI; \
	MOVOU X11, 0(DI); \
	MOVOU X12, 16(DI); \
	VZEROUPPER; \
	RET

// In FUSED, the next message is written as: the prefix's bytes 0..15 and 32..63 (the
// parent digest's bytes are placeholders), the tokens, the extras (32 bytes stored),
// 0x80 and 63 zeros, then the frame length (pickle) and the bit length.

// sha256ChainCBORScalar, sha256ChainPickleScalar and sha256ChainSGLangScalar: FUSED for
// CPUs with the SHA extensions but without AVX-512. The next block's message is written
// one token at a time with scalar code, and the writing is interleaved with the current
// block's SHA rounds in the instruction stream (a step after each group of four rounds)
// rather than placed before or after them: a block's rounds are a latency chain long
// enough to fill the out-of-order window, so writes after them in program order wait
// for them to drain (bench/RESULTS.md, session 7), while writes among them run in the
// idle issue slots the chain leaves.
//
// Registers: AX &sha256K, SI/DX block and end of the message being hashed, R12 its
// slot, R13 the other slot (being written), DI write cursor, R8 next token, R9 end of
// the block's tokens (R8 == R9: nothing left to write), R10 plan, R11 the token table,
// BX, CX, R14 scratch (R14: the next message's length in bytes once written), X14
// scratch, X15 zero. The next key's address is kept in keys+48(FP).

// WSTEP(token, skip) writes the next token of the message being written, if any.
#define WSTEP(token, skip) \
	CMPQ R8, R9; \
	JEQ skip; \
	token; \
skip:

// TSTEP(frame, skip) writes the message's tail once its tokens are written, if it is
// not written yet (DI == 0 once it is, or when there is no message to write).
#define TSTEP(frame, skip) \
	CMPQ R8, R9; \
	JNE skip; \
	TESTQ DI, DI; \
	JZ skip; \
	TAIL(frame); \
skip:

// TAIL writes the message's end after its last token at DI: the extras (32 bytes
// stored), 0x80 and 63 zeros, the frame length (pickle) and the bit length; and leaves
// the padded message's length in R14, DI 0.
#define TAIL(frame) \
	MOVOU 64(R10), X14; \
	MOVOU X14, 0(DI); \
	MOVOU 80(R10), X14; \
	MOVOU X14, 16(DI); \
	ADDQ 200(R10), DI; \
	MOVOU 128(R10), X14; \
	MOVOU X14, 0(DI); \
	MOVOU X15, 16(DI); \
	MOVOU X15, 32(DI); \
	MOVOU X15, 48(DI); \
	SUBQ R13, DI; \
	frame; \
	LEAQ 72(DI), R14; \
	ANDQ $~63, R14; \
	SHLQ $3, DI; \
	BSWAPQ DI; \
	MOVQ DI, -8(R13)(R14*1); \
	XORL DI, DI

// CBOR_TOKEN writes the token at (R8) as a CBOR unsigned int at (DI), one 8-byte store,
// and advances both. The table (sha256TokCBOR), indexed by the token's highest set bit
// or by 0 for tokens < 24 (which covers BSR of 0, undefined; the XOR only breaks BSR's
// dependence on its destination), gives a word that puts the head byte right before
// the byte-swapped value's significant bytes, the right shift that brings the head to
// byte 0, and the encoded size.
#define CBOR_TOKEN \
	MOVL (R8), BX; \
	XORL R14, R14; \
	BSRL BX, R14; \
	CMPL BX, $24; \
	CMOVLCS 320(R11), R14; \
	BSWAPQ BX; \
	ORQ 0(R11)(R14*8), BX; \
	MOVBLZX 256(R11)(R14*1), CX; \
	SHRQ CX, BX; \
	MOVQ BX, (DI); \
	MOVBLZX 288(R11)(R14*1), CX; \
	ADDQ CX, DI; \
	ADDQ $4, R8

// PICKLE_TOKEN writes the token at (R8) as a pickle int opcode at (DI) and advances
// both: the table (sha256TokPickle), indexed by the highest set bit of the token | 1
// (BSR of 0 is undefined), gives the opcode bytes, the left shift that puts the value
// after them, and the size.
#define PICKLE_TOKEN \
	MOVL (R8), BX; \
	MOVL BX, R14; \
	ORL $1, R14; \
	BSRL R14, R14; \
	MOVBLZX 256(R11)(R14*1), CX; \
	SHLQ CX, BX; \
	ORQ 0(R11)(R14*8), BX; \
	MOVQ BX, (DI); \
	MOVBLZX 288(R11)(R14*1), CX; \
	ADDQ CX, DI; \
	ADDQ $4, R8

// SGLANG_TOKEN copies the token at (R8) to (DI), little-endian as it is.
#define SGLANG_TOKEN \
	MOVL (R8), BX; \
	MOVL BX, (DI); \
	ADDQ $4, DI; \
	ADDQ $4, R8

#define CBOR_W(skip) WSTEP(CBOR_TOKEN, skip)
#define PICKLE_W(skip) WSTEP(PICKLE_TOKEN, skip)
#define SGLANG_W(skip) WSTEP(SGLANG_TOKEN, skip)
#define NO_FRAME_T(skip) TSTEP(NO_FRAME, skip)
#define PICKLE_FRAME_T(skip) TSTEP(PICKLE_FRAME, skip)

// FUSED_SCALAR is the body of the sha256Chain*Scalar functions: FUSED's contract, with
// the token step w, the tail step t and their token and frame macros.
#define FUSED_SCALAR(table, w, t, token, frame, parent, key) \
	FUSED_ARGS; \
	MOVQ blocks0+32(FP), R14; \
	SHLQ $6, R14; \
	MOVQ tokens+40(FP), R8; \
	LEAQ table, R11; \
	LEAQ ·sha256K(SB), AX; \
	MOVOU ·sha256ByteSwap(SB), X8; \
	PXOR X15, X15; \
loop: \
	MOVQ R12, SI; \
	LEAQ (R12)(R14*1), DX; \
	MOVQ R8, R9; \
	XORL DI, DI; \
	DECQ n+56(FP); \
	JZ hash; \
	MOVOU 0(R10), X14; \
	MOVOU X14, 0(R13); \
	MOVOU 32(R10), X14; \
	MOVOU X14, 32(R13); \
	MOVQ 192(R10), DI; \
	ADDQ R13, DI; \
	ADDQ 208(R10), R9; \
hash: \
	MOVOU ·sha256InitABEF(SB), X1; \
	MOVOU ·sha256InitCDGH(SB), X2; \
	HASH_MSG(parent, ROUNDS64W(w, t, f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11, f12, f13, f14, f15, ft7, ft15), BLOCKW(w, t, b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, b10, b11, b12, b13, b14, b15, bt7, bt15), blkloop, msgdone); \
	MOVO X1, X11; \
	MOVO X2, X12; \
	key; \
	BSWAPQ CX; \
	MOVQ keys+48(FP), BX; \
	MOVQ CX, (BX); \
	ADDQ $8, keys+48(FP); \
	CMPQ n+56(FP), $0; \
	JEQ done; \
rest: \
	CMPQ R8, R9; \
	JEQ tail; \
	token; \
	JMP rest; \
tail: \
	TESTQ DI, DI; \
	JZ written; \
	TAIL(frame); \
written: \
	XCHGQ R12, R13; \
	JMP loop; \
done: \
	MOVQ d+0(FP), DI; \
	MOVOU X11, 0(DI); \
	MOVOU X12, 16(DI); \
	RET

// func sha256Blocks(h *[8]uint32, p []byte)
TEXT ·sha256Blocks(SB), NOSPLIT, $0-32
	MOVQ h+0(FP), DI
	MOVQ p_base+8(FP), SI
	MOVQ p_len+16(FP), DX
	ANDQ $~63, DX // whole blocks only
	JZ done
	ADDQ SI, DX
	LEAQ ·sha256K(SB), AX
	MOVOU ·sha256ByteSwap(SB), X8
	MOVOU 0(DI), X1
	MOVOU 16(DI), X2
	STATE_IN

loop:
	BLOCK
	ADDQ $64, SI
	CMPQ SI, DX
	JNE loop

	STATE_OUT
	MOVOU X1, 0(DI)
	MOVOU X2, 16(DI)

done:
	RET

// func sha256Digest(out *[32]byte, p []byte)
TEXT ·sha256Digest(SB), NOSPLIT, $0-32
	MOVQ out+0(FP), DI
	MOVQ p_base+8(FP), SI
	MOVQ p_len+16(FP), DX
	ANDQ $~63, DX // whole blocks only
	ADDQ SI, DX
	LEAQ ·sha256K(SB), AX
	MOVOU ·sha256ByteSwap(SB), X8
	MOVOU ·sha256Init+0(SB), X1
	MOVOU ·sha256Init+16(SB), X2
	STATE_IN
	CMPQ SI, DX
	JEQ final

loop:
	BLOCK
	ADDQ $64, SI
	CMPQ SI, DX
	JNE loop

final:
	STATE_OUT
	PSHUFB X8, X1 // the digest is the state words big-endian
	PSHUFB X8, X2
	MOVOU X1, 0(DI)
	MOVOU X2, 16(DI)
	RET

// func sha256ChainAt0(d *[32]byte, p []byte)
TEXT ·sha256ChainAt0(SB), NOSPLIT, $0-32
	CHAIN(PARENT_AT0)

// func sha256ChainAt3(d *[32]byte, p []byte)
TEXT ·sha256ChainAt3(SB), NOSPLIT, $0-32
	CHAIN(PARENT_AT(3, 13, ·sha256Low3(SB)))

// func sha256ChainAt13(d *[32]byte, p []byte)
TEXT ·sha256ChainAt13(SB), NOSPLIT, $0-32
	CHAIN(PARENT_AT(13, 3, ·sha256Low13(SB)))

// func sha256ChainCBORAVX512(d *[32]byte, plan *sha256FusedPlan, slots *byte, slotSize int, blocks0 int, tokens *uint32, keys *uint64, n int)
TEXT ·sha256ChainCBORAVX512(SB), NOSPLIT, $0-64
	FUSED(CBOR_CONSTS, CBOR_STEP, NO_FRAME, PARENT_SPLICE(3, 13, ·sha256Low3(SB)), KEY_LAST8)

// func sha256ChainPickleAVX512(d *[32]byte, plan *sha256FusedPlan, slots *byte, slotSize int, blocks0 int, tokens *uint32, keys *uint64, n int)
TEXT ·sha256ChainPickleAVX512(SB), NOSPLIT, $0-64
	FUSED(PICKLE_CONSTS, PICKLE_STEP, PICKLE_FRAME, PARENT_SPLICE(13, 3, ·sha256Low13(SB)), KEY_LAST8)

// func sha256ChainSGLangAVX512(d *[32]byte, plan *sha256FusedPlan, slots *byte, slotSize int, blocks0 int, tokens *uint32, keys *uint64, n int)
TEXT ·sha256ChainSGLangAVX512(SB), NOSPLIT, $0-64
	FUSED(NO_CONSTS, SGLANG_STEP, NO_FRAME, PARENT_SPLICE0, KEY_FIRST8)

// func sha256ChainCBORScalar(d *[32]byte, plan *sha256FusedPlan, slots *byte, slotSize int, blocks0 int, tokens *uint32, keys *uint64, n int)
TEXT ·sha256ChainCBORScalar(SB), NOSPLIT, $0-64
	FUSED_SCALAR(·sha256TokCBOR(SB), CBOR_W, NO_FRAME_T, CBOR_TOKEN, NO_FRAME, PARENT_SPLICE(3, 13, ·sha256Low3(SB)), KEY_LAST8)

// func sha256ChainPickleScalar(d *[32]byte, plan *sha256FusedPlan, slots *byte, slotSize int, blocks0 int, tokens *uint32, keys *uint64, n int)
TEXT ·sha256ChainPickleScalar(SB), NOSPLIT, $0-64
	FUSED_SCALAR(·sha256TokPickle(SB), PICKLE_W, PICKLE_FRAME_T, PICKLE_TOKEN, PICKLE_FRAME, PARENT_SPLICE(13, 3, ·sha256Low13(SB)), KEY_LAST8)

// func sha256ChainSGLangScalar(d *[32]byte, plan *sha256FusedPlan, slots *byte, slotSize int, blocks0 int, tokens *uint32, keys *uint64, n int)
TEXT ·sha256ChainSGLangScalar(SB), NOSPLIT, $0-64
	FUSED_SCALAR(·sha256TokCBOR(SB), SGLANG_W, NO_FRAME_T, SGLANG_TOKEN, NO_FRAME, PARENT_SPLICE0, KEY_FIRST8)

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

// The initial hash value H(0) (FIPS 180-4 section 5.3.3), a..h.
DATA ·sha256Init+0(SB)/8, $0xbb67ae856a09e667
DATA ·sha256Init+8(SB)/8, $0xa54ff53a3c6ef372
DATA ·sha256Init+16(SB)/8, $0x9b05688c510e527f
DATA ·sha256Init+24(SB)/8, $0x5be0cd191f83d9ab
GLOBL ·sha256Init(SB), RODATA|NOPTR, $32

// Byte masks for PARENT_AT: the first 3, the first 13 bytes.
DATA ·sha256Low3+0(SB)/8, $0x0000000000ffffff
DATA ·sha256Low3+8(SB)/8, $0
GLOBL ·sha256Low3(SB), RODATA|NOPTR, $16
DATA ·sha256Low13+0(SB)/8, $0xffffffffffffffff
DATA ·sha256Low13+8(SB)/8, $0x000000ffffffffff
GLOBL ·sha256Low13(SB), RODATA|NOPTR, $16

// Token tables of the scalar fused loops, indexed by a token's highest set bit: at 0 the
// word ORed in (8 bytes each), at 256 the shift, at 288 the encoded size (a byte each),
// at 320 a zero (CBOR_TOKEN's index for tokens < 24: index 0's form, head 0, shift 56,
// size 1, is theirs).
// CBOR: heads 0x18, 0x19, 0x1a at bytes 6, 5, 3 of the byte-swapped token, for highest
// bits 4..7, 8..15, 16..31.
DATA ·sha256TokCBOR+0(SB)/8, $0x0000000000000000
DATA ·sha256TokCBOR+8(SB)/8, $0x0000000000000000
DATA ·sha256TokCBOR+16(SB)/8, $0x0000000000000000
DATA ·sha256TokCBOR+24(SB)/8, $0x0000000000000000
DATA ·sha256TokCBOR+32(SB)/8, $0x0018000000000000
DATA ·sha256TokCBOR+40(SB)/8, $0x0018000000000000
DATA ·sha256TokCBOR+48(SB)/8, $0x0018000000000000
DATA ·sha256TokCBOR+56(SB)/8, $0x0018000000000000
DATA ·sha256TokCBOR+64(SB)/8, $0x0000190000000000
DATA ·sha256TokCBOR+72(SB)/8, $0x0000190000000000
DATA ·sha256TokCBOR+80(SB)/8, $0x0000190000000000
DATA ·sha256TokCBOR+88(SB)/8, $0x0000190000000000
DATA ·sha256TokCBOR+96(SB)/8, $0x0000190000000000
DATA ·sha256TokCBOR+104(SB)/8, $0x0000190000000000
DATA ·sha256TokCBOR+112(SB)/8, $0x0000190000000000
DATA ·sha256TokCBOR+120(SB)/8, $0x0000190000000000
DATA ·sha256TokCBOR+128(SB)/8, $0x000000001a000000
DATA ·sha256TokCBOR+136(SB)/8, $0x000000001a000000
DATA ·sha256TokCBOR+144(SB)/8, $0x000000001a000000
DATA ·sha256TokCBOR+152(SB)/8, $0x000000001a000000
DATA ·sha256TokCBOR+160(SB)/8, $0x000000001a000000
DATA ·sha256TokCBOR+168(SB)/8, $0x000000001a000000
DATA ·sha256TokCBOR+176(SB)/8, $0x000000001a000000
DATA ·sha256TokCBOR+184(SB)/8, $0x000000001a000000
DATA ·sha256TokCBOR+192(SB)/8, $0x000000001a000000
DATA ·sha256TokCBOR+200(SB)/8, $0x000000001a000000
DATA ·sha256TokCBOR+208(SB)/8, $0x000000001a000000
DATA ·sha256TokCBOR+216(SB)/8, $0x000000001a000000
DATA ·sha256TokCBOR+224(SB)/8, $0x000000001a000000
DATA ·sha256TokCBOR+232(SB)/8, $0x000000001a000000
DATA ·sha256TokCBOR+240(SB)/8, $0x000000001a000000
DATA ·sha256TokCBOR+248(SB)/8, $0x000000001a000000
DATA ·sha256TokCBOR+256(SB)/8, $0x3030303038383838
DATA ·sha256TokCBOR+264(SB)/8, $0x2828282828282828
DATA ·sha256TokCBOR+272(SB)/8, $0x1818181818181818
DATA ·sha256TokCBOR+280(SB)/8, $0x1818181818181818
DATA ·sha256TokCBOR+288(SB)/8, $0x0202020201010101
DATA ·sha256TokCBOR+296(SB)/8, $0x0303030303030303
DATA ·sha256TokCBOR+304(SB)/8, $0x0505050505050505
DATA ·sha256TokCBOR+312(SB)/8, $0x0505050505050505
DATA ·sha256TokCBOR+320(SB)/8, $0
GLOBL ·sha256TokCBOR(SB), RODATA|NOPTR, $328

// Pickle: BININT1 'K', BININT2 'M', BININT 'J' (value shifted 8) for highest bits 0..7,
// 8..15, 16..30; LONG1 0x8a 0x05 (value shifted 16, then a zero sign byte) for bit 31.
DATA ·sha256TokPickle+0(SB)/8, $0x000000000000004b
DATA ·sha256TokPickle+8(SB)/8, $0x000000000000004b
DATA ·sha256TokPickle+16(SB)/8, $0x000000000000004b
DATA ·sha256TokPickle+24(SB)/8, $0x000000000000004b
DATA ·sha256TokPickle+32(SB)/8, $0x000000000000004b
DATA ·sha256TokPickle+40(SB)/8, $0x000000000000004b
DATA ·sha256TokPickle+48(SB)/8, $0x000000000000004b
DATA ·sha256TokPickle+56(SB)/8, $0x000000000000004b
DATA ·sha256TokPickle+64(SB)/8, $0x000000000000004d
DATA ·sha256TokPickle+72(SB)/8, $0x000000000000004d
DATA ·sha256TokPickle+80(SB)/8, $0x000000000000004d
DATA ·sha256TokPickle+88(SB)/8, $0x000000000000004d
DATA ·sha256TokPickle+96(SB)/8, $0x000000000000004d
DATA ·sha256TokPickle+104(SB)/8, $0x000000000000004d
DATA ·sha256TokPickle+112(SB)/8, $0x000000000000004d
DATA ·sha256TokPickle+120(SB)/8, $0x000000000000004d
DATA ·sha256TokPickle+128(SB)/8, $0x000000000000004a
DATA ·sha256TokPickle+136(SB)/8, $0x000000000000004a
DATA ·sha256TokPickle+144(SB)/8, $0x000000000000004a
DATA ·sha256TokPickle+152(SB)/8, $0x000000000000004a
DATA ·sha256TokPickle+160(SB)/8, $0x000000000000004a
DATA ·sha256TokPickle+168(SB)/8, $0x000000000000004a
DATA ·sha256TokPickle+176(SB)/8, $0x000000000000004a
DATA ·sha256TokPickle+184(SB)/8, $0x000000000000004a
DATA ·sha256TokPickle+192(SB)/8, $0x000000000000004a
DATA ·sha256TokPickle+200(SB)/8, $0x000000000000004a
DATA ·sha256TokPickle+208(SB)/8, $0x000000000000004a
DATA ·sha256TokPickle+216(SB)/8, $0x000000000000004a
DATA ·sha256TokPickle+224(SB)/8, $0x000000000000004a
DATA ·sha256TokPickle+232(SB)/8, $0x000000000000004a
DATA ·sha256TokPickle+240(SB)/8, $0x000000000000004a
DATA ·sha256TokPickle+248(SB)/8, $0x000000000000058a
DATA ·sha256TokPickle+256(SB)/8, $0x0808080808080808
DATA ·sha256TokPickle+264(SB)/8, $0x0808080808080808
DATA ·sha256TokPickle+272(SB)/8, $0x0808080808080808
DATA ·sha256TokPickle+280(SB)/8, $0x1008080808080808
DATA ·sha256TokPickle+288(SB)/8, $0x0202020202020202
DATA ·sha256TokPickle+296(SB)/8, $0x0303030303030303
DATA ·sha256TokPickle+304(SB)/8, $0x0505050505050505
DATA ·sha256TokPickle+312(SB)/8, $0x0705050505050505
DATA ·sha256TokPickle+320(SB)/8, $0
GLOBL ·sha256TokPickle(SB), RODATA|NOPTR, $328

// The initial hash value as STATE_IN lays it out: ABEF (f e b a, lowest lane first)
// and CDGH (h g d c).
DATA ·sha256InitABEF+0(SB)/8, $0x510e527f9b05688c
DATA ·sha256InitABEF+8(SB)/8, $0x6a09e667bb67ae85
GLOBL ·sha256InitABEF(SB), RODATA|NOPTR, $16
DATA ·sha256InitCDGH+0(SB)/8, $0x1f83d9ab5be0cd19
DATA ·sha256InitCDGH+8(SB)/8, $0x3c6ef372a54ff53a
GLOBL ·sha256InitCDGH(SB), RODATA|NOPTR, $16
