//go:build amd64 && !purego

package hashcore

import "github.com/klauspost/cpuid/v2"

// sha256Blocks runs the SHA-256 compression function over every 64-byte block of p
// (len(p) a multiple of 64; a partial tail is ignored), updating h. It needs the SHA
// extensions, SSSE3 and SSE4.1: call it only when haveSHA256Blocks.
//
//go:noescape
func sha256Blocks(h *[8]uint32, p []byte)

// sha256Digest runs sha256Blocks from the initial hash value over p, an already padded
// message (len(p) a multiple of 64), and writes the digest to out. Same CPU needs.
//
//go:noescape
func sha256Digest(out *[32]byte, p []byte)

// sha256ChainAt0, sha256ChainAt3 and sha256ChainAt13 hash a chain's block message
// whose bytes at..at+32 (at = 0, 3, 13) are its parent digest: they hash p, already
// padded, as if *d were stored there (what p holds there is ignored), and replace *d
// with the message's digest. Taking the parent from d, where the previous call left
// it, keeps a store-to-load stall off the chain's critical path. Same CPU needs as
// sha256Blocks; len(p) >= 64.
//
//go:noescape
func sha256ChainAt0(d *[32]byte, p []byte)

//go:noescape
func sha256ChainAt3(d *[32]byte, p []byte)

//go:noescape
func sha256ChainAt13(d *[32]byte, p []byte)

// haveSHA256Blocks reports whether sha256Blocks can run on this CPU.
var haveSHA256Blocks = cpuid.CPU.Supports(cpuid.SHA, cpuid.SSSE3, cpuid.SSE4)

// sha256ChainCBORAVX512, sha256ChainPickleAVX512 and sha256ChainSGLangAVX512 run
// n >= 1 blocks of a vLLM sha256_cbor or sha256 (pickle) chain or of SGLang's page
// chain whose parent is the 32-byte digest *d. The
// first block's message is already in slots[:slotSize], padded, blocks0 64-byte
// blocks long; they write every later one themselves, from plan and the tokens of
// blocks 1..n-1 (plan.tokBytes bytes each, from tokens), alternately into the two
// slots of slotSize bytes at slots, each while the previous message is being hashed.
// A slot must hold a message, its padding and 64 bytes of stores past it. keys[i]
// gets block i's key, *d the last digest. Need haveSHA256Fused.
//
//go:noescape
func sha256ChainCBORAVX512(d *[32]byte, plan *sha256FusedPlan, slots *byte, slotSize int, blocks0 int, tokens *uint32, keys *uint64, n int)

//go:noescape
func sha256ChainPickleAVX512(d *[32]byte, plan *sha256FusedPlan, slots *byte, slotSize int, blocks0 int, tokens *uint32, keys *uint64, n int)

//go:noescape
func sha256ChainSGLangAVX512(d *[32]byte, plan *sha256FusedPlan, slots *byte, slotSize int, blocks0 int, tokens *uint32, keys *uint64, n int)

// sha256ChainCBORScalar, sha256ChainPickleScalar and sha256ChainSGLangScalar are the
// sha256Chain*AVX512 loops for CPUs without AVX-512: the same contract, with the
// messages written one token at a time among the SHA rounds. They need only the block
// function's CPU features (haveSHA256Blocks) and take any block size.
//
//go:noescape
func sha256ChainCBORScalar(d *[32]byte, plan *sha256FusedPlan, slots *byte, slotSize int, blocks0 int, tokens *uint32, keys *uint64, n int)

//go:noescape
func sha256ChainPickleScalar(d *[32]byte, plan *sha256FusedPlan, slots *byte, slotSize int, blocks0 int, tokens *uint32, keys *uint64, n int)

//go:noescape
func sha256ChainSGLangScalar(d *[32]byte, plan *sha256FusedPlan, slots *byte, slotSize int, blocks0 int, tokens *uint32, keys *uint64, n int)

// haveSHA256FusedScalar reports whether the sha256Chain*Scalar loops can run here.
var haveSHA256FusedScalar = haveSHA256Blocks

// haveSHA256Fused reports whether the sha256Chain*AVX512 loops can run here: the block
// function's and the AVX-512 token encoders' CPU needs, and AVX-512 VL.
var haveSHA256Fused = haveSHA256Blocks && haveTokensAVX512 && cpuid.CPU.Supports(cpuid.AVX512VL)
