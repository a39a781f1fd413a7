package hashcore

import (
	"bytes"
	"fmt"
	"runtime"
	"slices"
	"testing"

	"github.com/klauspost/cpuid/v2"
)

// TestSHA256FusedSelected: on amd64 CPUs with SHA-NI and the AVX-512 token encoders
// plus AVX-512 VL the fused loops must be on (unless built with -tags purego).
func TestSHA256FusedSelected(t *testing.T) {
	want := runtime.GOARCH == "amd64" && !puregoBuild &&
		cpuid.CPU.Supports(cpuid.SHA, cpuid.SSSE3, cpuid.SSE4, cpuid.AVX512F, cpuid.AVX512BW, cpuid.AVX512VBMI2, cpuid.AVX512VL, cpuid.POPCNT)
	if haveSHA256Fused != want || useSHA256Fused != want {
		t.Fatalf("haveSHA256Fused = %v, useSHA256Fused = %v, want %v (cpu %s)", haveSHA256Fused, useSHA256Fused, want, CPUFeatures())
	}
}

// TestSHA256ChainsMatchPortablePath: the SHA-256 chains give the same keys and final
// digest on this CPU's paths (kvgate's block function, fused with the AVX-512 message
// writer or pipelined in Go) as on the portable path (crypto/sha256, one token at a
// time), for block sizes 1..40, prompts of 0 to 3 blocks with and without a tail, of
// sha256Run+1 and 2*sha256Run blocks and of 8192 tokens, every extras shape (none,
// LoRA, cache salt, both, extras too long for the fused writer), parents of 32 bytes (the root, another digest) and 16 bytes
// (an XXH3-chained parent), first block or not.
func TestSHA256ChainsMatchPortablePath(t *testing.T) {
	if !haveSHA256Blocks && !haveTokensAVX512 {
		t.Logf("no fast path on this build (%s): nothing to compare", SHA256Path())
		return
	}
	toks := testTokens(8192)
	long := "lora-" + string(bytes.Repeat([]byte("x"), 80)) // extras past 64 bytes
	exs := []*Extras{nil, {LoRAName: "lora"}, {CacheSalt: "tenant-7"}, {LoRAName: "sql-adapter", CacheSalt: "s"}, {LoRAName: long}, {LoRAName: "a", CacheSalt: long}}
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
			for _, n := range lens {
				for ei, ex := range exs {
					for pi, parent := range []Digest{{}, p32, p16} {
						for _, first := range []bool{true, false} {
							if n == 8192 && (pi > 0 || !first) {
								continue // the long prompt once per extras shape
							}
							var portKeys []uint64
							var portD Digest
							withPortablePath(t, func() { portKeys, portD = c.AppendKeys([]uint64{42}, parent, toks[:n], ex, first) })
							if len(portKeys) != 1+n/bs {
								t.Fatalf("%s bs=%d tokens=%d: %d keys, want %d", c.Name(), bs, n, len(portKeys)-1, n/bs)
							}
							for _, fused := range []bool{true, false} {
								if fused && !haveSHA256Fused {
									continue
								}
								useSHA256Fused = fused
								keys, d := c.AppendKeys([]uint64{42}, parent, toks[:n], ex, first)
								useSHA256Fused = haveSHA256Fused
								if !slices.Equal(keys, portKeys) || d != portD {
									t.Fatalf("%s bs=%d tokens=%d extras#%d parent#%d first=%v fused=%v: keys/digest differ from the portable path\nfast %x %s\nport %x %s",
										c.Name(), bs, n, ei, pi, first, fused, keys, fmt.Sprintf("%x", d.Bytes()), portKeys, fmt.Sprintf("%x", portD.Bytes()))
								}
							}
						}
					}
				}
			}
		}
	}
}

// FuzzSHA256ChainsFused compares the SHA-256 chains on this CPU's path with the
// portable path over fuzzed tokens (any uint32), block sizes, extras and parents.
func FuzzSHA256ChainsFused(f *testing.F) {
	f.Add([]byte("\x00\x01\x02\x03\xff\xff\xff\xff\x17\x00\x00\x00\x18\x00\x00\x00"), uint8(4), "", "", false)
	f.Add(bytes.Repeat([]byte{0xff, 0x00, 0x01, 0x80}, 200), uint8(16), "lora", "salt", true)
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
			keys, d := c.AppendKeys(nil, parent, toks, ex, true)
			var portKeys []uint64
			var portD Digest
			withPortablePath(t, func() { portKeys, portD = c.AppendKeys(nil, parent, toks, ex, true) })
			if !slices.Equal(keys, portKeys) || d != portD {
				t.Fatalf("%s bs=%d tokens=%d: keys/digest differ from the portable path", c.Name(), bs, len(toks))
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
		old := useSHA256Fused
		useSHA256Fused = false
		for range scratchSlots { // empty the pool: the call below gets a fresh scratch
			getScratch()
		}
		keys, _ := c.AppendKeys(nil, Digest{}, toks[:3*bs], &Extras{CacheSalt: "s"}, true)
		sc := getScratch()
		useSHA256Fused = old
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
