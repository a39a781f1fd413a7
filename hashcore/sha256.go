package hashcore

import (
	"crypto/sha256"
	"encoding/binary"
)

// A chain's block message is short (about 100 bytes: two SHA-256 blocks after padding),
// so crypto/sha256's per-call work (digest setup, buffered Write, a second Write for the
// padding, finalization) costs about as much as the compressions. The chains instead
// pad the message in place, in slack they reserve after it in their scratch buffer, and
// run the block function once over the whole padded message.

// sha256PadSlack is the room after a message that in-place padding needs: 0x80, up to
// 63 zero bytes and the 8-byte length.
const sha256PadSlack = 72

// useSHA256Blocks selects in-place padding plus sha256Blocks. Tests turn it off to cover
// the crypto/sha256 path on CPUs that have the fast one.
var useSHA256Blocks = haveSHA256Blocks

// sha256Sum sets out to SHA-256(msg). When the block function is available and msg has
// sha256PadSlack bytes of capacity after it, the padding is written there (overwriting
// whatever those bytes held) and no crypto/sha256 call is made.
func sha256Sum(out *[32]byte, msg []byte) {
	n := len(msg)
	if !useSHA256Blocks || cap(msg)-n < sha256PadSlack {
		*out = sha256.Sum256(msg)
		return
	}
	sha256Digest(out, sha256Pad(msg, n))
}

// sha256Pad writes SHA-256's padding for the n-byte message in p[:n] into the
// sha256PadSlack bytes after it (cap(p) must allow) and returns the padded message.
func sha256Pad(p []byte, n int) []byte {
	total := (n + 9 + 63) &^ 63
	p = p[:total]
	// Zero from n up to the length field in word stores (the last may run into the
	// field, which is written after), then the 0x80 terminator and the bit length.
	for i := n; i < total-8; i += 8 {
		binary.LittleEndian.PutUint64(p[i:i+8], 0)
	}
	p[n] = 0x80
	binary.BigEndian.PutUint64(p[total-8:], uint64(n)<<3)
	return p
}

// useSHA256Fused selects the fused assembly loops (appendKeysFused); tests turn it off
// to cover the pipelined Go loop on CPUs that have them.
var useSHA256Fused = haveSHA256Fused

// useSHA256FusedScalar selects the scalar fused assembly loops where the AVX-512 ones
// do not run; tests turn it off to cover the pipelined Go loop.
var useSHA256FusedScalar = haveSHA256FusedScalar

// fusedLoop names the fused assembly loop that runs a chain's blocks.
type fusedLoop uint8

const (
	fusedNone   fusedLoop = iota // none: the pipelined Go loop (appendKeysSHA256)
	fusedAVX512                  // sha256Chain*AVX512
	fusedScalar                  // sha256Chain*Scalar
)

// pickFusedLoop returns the fused loop that runs blocks of bs tokens whose messages
// after the first have exN bytes of extras (pickle: suffix), written in slots of slot
// bytes (fusedSlot). The loops store 32 bytes of extras; the scalar loop's two slots
// stay within the pipelined loop's run of messages, so a pooled scratch stays as small.
func pickFusedLoop(bs, exN, slot int) fusedLoop {
	switch {
	case exN > 32:
		return fusedNone
	case useSHA256Fused && useTokensAVX512 && bs%4 == 0:
		return fusedAVX512
	case useSHA256FusedScalar && 2*slot <= sha256RunBytes:
		return fusedScalar
	}
	return fusedNone
}

// fusedSlot is the room a fused loop needs for one message of at most msgMax bytes
// before its extras and extras bytes of extras: the message, its padding and the
// stores that run up to 64 bytes past it, in whole cache lines.
func fusedSlot(msgMax, extras int) int {
	return (msgMax + extras + 72 + 63) &^ 63
}

// useTokensAVX512 selects the AVX-512 token encoders; tests turn it off to cover the
// one-token-at-a-time path on CPUs that have them.
var useTokensAVX512 = haveTokensAVX512

// sha256FusedPlan holds what the fused loops (sha256Chain*AVX512, sha256Chain*Scalar)
// need to write a chain's block messages themselves: the bytes before the tokens (the
// parent digest's bytes are placeholders) and after them, which are the same for every
// block after the first. The field offsets are part of the assembly's contract.
type sha256FusedPlan struct {
	prefix    [64]byte // the message up to the first token (stored: bytes 0..15 and 32..47, AVX-512 32..63)
	extras    [64]byte // the message after the last token (stored: bytes 0..31)
	pad       [64]byte // 0x80 then zeros: the start of the padding
	prefixLen uint64   // at most 48
	extrasLen uint64   // at most 32
	tokBytes  uint64   // 4 * block size (AVX-512 loops: a multiple of 16)
}
