package hashcore

import (
	"bytes"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/klauspost/cpuid/v2"
)

// TestTokensAVX512Selected: the vector encoders are on wherever the CPU has them
// (except -tags purego builds).
func TestTokensAVX512Selected(t *testing.T) {
	want := runtime.GOARCH == "amd64" && !puregoBuild &&
		cpuid.CPU.Supports(cpuid.AVX512F, cpuid.AVX512BW, cpuid.AVX512VBMI2, cpuid.POPCNT)
	if haveTokensAVX512 != want || useTokensAVX512 != want {
		t.Fatalf("haveTokensAVX512 %v, useTokensAVX512 %v, want %v (cpu %s)", haveTokensAVX512, useTokensAVX512, want, CPUFeatures())
	}
}

// randomTokens draws token ids of every encoded width, with the form boundaries
// (CBOR 23/24, 255/256, 65535/65536; pickle also 1<<31) often.
func randomTokens(rng *rand.Rand, n int) []uint32 {
	edges := []uint32{0, 1, 15, 16, 23, 24, 25, 255, 256, 257, 65535, 65536, 65537, 1<<31 - 1, 1 << 31, 1<<32 - 1}
	t := make([]uint32, n)
	for i := range t {
		if rng.IntN(4) == 0 {
			t[i] = edges[rng.IntN(len(edges))]
		} else {
			t[i] = rng.Uint32() >> rng.IntN(33)
		}
	}
	return t
}

// encodeBoth encodes with the vector encoders and with the one-token path, each into a
// buffer of exactly the given capacity, whose bytes, and the canary bytes after its capacity, start as garbage: the outputs
// must match and nothing past the capacity may change.
func encodeBoth(t *testing.T, rng *rand.Rand, capacity int, enc func(buf []byte) []byte) (vec, one []byte) {
	t.Helper()
	run := func(avx bool) []byte {
		old := useTokensAVX512
		useTokensAVX512 = avx
		defer func() { useTokensAVX512 = old }()
		backing := make([]byte, capacity+128)
		for i := range backing {
			backing[i] = byte(rng.Uint32())
		}
		canary := bytes.Clone(backing[capacity:])
		out := bytes.Clone(enc(backing[:0:capacity]))
		if !bytes.Equal(backing[capacity:], canary) {
			t.Fatalf("avx512=%v: encoder wrote past the buffer's capacity %d", avx, capacity)
		}
		return out
	}
	return run(true), run(false)
}

func TestTokensAVX512MatchOneAtATime(t *testing.T) {
	if !haveTokensAVX512 {
		t.Logf("no AVX-512 token encoders on this build (cpu %s): one-token path only", CPUFeatures())
		return
	}
	rng := rand.New(rand.NewPCG(7, 8))
	extras := [][2]string{{"", ""}, {"lora", ""}, {"lora", "salt"}}
	for iter := 0; iter < 4000; iter++ {
		n := 1 + rng.IntN(70)
		if iter%200 == 0 {
			n = 1 + rng.IntN(5000)
		}
		toks := randomTokens(rng, n)
		var d Digest
		d.N = []uint8{16, 32}[rng.IntN(2)]
		for i := range d.B[:d.N] {
			d.B[i] = byte(rng.Uint32())
		}
		ex := extras[rng.IntN(len(extras))]
		slack := []int{0, sha256PadSlack}[rng.IntN(2)] // the encoders' own bound, or the chains'

		e := newCBORBlockEncoder(n)
		cx := appendCBORExtras(nil, ex[0], ex[1])
		vec, one := encodeBoth(t, rng, e.maxLen(n, len(cx))+slack, func(buf []byte) []byte {
			return e.encode(buf, &d, toks, cx)
		})
		if !bytes.Equal(vec, one) {
			t.Fatalf("CBOR n=%d parent=%d: vector\n %x\none-at-a-time\n %x", n, d.N, vec, one)
		}

		px := appendPickleSuffix(nil, n, ex[0], ex[1])
		if !pickleFits(int(d.N), n, len(px)) {
			continue
		}
		vec, one = encodeBoth(t, rng, pickleMaxLen(int(d.N), n, len(px))+slack, func(buf []byte) []byte {
			return encodeBlockPickle(buf, &d, toks, px)
		})
		if !bytes.Equal(vec, one) {
			t.Fatalf("pickle n=%d parent=%d: vector\n %x\none-at-a-time\n %x", n, d.N, vec, one)
		}
	}
}
