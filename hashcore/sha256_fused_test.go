package hashcore

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"runtime"
	"slices"
	"testing"

	"github.com/klauspost/cpuid/v2"
)

// TestSHA256FusedSelected: on amd64 CPUs with SHA-NI and the AVX-512 token encoders
// plus AVX-512 VL the AVX-512 fused loops must be on, and on every amd64 CPU with SHA-NI
// the scalar ones (unless built with -tags purego).
func TestSHA256FusedSelected(t *testing.T) {
	shaNI := runtime.GOARCH == "amd64" && !puregoBuild && cpuid.CPU.Supports(cpuid.SHA, cpuid.SSSE3, cpuid.SSE4)
	want := shaNI && cpuid.CPU.Supports(cpuid.AVX512F, cpuid.AVX512BW, cpuid.AVX512VBMI2, cpuid.AVX512VL, cpuid.POPCNT)
	if haveSHA256Fused != want || useSHA256Fused != want {
		t.Fatalf("haveSHA256Fused = %v, useSHA256Fused = %v, want %v (cpu %s)", haveSHA256Fused, useSHA256Fused, want, CPUFeatures())
	}
	if haveSHA256FusedScalar != shaNI || useSHA256FusedScalar != shaNI {
		t.Fatalf("haveSHA256FusedScalar = %v, useSHA256FusedScalar = %v, want %v (cpu %s)", haveSHA256FusedScalar, useSHA256FusedScalar, shaNI, CPUFeatures())
	}
}

// sha256ChainPath is one of the SHA-256 chain paths besides the portable one: the
// fused AVX-512 loop (where it applies, else the pipelined Go loop), the scalar fused
// loop (where it applies, else the pipelined Go loop), or the pipelined Go loop alone.
type sha256ChainPath struct {
	name           string
	avx512, scalar bool // useSHA256Fused, useSHA256FusedScalar
}

// sha256ChainPaths lists the paths this CPU and build can take besides the portable one.
func sha256ChainPaths() []sha256ChainPath {
	var paths []sha256ChainPath
	if haveSHA256Fused {
		paths = append(paths, sha256ChainPath{"fused-avx512", true, false})
	}
	if haveSHA256FusedScalar {
		paths = append(paths, sha256ChainPath{"fused-scalar", false, true})
	}
	if haveSHA256Blocks {
		paths = append(paths, sha256ChainPath{"pipelined", false, false})
	}
	return paths
}

// withChainPath runs f on path p.
func withChainPath(p sha256ChainPath, f func()) {
	oldAVX512, oldScalar := useSHA256Fused, useSHA256FusedScalar
	useSHA256Fused, useSHA256FusedScalar = p.avx512, p.scalar
	defer func() { useSHA256Fused, useSHA256FusedScalar = oldAVX512, oldScalar }()
	f()
}

// edgeTokens returns n tokens that cycle, at a stride prime to every block size tested,
// through the values at each edge of the CBOR and pickle int forms: CBOR's head byte
// (< 24, 16..23 sharing a bit length with 24..31), 1, 2 and 4 argument bytes, pickle's
// BININT1, BININT2, BININT and LONG1.
func edgeTokens(n int) []uint32 {
	edges := []uint32{0, 1, 15, 16, 17, 23, 24, 25, 31, 32, 127, 128, 255, 256, 257, 65535, 65536, 65537,
		1<<24 - 1, 1 << 24, 1<<31 - 1, 1 << 31, 1<<31 + 1, 1<<32 - 1}
	t := make([]uint32, n)
	for i := range t {
		t[i] = edges[i*7%len(edges)]
	}
	return t
}

// TestSHA256ChainsMatchPortablePath: the SHA-256 chains give the same keys and final
// digest on each of this CPU's paths (sha256ChainPaths) as on the portable path
// (crypto/sha256, one token at a time), for block sizes 1..40, prompts of 0 to 3 blocks
// with and without a tail, of sha256Run+1 and 2*sha256Run blocks and of 8192 tokens,
// every extras shape (none, LoRA, cache salt, both, extras of 17..32 bytes, too long for the fused
// writers), parents of 32 bytes (the root, another digest) and 16 bytes (an
// XXH3-chained parent), first block or not; over tokens of every width, tokens at every
// edge of the int forms, and tokens all < 24 (messages with more tokens than the fused
// loops' steps among the rounds, which write the rest after them).
func TestSHA256ChainsMatchPortablePath(t *testing.T) {
	paths := sha256ChainPaths()
	if len(paths) == 0 {
		t.Logf("no fast path on this build (%s): nothing to compare", SHA256Path())
		return
	}
	small := make([]uint32, 8192)
	for i := range small {
		small[i] = uint32(i*5) % 24
	}
	prompts := []struct {
		name string
		toks []uint32
	}{{"every width", testTokens(8192)}, {"form edges", edgeTokens(8192)}, {"all < 24", small}}
	long := "lora-" + string(bytes.Repeat([]byte("x"), 80)) // extras past 64 bytes
	exs := []*Extras{nil, {LoRAName: "lora"}, {CacheSalt: "tenant-7"}, {LoRAName: "sql-adapter", CacheSalt: "s"}, {LoRAName: "a-lora-of-27-bytes-and-more"}, {LoRAName: long}, {LoRAName: "a", CacheSalt: long}}
	var p32, p16 Digest
	p32.N, p16.N = 32, 16
	for i := range p32.B {
		p32.B[i] = byte(7*i + 1)
	}
	copy(p16.B[:16], p32.B[5:])
	for bs := 1; bs <= 40; bs++ {
		// sha256Run+1 and 2*sha256Run blocks: the pipelined loop's runs of messages, a
		// partial one after a full one and two full ones.
		lens := []int{0, bs - 1, bs, bs + 1, 2 * bs, 2*bs + bs/2 + 1, 3 * bs, 3*bs + 1, (sha256Run+1)*bs + 1, 2 * sha256Run * bs, 8192}
		for _, algo := range []string{"sha256_cbor", "sha256", "sglang"} {
			s := Spec{Engine: "vllm", Algo: algo, BlockSize: bs}
			if algo == "sglang" {
				s = Spec{Engine: "sglang", BlockSize: bs}
			}
			c, err := New(s)
			if err != nil {
				t.Fatal(err)
			}
			for _, prompt := range prompts {
				for _, n := range lens {
					for ei, ex := range exs {
						for pi, parent := range []Digest{{}, p32, p16} {
							for _, first := range []bool{true, false} {
								if (n == 8192 || prompt.name != "every width") && (pi > 0 || !first) {
									continue // the long prompt and the other tokens once per extras shape
								}
								toks := prompt.toks[:n]
								var portKeys []uint64
								var portD Digest
								withPortablePath(t, func() { portKeys, portD = c.AppendKeys([]uint64{42}, parent, toks, ex, first) })
								if len(portKeys) != 1+n/bs {
									t.Fatalf("%s bs=%d tokens=%d: %d keys, want %d", c.Name(), bs, n, len(portKeys)-1, n/bs)
								}
								for _, path := range paths {
									var keys []uint64
									var d Digest
									withChainPath(path, func() { keys, d = c.AppendKeys([]uint64{42}, parent, toks, ex, first) })
									if !slices.Equal(keys, portKeys) || d != portD {
										t.Fatalf("%s bs=%d %s tokens=%d extras#%d parent#%d first=%v path %s: keys/digest differ from the portable path\nfast %x %s\nport %x %s",
											c.Name(), bs, prompt.name, n, ei, pi, first, path.name, keys, fmt.Sprintf("%x", d.Bytes()), portKeys, fmt.Sprintf("%x", portD.Bytes()))
									}
								}
							}
						}
					}
				}
			}
		}
	}
}

// FuzzSHA256ChainsFused compares the SHA-256 chains on each of this CPU's paths with
// the portable path over fuzzed tokens (any uint32), block sizes, extras and parents.
func FuzzSHA256ChainsFused(f *testing.F) {
	f.Add([]byte("\x00\x01\x02\x03\xff\xff\xff\xff\x17\x00\x00\x00\x18\x00\x00\x00"), uint8(4), "", "", false)
	f.Add(bytes.Repeat([]byte{0xff, 0x00, 0x01, 0x80}, 200), uint8(16), "lora", "salt", true)
	// Tokens at every edge of the int forms over many blocks, extras of 17..32 bytes.
	edges := binary.LittleEndian.AppendUint32(nil, 0)
	for _, t := range edgeTokens(300) {
		edges = binary.LittleEndian.AppendUint32(edges, t)
	}
	f.Add(edges, uint8(5), "a-lora-of-27-bytes-and-more", "salt", false)
	f.Add(edges, uint8(16), "", "", true)
	// Blocks of one-byte CBOR ints, more than the fused loops write among the rounds.
	f.Add(make([]byte, 4*200), uint8(40), "", "", false)
	f.Fuzz(func(t *testing.T, raw []byte, bs uint8, lora, salt string, parent16 bool) {
		if bs == 0 || bs > 64 {
			return
		}
		toks := make([]uint32, len(raw)/4)
		for i := range toks {
			toks[i] = uint32(raw[4*i]) | uint32(raw[4*i+1])<<8 | uint32(raw[4*i+2])<<16 | uint32(raw[4*i+3])<<24
		}
		ex := &Extras{LoRAName: lora, CacheSalt: salt}
		if ValidateExtras(ex) != nil {
			return
		}
		var parent Digest
		if parent16 {
			parent.N = 16
			copy(parent.B[:], raw)
		}
		for _, s := range []Spec{
			{Engine: "vllm", Algo: "sha256_cbor", BlockSize: int(bs)},
			{Engine: "vllm", Algo: "sha256", BlockSize: int(bs)},
			{Engine: "sglang", BlockSize: int(bs)},
		} {
			c, err := New(s)
			if err != nil {
				t.Fatal(err)
			}
			var portKeys []uint64
			var portD Digest
			withPortablePath(t, func() { portKeys, portD = c.AppendKeys(nil, parent, toks, ex, true) })
			for _, path := range sha256ChainPaths() {
				var keys []uint64
				var d Digest
				withChainPath(path, func() { keys, d = c.AppendKeys(nil, parent, toks, ex, true) })
				if !slices.Equal(keys, portKeys) || d != portD {
					t.Fatalf("%s bs=%d tokens=%d path %s: keys/digest differ from the portable path", c.Name(), bs, len(toks), path.name)
				}
			}
		}
	})
}

// TestSHA256ChainPipelinedBigBlocks: blocks too big for sha256Run messages in
// sha256RunBytes (the pipelined loop then writes fewer a run) hash as on the portable
// path, and the scratch that wrote them stays small enough to be pooled.
func TestSHA256ChainPipelinedBigBlocks(t *testing.T) {
	if !haveSHA256Blocks {
		t.Skipf("no SHA-NI block function here (%s)", SHA256Path())
	}
	toks := testTokens(3 * 5000)
	for _, bs := range []int{200, 1000, 5000} {
		c, err := New(Spec{Engine: "vllm", Algo: "sha256_cbor", BlockSize: bs})
		if err != nil {
			t.Fatal(err)
		}
		var port []uint64
		withPortablePath(t, func() { port, _ = c.AppendKeys(nil, Digest{}, toks[:3*bs], &Extras{CacheSalt: "s"}, true) })
		for range scratchSlots { // empty the pool: the call below gets a fresh scratch
			getScratch()
		}
		var keys []uint64
		withChainPath(sha256ChainPath{name: "pipelined"}, func() {
			keys, _ = c.AppendKeys(nil, Digest{}, toks[:3*bs], &Extras{CacheSalt: "s"}, true)
		})
		sc := getScratch()
		if !slices.Equal(keys, port) {
			t.Fatalf("bs=%d: pipelined keys %x, portable %x", bs, keys, port)
		}
		// One message (<= 5 bytes a token) when a run would pass sha256RunBytes, plus the
		// allocator's rounding.
		if limit := max(sha256RunBytes, 5*bs+200) * 5 / 4; cap(sc.batch) > limit {
			t.Fatalf("bs=%d: pooled scratch holds a %d-byte message run", bs, cap(sc.batch))
		}
		putScratch(sc)
	}
}
