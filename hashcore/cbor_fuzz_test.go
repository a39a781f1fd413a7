package hashcore

import (
	"bytes"
	"encoding/binary"
	"testing"
	"unicode/utf8"

	"github.com/fxamacker/cbor/v2"
)

// canonicalCBOR is fxamacker/cbor in RFC 8949 core deterministic mode: the independent
// encoder the hand-written one must match byte for byte.
var canonicalCBOR = func() cbor.EncMode {
	em, err := cbor.CoreDetEncOptions().EncMode()
	if err != nil {
		panic(err)
	}
	return em
}()

func referenceBlockCBOR(t *testing.T, parent []byte, tokens []uint32, lora, salt string) []byte {
	toks := make([]uint64, len(tokens))
	for i, v := range tokens {
		toks[i] = uint64(v)
	}
	var extras any // nil encodes as CBOR null
	var ek []string
	if lora != "" {
		ek = append(ek, lora)
	}
	if salt != "" {
		ek = append(ek, salt)
	}
	if ek != nil {
		extras = ek
	}
	b, err := canonicalCBOR.Marshal([]any{parent, toks, extras})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func FuzzBlockCBOR(f *testing.F) {
	f.Add([]byte{1, 2, 3}, []byte{1, 0, 0, 0, 2, 0, 0, 0, 255, 255, 255, 255}, "", "", uint64(0))
	f.Add(bytes.Repeat([]byte{9}, 32), []byte{23, 0, 0, 0, 24, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0}, "my-lora", "salt", uint64(1<<40))
	f.Add(bytes.Repeat([]byte{7}, 16), bytes.Repeat([]byte{0xff, 0, 1, 0}, 70), "中文", "", uint64(255))
	f.Add(bytes.Repeat([]byte{8}, 32), []byte{16, 0, 0, 0, 23, 0, 0, 0, 24, 0, 0, 0, 15, 0, 0, 0}, "", "s", uint64(23))
	f.Fuzz(func(t *testing.T, parent, raw []byte, lora, salt string, n uint64) {
		if !utf8.ValidString(lora) || !utf8.ValidString(salt) {
			return // refused by ValidateExtras before encoding
		}
		tokens := make([]uint32, len(raw)/4)
		for i := range tokens {
			tokens[i] = binary.LittleEndian.Uint32(raw[4*i:])
		}
		got := appendBlockCBOR(nil, parent, tokens, lora, salt)
		if want := referenceBlockCBOR(t, parent, tokens, lora, salt); !bytes.Equal(got, want) {
			t.Fatalf("block CBOR differs\n got %x\nwant %x", got, want)
		}
		// The hot-path encoder writes the same bytes.
		if len(parent) <= 32 {
			d := Digest{N: uint8(len(parent))}
			copy(d.B[:], parent)
			e := newCBORBlockEncoder(len(tokens))
			ex := appendCBORExtras(nil, lora, salt)
			// The encoder's own bound, and the chains' buffer with padding slack (room
			// for the AVX-512 token encoder's 64-byte stores, where present).
			for _, slack := range []int{0, sha256PadSlack} {
				buf := make([]byte, 0, e.maxLen(len(tokens), len(ex))+slack)
				if fast := e.encode(buf, &d, tokens, ex); !bytes.Equal(fast, got) {
					t.Fatalf("fast block CBOR (slack %d) differs\n got %x\nwant %x", slack, fast, got)
				}
			}
		}
		// Heads of every width, and the NONE_HASH seed text.
		want, err := canonicalCBOR.Marshal(n)
		if err != nil {
			t.Fatal(err)
		}
		if got := appendCBORHead(nil, cborMajorUint, n); !bytes.Equal(got, want) {
			t.Fatalf("uint %d: got %x want %x", n, got, want)
		}
		want, err = canonicalCBOR.Marshal(lora)
		if err != nil {
			t.Fatal(err)
		}
		if got := appendCBORText(nil, lora); !bytes.Equal(got, want) {
			t.Fatalf("text: got %x want %x", got, want)
		}
	})
}
