package hashcore

import (
	"bytes"
	"crypto/sha256"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"

	"github.com/klauspost/cpuid/v2"
)

// crypto/sha256 is an independent implementation (Go's, tested against the NIST
// vectors), so it is the oracle for kvgate's in-place padding and block function.

// withSHA256Blocks runs f with the fast path switched on or off. Tests in this package
// do not run in parallel, so flipping the package variable is safe.
func withSHA256Blocks(t *testing.T, on bool, f func()) {
	t.Helper()
	if on && !haveSHA256Blocks {
		t.Fatal("withSHA256Blocks(true) on a build without the block function")
	}
	old := useSHA256Blocks
	useSHA256Blocks = on
	defer func() { useSHA256Blocks = old }()
	f()
}

// TestSHA256PathSelected: on amd64 CPUs with SHA-NI the fast path must be on (unless
// built with -tags purego, which the block-function files exclude).
func TestSHA256PathSelected(t *testing.T) {
	want := runtime.GOARCH == "amd64" && cpuid.CPU.Supports(cpuid.SHA, cpuid.SSSE3, cpuid.SSE4) && !puregoBuild
	if haveSHA256Blocks != want {
		t.Fatalf("haveSHA256Blocks = %v, want %v (GOARCH %s, cpu %s)", haveSHA256Blocks, want, runtime.GOARCH, CPUFeatures())
	}
	if useSHA256Blocks != haveSHA256Blocks {
		t.Fatalf("useSHA256Blocks = %v at start, want %v", useSHA256Blocks, haveSHA256Blocks)
	}
	t.Logf("SHA-256 path: %s", SHA256Path())
}

// TestSHA256SumMatchesStdlib hashes every length 0..1100 of random bytes, in a buffer
// whose spare capacity holds garbage (as a reused scratch buffer does), and compares
// with crypto/sha256; both paths, with and without padding slack.
func TestSHA256SumMatchesStdlib(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	paths := []bool{false}
	if haveSHA256Blocks {
		paths = append(paths, true)
	}
	for _, fast := range paths {
		withSHA256Blocks(t, fast, func() {
			buf := make([]byte, 0, 1100+sha256PadSlack)
			for n := 0; n <= 1100; n++ {
				for _, slack := range []int{sha256PadSlack, sha256PadSlack - 1, 0} {
					full := buf[:n+slack]
					for i := range full {
						full[i] = byte(rng.Uint32())
					}
					msg := full[: n : n+slack]
					want := sha256.Sum256(msg)
					var got [32]byte
					sha256Sum(&got, msg)
					if got != want {
						t.Fatalf("fast=%v len %d slack %d: %x, want %x", fast, n, slack, got, want)
					}
				}
			}
		})
	}
}

// fipsIV is SHA-256's initial hash value H(0), FIPS 180-4 section 5.3.3.
var fipsIV = [8]uint32{0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19}

// TestSHA256BlocksMultiBlock runs the block functions over many blocks in one call, the
// way crypto/sha256 does for a long message, padded by hand.
func TestSHA256BlocksMultiBlock(t *testing.T) {
	if !haveSHA256Blocks {
		t.Logf("no block function on this build (%s): crypto/sha256 path only", SHA256Path())
		return
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for _, n := range []int{0, 55, 56, 63, 64, 119, 120, 4096, 65536 + 17} {
		msg := make([]byte, n, n+sha256PadSlack)
		for i := range msg {
			msg[i] = byte(rng.Uint32())
		}
		want := sha256.Sum256(msg)
		h := fipsIV
		total := (n + 9 + 63) &^ 63
		p := make([]byte, total+17) // 17 bytes past the last block, to be ignored
		copy(p, msg)
		for i := total; i < len(p); i++ {
			p[i] = 0xa5
		}
		p[n] = 0x80
		clear(p[n+1 : total-8])
		for i := 0; i < 8; i++ {
			p[total-1-i] = byte(uint64(n) << 3 >> (8 * i))
		}
		sha256Blocks(&h, p)
		var got [32]byte
		for i, v := range h {
			got[4*i], got[4*i+1], got[4*i+2], got[4*i+3] = byte(v>>24), byte(v>>16), byte(v>>8), byte(v)
		}
		if got != want {
			t.Errorf("sha256Blocks len %d: %x, want %x", n, got, want)
		}
		var dig [32]byte
		sha256Digest(&dig, p)
		if dig != want {
			t.Errorf("sha256Digest len %d: %x, want %x", n, dig, want)
		}
	}
	// An empty or shorter-than-a-block input leaves the state alone.
	h := fipsIV
	sha256Blocks(&h, nil)
	sha256Blocks(&h, make([]byte, 63))
	if h != fipsIV {
		t.Errorf("state changed by no whole block: %x", h)
	}
}

// TestSHA256ChainAtMatchesStdlib: the chain block functions hash a padded message with
// a parent digest spliced in at 0, 3 or 13 from d (whatever p holds there), and store
// the digest in d.
func TestSHA256ChainAtMatchesStdlib(t *testing.T) {
	if !haveSHA256Blocks {
		t.Logf("no block function on this build (%s): crypto/sha256 path only", SHA256Path())
		return
	}
	rng := rand.New(rand.NewPCG(5, 6))
	funcs := []struct {
		at int
		f  func(*[32]byte, []byte)
	}{{0, sha256ChainAt0}, {3, sha256ChainAt3}, {13, sha256ChainAt13}}
	for _, fn := range funcs {
		for n := fn.at + 32; n <= 300; n++ {
			buf := make([]byte, n+sha256PadSlack)
			for i := range buf {
				buf[i] = byte(rng.Uint32())
			}
			var parent [32]byte
			for i := range parent {
				parent[i] = byte(rng.Uint32())
			}
			msg := slices.Clone(buf[:n])
			copy(msg[fn.at:], parent[:])
			want := sha256.Sum256(msg)
			d := parent
			fn.f(&d, sha256Pad(buf[:n], n))
			if d != want {
				t.Fatalf("at %d len %d: %x, want %x", fn.at, n, d, want)
			}
		}
	}
}

// TestChainsMatchStdlibPath: every SHA-256 chain gives the same keys and digests on the
// fast path as on the crypto/sha256 path, over block sizes that put the message length
// on every side of a 64-byte boundary, with and without extras.
func TestChainsMatchStdlibPath(t *testing.T) {
	if !haveSHA256Blocks {
		t.Logf("no block function on this build (%s): nothing to compare", SHA256Path())
		return
	}
	toks := testTokens(3000)
	exs := []*Extras{nil, {LoRAName: "lora"}, {LoRAName: "a-long-lora-name-to-push-the-message", CacheSalt: "tenant"}}
	for bs := 1; bs <= 40; bs++ {
		for _, s := range []Spec{
			{Engine: "vllm", Algo: "sha256", BlockSize: bs},
			{Engine: "vllm", Algo: "sha256_cbor", BlockSize: bs},
			{Engine: "sglang", BlockSize: bs},
		} {
			c, err := New(s)
			if err != nil {
				t.Fatal(err)
			}
			for _, ex := range exs {
				var fastKeys, slowKeys []uint64
				var fastD, slowD Digest
				withSHA256Blocks(t, true, func() { fastKeys, fastD = c.AppendKeys(nil, c.Root(), toks[:bs*37], ex, true) })
				withSHA256Blocks(t, false, func() { slowKeys, slowD = c.AppendKeys(nil, c.Root(), toks[:bs*37], ex, true) })
				if !slices.Equal(fastKeys, slowKeys) || !bytes.Equal(fastD.Bytes(), slowD.Bytes()) {
					t.Fatalf("%s bs=%d ex=%+v: fast path keys/digest differ from crypto/sha256", c.Name(), bs, ex)
				}
			}
		}
	}
}

// withPortablePath runs f on the path CPUs without SHA-NI or AVX-512 take:
// crypto/sha256 and one-token-at-a-time encoding.
func withPortablePath(t *testing.T, f func()) {
	t.Helper()
	old, oldFused, oldScalar := useTokensAVX512, useSHA256Fused, useSHA256FusedScalar
	useTokensAVX512, useSHA256Fused, useSHA256FusedScalar = false, false, false
	defer func() { useTokensAVX512, useSHA256Fused, useSHA256FusedScalar = old, oldFused, oldScalar }()
	withSHA256Blocks(t, false, f)
}

// The Python-oracle goldens again, on the portable path (the plain test names run them
// on whatever path this CPU selects).
func TestVLLMGoldensPortablePath(t *testing.T) {
	withPortablePath(t, func() { TestVLLMGoldens(t) })
}

func TestSGLangGoldensPortablePath(t *testing.T) {
	withPortablePath(t, func() { TestSGLangGoldens(t) })
}
