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

var sha256IV = [8]uint32{0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19}

// sha256Sum sets out to SHA-256(msg). When the block function is available and msg has
// sha256PadSlack bytes of capacity after it, the padding is written there (overwriting
// whatever those bytes held) and no crypto/sha256 call is made.
func sha256Sum(out *[32]byte, msg []byte) {
	n := len(msg)
	if !useSHA256Blocks || cap(msg)-n < sha256PadSlack {
		*out = sha256.Sum256(msg)
		return
	}
	total := (n + 9 + 63) &^ 63
	p := msg[:total]
	p[n] = 0x80
	clear(p[n+1 : total-8])
	binary.BigEndian.PutUint64(p[total-8:], uint64(n)<<3)
	h := sha256IV
	sha256Blocks(&h, p)
	for i, v := range h {
		binary.BigEndian.PutUint32(out[4*i:], v)
	}
}
