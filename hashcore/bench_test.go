package hashcore

import (
	"crypto/sha256"
	"fmt"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/testfix"
)

// Run: go test -run '^$' -bench . -benchmem ./hashcore/
//
// Every benchmark here calls b.SetBytes(4 * tokens), the prompt's token bytes, so MB/s
// compares directly across contracts and with BenchmarkSHA256Raw, which hashes exactly
// the bytes the chain hashes (each block's encoded message, pre-encoded outside the
// timer). Targets: HashChain/sha256_cbor >= 90% of SHA256Raw/sha256_cbor MB/s; 0
// allocs/op; HashChain/fast >= 10x HashChain/sha256_cbor MB/s. The SHA-256 rows have a
// .../stdlib twin on the portable path, SHA256Raw a -padded row (kvgate's in-place
// padding and block function) next to crypto/sha256's.

const benchTokens, benchBlock = 8192, 16

var benchSpecs = []struct {
	name string
	spec Spec
}{
	{"sha256", Spec{Engine: "vllm", Algo: "sha256", BlockSize: benchBlock}},
	{"sha256_cbor", Spec{Engine: "vllm", Algo: "sha256_cbor", BlockSize: benchBlock}},
	{"xxhash", Spec{Engine: "vllm", Algo: "xxhash", BlockSize: benchBlock, Seed: "0", SeedSet: true}},
	{"xxhash_cbor", Spec{Engine: "vllm", Algo: "xxhash_cbor", BlockSize: benchBlock, Seed: "0", SeedSet: true}},
	{"sglang_sha256", Spec{Engine: "sglang", BlockSize: benchBlock}},
	{"fast", Spec{Engine: "kvgate", Algo: "fast", BlockSize: benchBlock}},
}

// benchPrompt is a realistic prompt: token ids of a 150k vocabulary.
func benchPrompt() []uint32 {
	t := testTokens(benchTokens)
	for i := range t {
		t[i] %= 151936
	}
	return t
}

func BenchmarkHashChain(b *testing.B) {
	toks := benchPrompt()
	for _, bs := range benchSpecs {
		c, err := New(bs.spec)
		if err != nil {
			b.Fatal(err)
		}
		run := func(b *testing.B) {
			dst := make([]uint64, 0, benchTokens/benchBlock)
			b.SetBytes(4 * benchTokens)
			b.ReportAllocs()
			clk := testfix.StartCPUClock()
			for b.Loop() {
				dst, _ = c.AppendKeys(dst[:0], Digest{}, toks, nil, true)
			}
			clk.Stop(b, b.N)
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(benchTokens/benchBlock), "ns/block")
		}
		name := fmt.Sprintf("%s/tokens=%d/block=%d", bs.name, benchTokens, benchBlock)
		b.Run(name, run)
		// The same chain on the portable path (crypto/sha256, one token at a time: the
		// path before kvgate's SHA-NI block function and AVX-512 token encoders, and
		// the one CPUs without them take): the ratio of the two rows is what they buy.
		// The Go loop that pipelines per-block calls of the block function, which the
		// fused assembly loops replace where they run: the ratio is what fusing buys.
		if (haveSHA256Fused || haveSHA256FusedScalar) && strings.Contains(bs.name, "sha256") {
			b.Run(name+"/pipelined", func(b *testing.B) {
				useSHA256Fused, useSHA256FusedScalar = false, false
				defer func() { useSHA256Fused, useSHA256FusedScalar = haveSHA256Fused, haveSHA256FusedScalar }()
				run(b)
			})
		}
		if (haveSHA256Blocks || haveTokensAVX512) && strings.Contains(bs.name, "sha256") {
			b.Run(name+"/stdlib", func(b *testing.B) {
				oldSHA, oldTok, oldFused := useSHA256Blocks, useTokensAVX512, useSHA256Fused
				useSHA256Blocks, useTokensAVX512, useSHA256Fused = false, false, false
				defer func() { useSHA256Blocks, useTokensAVX512, useSHA256Fused = oldSHA, oldTok, oldFused }()
				run(b)
			})
		}
	}
}

// encodedBlocks returns the messages the chain hashes, block by block.
func encodedBlocks(c *vllmChain, toks []uint32) (msgs [][]byte, total int) {
	d := c.Root()
	for i := 0; i+c.blockSize <= len(toks); i += c.blockSize {
		var m []byte
		if c.pickle {
			var p pickler
			m = appendBlockPickle(&p, nil, d.Bytes(), toks[i:i+c.blockSize], "", "")
		} else {
			m = appendBlockCBOR(nil, d.Bytes(), toks[i:i+c.blockSize], "", "")
		}
		d = c.digestOf(m)
		msgs = append(msgs, m)
		total += len(m)
	}
	return msgs, total
}

func BenchmarkSHA256Raw(b *testing.B) {
	toks := benchPrompt()
	for _, algo := range []string{"sha256_cbor", "sha256"} {
		c, err := New(Spec{Engine: "vllm", Algo: algo, BlockSize: benchBlock})
		if err != nil {
			b.Fatal(err)
		}
		msgs, total := encodedBlocks(c.(*vllmChain), toks)
		b.Run(fmt.Sprintf("%s/tokens=%d/block=%d", algo, benchTokens, benchBlock), func(b *testing.B) {
			b.SetBytes(4 * benchTokens)
			b.ReportAllocs()
			var sink byte
			clk := testfix.StartCPUClock()
			for b.Loop() {
				for _, m := range msgs {
					s := sha256.Sum256(m)
					sink ^= s[0]
				}
			}
			clk.Stop(b, b.N)
			_ = sink
			b.ReportMetric(float64(total)*float64(b.N)/b.Elapsed().Seconds()/1e6, "encoded-MB/s")
		})
		// The same messages through sha256Sum, each in a buffer with padding slack as the
		// chains hold it: kvgate's in-place padding and block function where available.
		padded := make([][]byte, len(msgs))
		for i, m := range msgs {
			padded[i] = append(make([]byte, 0, len(m)+sha256PadSlack), m...)
		}
		b.Run(fmt.Sprintf("%s-padded/tokens=%d/block=%d", algo, benchTokens, benchBlock), func(b *testing.B) {
			b.SetBytes(4 * benchTokens)
			b.ReportAllocs()
			var sink byte
			var s [32]byte
			clk := testfix.StartCPUClock()
			for b.Loop() {
				for _, m := range padded {
					sha256Sum(&s, m)
					sink ^= s[0]
				}
			}
			clk.Stop(b, b.N)
			_ = sink
			b.ReportMetric(float64(total)*float64(b.N)/b.Elapsed().Seconds()/1e6, "encoded-MB/s")
		})
		// The same messages padded in place, each compressed only once the previous
		// block's digest is known (the block function splices it in, as the chain does):
		// the serial floor of SHA-256 over a chain of these bytes, where the rows above
		// let consecutive messages overlap in the CPU. Needs kvgate's block function.
		if haveSHA256Blocks {
			serial := make([][]byte, len(msgs))
			for i, m := range msgs {
				serial[i] = sha256Pad(append(make([]byte, 0, len(m)+sha256PadSlack), m...), len(m))
			}
			pickle := c.(*vllmChain).pickle
			b.Run(fmt.Sprintf("%s-serial/tokens=%d/block=%d", algo, benchTokens, benchBlock), func(b *testing.B) {
				b.SetBytes(4 * benchTokens)
				b.ReportAllocs()
				var d [32]byte
				clk := testfix.StartCPUClock()
				for b.Loop() {
					d = c.Root().B
					for _, m := range serial {
						if pickle {
							sha256ChainAt13(&d, m)
						} else {
							sha256ChainAt3(&d, m)
						}
					}
				}
				clk.Stop(b, b.N)
				if want := sha256.Sum256(msgs[len(msgs)-1]); d != want {
					b.Fatalf("serial digest %x, want %x", d, want)
				}
				b.ReportMetric(float64(total)*float64(b.N)/b.Elapsed().Seconds()/1e6, "encoded-MB/s")
			})
		}
		// One SHA-256 over all encoded bytes at once: the no-per-block-finalization bound.
		all := make([]byte, 0, total)
		for _, m := range msgs {
			all = append(all, m...)
		}
		b.Run(fmt.Sprintf("%s-concat/tokens=%d/block=%d", algo, benchTokens, benchBlock), func(b *testing.B) {
			b.SetBytes(4 * benchTokens)
			var sink byte
			clk := testfix.StartCPUClock()
			for b.Loop() {
				s := sha256.Sum256(all)
				sink ^= s[0]
			}
			clk.Stop(b, b.N)
			_ = sink
			b.ReportMetric(float64(total)*float64(b.N)/b.Elapsed().Seconds()/1e6, "encoded-MB/s")
		})
	}
}

// BenchmarkEncodeBlocks is the encoding share of a chain: every block's message, no
// digest. HashChain minus SHA256Raw should be about this.
func BenchmarkEncodeBlocks(b *testing.B) {
	toks := benchPrompt()
	for _, algo := range []string{"sha256_cbor", "sha256"} {
		c, err := New(Spec{Engine: "vllm", Algo: algo, BlockSize: benchBlock})
		if err != nil {
			b.Fatal(err)
		}
		vc := c.(*vllmChain)
		b.Run(fmt.Sprintf("%s/tokens=%d/block=%d", algo, benchTokens, benchBlock), func(b *testing.B) {
			b.SetBytes(4 * benchTokens)
			b.ReportAllocs()
			d := vc.Root()
			ex := appendCBORExtras(nil, "", "")
			buf := make([]byte, 0, vc.cbor.maxLen(benchBlock, len(ex)))
			suffix := appendPickleSuffix(nil, benchBlock, "", "")
			if vc.pickle {
				buf = make([]byte, 0, pickleMaxLen(int(d.N), benchBlock, len(suffix)))
			}
			clk := testfix.StartCPUClock()
			for b.Loop() {
				for i := 0; i < len(toks); i += benchBlock {
					if vc.pickle {
						buf = encodeBlockPickle(buf, &d, toks[i:i+benchBlock], suffix)
					} else {
						buf = vc.cbor.encode(buf, &d, toks[i:i+benchBlock], ex)
					}
				}
			}
			clk.Stop(b, b.N)
		})
	}
}
