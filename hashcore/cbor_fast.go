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
	tokHead  [9]byte // array head for blockSize tokens
	tokHeadN int
}

func newCBORBlockEncoder(blockSize int) cborBlockEncoder {
	var e cborBlockEncoder
	h := appendCBORHead(e.tokHead[:0], cborMajorArray, uint64(blockSize))
	e.tokHeadN = len(h)
	return e
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
	pos += copy(buf[pos:], e.tokHead[:e.tokHeadN])
	_ = buf[pos+5*len(tokens)+7] // one bounds check for every token store below
	base := unsafe.Pointer(unsafe.SliceData(buf))
	for _, t := range tokens {
		f := cborUintWords[bits.Len32(t)]
		if t-16 < 8 {
			f = cborUintWords[0]
		}
		w := uint64(f&0xff) | uint64(bits.ReverseBytes32(t)>>((f>>8)&31))<<((f>>16)&63)
		binary.LittleEndian.PutUint64((*[8]byte)(unsafe.Add(base, pos))[:], w)
		pos += int(f >> 24)
	}
	pos += copy(buf[pos:], extras)
	return buf[:pos]
}

// cborUintWords packs cborUintForms into one word per entry: head | swapShift<<8 |
// headShift<<16 | size<<24, so the token loop does one table load.
var cborUintWords = func() (w [33]uint32) {
	for i, f := range cborUintForms {
		w[i] = uint32(f.head) | uint32(f.swapShift)<<8 | uint32(f.headShift)<<16 | uint32(f.size)<<24
	}
	return w
}()
