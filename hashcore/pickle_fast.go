package hashcore

import (
	"encoding/binary"
	"math/bits"
	"unsafe"
)

// The hot path of the pickle contracts. A block whose single frame stays under 64 KiB is
// laid out as
//
//	PROTO 5 | FRAME len | SHORT_BINBYTES parent MEMOIZE | [MARK] ints | suffix
//
// where the suffix (tuple close, extra keys, TUPLE3 MEMOIZE STOP) is the same for every
// block after the first, so it is encoded once per call. The bytes equal what the general
// pickler writes (tested against it; it is tested against Python).

// appendPickleSuffix appends everything after the token ints of a block of n tokens.
// Memo slots: 0 parent, 1 token tuple, 2.. the extra-key strings.
func appendPickleSuffix(dst []byte, n int, lora, salt string) []byte {
	p := pickler{buf: dst, frameStart: 1 << 30} // never at a frame boundary: pickleFits decides
	p.memo = 1
	p.tupleClose(n)
	p.extraKeys(lora, salt)
	p.tupleClose(3)
	return append(p.buf, pkStop)
}

// pickleFits reports whether a block of n tokens with this suffix fits one frame, so that
// no frame boundary can occur inside it.
func pickleFits(parentLen, n, suffixLen int) bool {
	return 2+parentLen+1+1+7*n+suffixLen <= pkFrameTarget
}

// pickleMaxLen bounds the encoded block plus 8 bytes of store slack.
func pickleMaxLen(parentLen, n, suffixLen int) int {
	return 2 + pkFrameHeader + 2 + parentLen + 1 + 1 + 7*n + suffixLen + 8
}

// encodeBlockPickle writes the block into buf[:cap(buf)] (pickleMaxLen bytes) and
// returns it. parent.N must be below 256 and pickleFits must hold.
func encodeBlockPickle(buf []byte, parent *Digest, tokens []uint32, suffix []byte) []byte {
	buf = buf[:cap(buf)]
	buf[0], buf[1], buf[2] = pkProto, 5, pkFrame
	buf[11], buf[12] = pkShortBinBytes, parent.N
	pos := 13
	switch parent.N {
	case 32:
		*(*[32]byte)(buf[13:45]) = parent.B
		pos = 45
	case 16:
		*(*[16]byte)(buf[13:29]) = *(*[16]byte)(parent.B[:16])
		pos = 29
	default:
		pos += copy(buf[pos:], parent.B[:parent.N])
	}
	return buf[:encodePickleInts(buf, pos, tokens, suffix)]
}

// pickleParent32At is where a 32-byte parent digest starts in a block message.
const pickleParent32At = 13

// encodeAroundPickle32 writes a block whose parent is a 32-byte digest into
// buf[:cap(buf)] (pickleMaxLen bytes), except the parent bytes buf[13:45], and returns
// the message length; see cborBlockEncoder.encodeAround32.
func encodeAroundPickle32(buf []byte, tokens []uint32, suffix []byte) int {
	buf = buf[:cap(buf)]
	buf[0], buf[1], buf[2] = pkProto, 5, pkFrame
	buf[11], buf[12] = pkShortBinBytes, 32
	return encodePickleInts(buf, pickleParent32At+32, tokens, suffix)
}

// encodePickleInts writes everything after the parent bytes, which end at pos, and the
// frame length, and returns the message length.
func encodePickleInts(buf []byte, pos int, tokens []uint32, suffix []byte) int {
	buf[pos] = pkMemoize
	pos++
	if len(tokens) > 3 {
		buf[pos] = pkMark
		pos++
	}
	if useTokensAVX512 && len(tokens) >= 8 {
		// A step writes at most 56 bytes and stores 64.
		if steps := len(tokens) / 8; pos+56*steps+8 <= len(buf) {
			pos += pickleTokensAVX512(&buf[pos], &tokens[0], steps)
			tokens = tokens[8*steps:]
		}
	}
	_ = buf[pos+7*len(tokens)+7] // one bounds check for every token store below
	base := unsafe.Pointer(unsafe.SliceData(buf))
	for _, t := range tokens {
		f := &pickleIntForms[bits.Len32(t)]
		binary.LittleEndian.PutUint64((*[8]byte)(unsafe.Add(base, pos))[:], f.ops+uint64(t)*f.mul)
		pos += int(f.size)
	}
	pos += copy(buf[pos:], suffix)
	binary.LittleEndian.PutUint64(buf[3:11], uint64(pos-2-pkFrameHeader))
	return pos
}
