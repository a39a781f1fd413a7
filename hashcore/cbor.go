package hashcore

import (
	"encoding/binary"
	"math/bits"
	"slices"
)

// Hand-written canonical CBOR (RFC 8949 §4.2.1 "core deterministic": shortest heads,
// definite lengths) for exactly the values vLLM hashes: the block tuple
// (parent bytes, [token uints], null | [text...]) and the NONE_HASH seed text.
// cbor2.dumps(x, canonical=True) produces the same bytes for these values; the fuzz
// test checks it against fxamacker/cbor's canonical encoder.

const (
	cborMajorUint  = 0
	cborMajorBytes = 2
	cborMajorText  = 3
	cborMajorArray = 4
	cborNull       = 0xf6
)

// appendCBORHead appends a head of the given major type with the shortest argument.
func appendCBORHead(dst []byte, major byte, n uint64) []byte {
	m := major << 5
	switch {
	case n < 24:
		return append(dst, m|byte(n))
	case n <= 0xff:
		return append(dst, m|24, byte(n))
	case n <= 0xffff:
		return append(dst, m|25, byte(n>>8), byte(n))
	case n <= 0xffffffff:
		return append(dst, m|26, byte(n>>24), byte(n>>16), byte(n>>8), byte(n))
	default:
		return append(dst, m|27, byte(n>>56), byte(n>>48), byte(n>>40), byte(n>>32),
			byte(n>>24), byte(n>>16), byte(n>>8), byte(n))
	}
}

func appendCBORText(dst []byte, s string) []byte {
	dst = appendCBORHead(dst, cborMajorText, uint64(len(s)))
	return append(dst, s...)
}

// cborUintForm describes the canonical encoding of an unsigned int of a given bit length:
// the head byte, how far to shift the byte-swapped value, and the encoded size.
type cborUintForm struct {
	head, swapShift, headShift, size uint8
}

// cborUintForms is indexed by bits.Len32(v). Values < 24 are the head byte itself;
// then 1, 2 or 4 big-endian argument bytes after heads 0x18, 0x19, 0x1a.
var cborUintForms = func() (f [33]cborUintForm) {
	for n := range f {
		switch {
		case n <= 4: // v < 16 < 24; 16..23 are handled below
			f[n] = cborUintForm{0, 24, 0, 1}
		case n <= 8:
			f[n] = cborUintForm{24, 24, 8, 2}
		case n <= 16:
			f[n] = cborUintForm{25, 16, 8, 3}
		default:
			f[n] = cborUintForm{26, 0, 8, 5}
		}
	}
	return f
}()

// appendCBORTokens appends the token tuple as an array of unsigned ints. It is the hot
// loop of the CBOR contracts: token widths are unpredictable, so each token is written
// branch-free as one 8-byte store of a table-built word, then the length advances by the
// encoded size (the buffer keeps 8 bytes of slack).
func appendCBORTokens(dst []byte, tokens []uint32) []byte {
	dst = appendCBORHead(dst, cborMajorArray, uint64(len(tokens)))
	pos := len(dst)
	dst = slices.Grow(dst, 5*len(tokens)+8)
	buf := dst[:cap(dst)]
	for _, t := range tokens {
		f := cborUintForms[bits.Len32(t)]
		if t-16 < 8 { // 16..23 have bit length 5 but still fit in the head byte
			f = cborUintForms[0]
		}
		w := uint64(f.head) | uint64(bits.ReverseBytes32(t)>>f.swapShift)<<f.headShift
		binary.LittleEndian.PutUint64(buf[pos:pos+8], w)
		pos += int(f.size)
	}
	return dst[:pos]
}

// appendBlockCBOR appends canonical CBOR of (parent, tuple(tokens), extra_keys), where
// extra_keys is null when lora and salt are both empty, else the array of the non-empty
// ones in vLLM's order (LoRA name first, cache salt second).
func appendBlockCBOR(dst, parent []byte, tokens []uint32, lora, salt string) []byte {
	dst = append(dst, cborMajorArray<<5|3)
	dst = appendCBORHead(dst, cborMajorBytes, uint64(len(parent)))
	dst = append(dst, parent...)
	dst = appendCBORTokens(dst, tokens)
	return appendCBORExtras(dst, lora, salt)
}

func appendCBORExtras(dst []byte, lora, salt string) []byte {
	n := 0
	if lora != "" {
		n++
	}
	if salt != "" {
		n++
	}
	if n == 0 {
		return append(dst, cborNull)
	}
	dst = append(dst, cborMajorArray<<5|byte(n))
	if lora != "" {
		dst = appendCBORText(dst, lora)
	}
	if salt != "" {
		dst = appendCBORText(dst, salt)
	}
	return dst
}
