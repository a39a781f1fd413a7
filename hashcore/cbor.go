package hashcore

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

// appendCBORTokens appends the token tuple as an array of unsigned ints. The loop is
// the hot part of the sha256_cbor contract, so the common widths are inlined.
func appendCBORTokens(dst []byte, tokens []uint32) []byte {
	dst = appendCBORHead(dst, cborMajorArray, uint64(len(tokens)))
	for _, t := range tokens {
		switch {
		case t < 24:
			dst = append(dst, byte(t))
		case t <= 0xff:
			dst = append(dst, 24, byte(t))
		case t <= 0xffff:
			dst = append(dst, 25, byte(t>>8), byte(t))
		default:
			dst = append(dst, 26, byte(t>>24), byte(t>>16), byte(t>>8), byte(t))
		}
	}
	return dst
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
