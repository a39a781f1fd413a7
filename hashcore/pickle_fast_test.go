package hashcore

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// The fast block layout must equal the general pickler byte for byte (the general one
// is pinned to Python's pickle by the goldens).
func TestFastPickleMatchesGeneral(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	extras := [][2]string{{"", ""}, {"lora", ""}, {"", "salt"}, {"lora", "salt"}, {"a", "a"}, {"é", "é"}, {"same", "same"}, {string(make([]byte, 300)), "s"}}
	for iter := 0; iter < 3000; iter++ {
		n := 1 + rng.IntN(40)
		if iter%100 == 0 {
			n = 1 + rng.IntN(9000)
		}
		toks := make([]uint32, n)
		for i := range toks {
			toks[i] = rng.Uint32() >> rng.IntN(32)
		}
		var d Digest
		d.N = []uint8{16, 32}[rng.IntN(2)]
		for i := range d.B[:d.N] {
			d.B[i] = byte(rng.Uint32())
		}
		ex := extras[rng.IntN(len(extras))]
		suffix := appendPickleSuffix(nil, n, ex[0], ex[1])
		if !pickleFits(int(d.N), n, len(suffix)) {
			continue
		}
		var p pickler
		want := appendBlockPickle(&p, nil, d.Bytes(), toks, ex[0], ex[1])
		got := encodeBlockPickle(make([]byte, 0, pickleMaxLen(int(d.N), n, len(suffix))), &d, toks, suffix)
		if !bytes.Equal(got, want) {
			t.Fatalf("n=%d parent=%d extras=%q:\n got %x\nwant %x", n, d.N, ex, got, want)
		}
	}
}
