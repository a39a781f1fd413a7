package hashcore

import (
	"encoding/binary"
	"math/bits"
	"unsafe"
)

// cborBlockEncoder writes vLLM's block tuple in canonical CBOR as fast as the hot path
// needs: the parts that do not change from block to block (heads, extras) are encoded
// once per call, the parent digest is a fixed-size copy, and tokens are stored
// branch-free. It produces exactly appendBlockCBOR's bytes (tested).
type cborBlockEncoder struct {
	tokHeadWord uint64 // array head for blockSize tokens, little-endian in a word
	tokHeadN    int    // its length: at most 5 bytes as blockSize <= MaxBlockSize
}

func newCBORBlockEncoder(blockSize int) cborBlockEncoder {
	var b [9]byte
	h := appendCBORHead(b[:0], cborMajorArray, uint64(blockSize))
	return cborBlockEncoder{tokHeadWord: binary.LittleEndian.Uint64(b[:8]), tokHeadN: len(h)}
}

// maxLen bounds one encoded block (plus 8 bytes of store slack) for extras of n bytes.
func (e *cborBlockEncoder) maxLen(blockSize, extras int) int {
	return 3 + 32 + e.tokHeadN + 5*blockSize + extras + 8
}

// encode writes the block into buf[:cap(buf)], which must hold maxLen bytes, and returns
// the encoded prefix. parent is 16 or 32 bytes; extras is the pre-encoded extra keys.
func (e *cborBlockEncoder) encode(buf []byte, parent *Digest, tokens []uint32, extras []byte) []byte {
	buf = buf[:cap(buf)]
	var pos int
	switch parent.N {
	case 32:
		buf[0], buf[1], buf[2] = 0x83, 0x58, 32
		*(*[32]byte)(buf[3:35]) = parent.B
		pos = 35
	case 16:
		buf[0], buf[1] = 0x83, 0x50
		*(*[16]byte)(buf[2:18]) = *(*[16]byte)(parent.B[:16])
		pos = 18
	default:
		buf[0] = 0x83
		pos = len(appendCBORHead(buf[:1], cborMajorBytes, uint64(parent.N)))
		pos += copy(buf[pos:], parent.B[:parent.N])
	}
	return buf[:e.encodeTokens(buf, pos, tokens, extras)]
}

// cborParent32At is where a 32-byte parent digest starts in a block message.
const cborParent32At = 3

// encodeAround32 writes a block whose parent is a 32-byte digest into buf[:cap(buf)],
// except the parent bytes buf[3:35], and returns the message length. The chain writes
// the parent last, once the previous block's digest is known, so the rest of the
// message can be built while that digest is still being computed.
func (e *cborBlockEncoder) encodeAround32(buf []byte, tokens []uint32, extras []byte) int {
	buf = buf[:cap(buf)]
	buf[0], buf[1], buf[2] = 0x83, 0x58, 32
	return e.encodeTokens(buf, cborParent32At+32, tokens, extras)
}

// encodeTokens writes the token array and extras at buf[pos:] (buf at full capacity)
// and returns the message length.
func (e *cborBlockEncoder) encodeTokens(buf []byte, pos int, tokens []uint32, extras []byte) int {
	binary.LittleEndian.PutUint64(buf[pos:pos+8], e.tokHeadWord)
	pos += e.tokHeadN
	if useTokensAVX512 && len(tokens) >= 8 {
		// A step writes at most 40 bytes and stores 64.
		if steps := len(tokens) / 8; pos+40*steps+24 <= len(buf) {
			pos += cborTokensAVX512(&buf[pos], &tokens[0], steps)
			tokens = tokens[8*steps:]
		}
	}
	_ = buf[pos+5*len(tokens)+7] // one bounds check for every token store below
	base := unsafe.Pointer(unsafe.SliceData(buf))
	for _, t := range tokens {
		f := cborTokenForms[bits.Len32(t)]
		if t-16 < 8 { // 16..23 share bit length 5 with 24..31 but fit in the head byte
			f = cborTokenForms[0]
		}
		// ReverseBytes64 puts t's big-endian bytes at the top of the word; one shift
		// moves the significant ones right behind the head byte.
		w := bits.ReverseBytes64(uint64(t))>>(f&63) | uint64(f>>8&0xff)
		binary.LittleEndian.PutUint64((*[8]byte)(unsafe.Add(base, pos))[:], w)
		pos += int(f >> 16)
	}
	if len(extras) == 1 {
		buf[pos] = extras[0]
		pos++
	} else {
		pos += copy(buf[pos:], extras)
	}
	return pos
}

// cborTokenForms is indexed by bits.Len32(v): the right shift that brings the
// byte-reversed value behind the head (bits 0-7), the head byte (8-15) and the encoded
// size (16-23). Values < 24 are their own head.
var cborTokenForms = func() (w [33]uint32) {
	for n := range w {
		switch {
		case n <= 4:
			w[n] = 56 | 0<<8 | 1<<16
		case n <= 8:
			w[n] = 48 | 24<<8 | 2<<16
		case n <= 16:
			w[n] = 40 | 25<<8 | 3<<16
		default:
			w[n] = 24 | 26<<8 | 5<<16
		}
	}
	return w
}()
