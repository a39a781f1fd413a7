package bench

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/bench/enginepub"
	"github.com/kvgate/kvgate/hashcore"
	"github.com/kvgate/kvgate/ingest"
	"github.com/kvgate/kvgate/tokenize"
)

// The micro suite: `go test ./bench -run '^$' -bench Micro -benchmem` reports the per-stage
// costs of the routing path (hash chain, tokenizer, event decoding) next to the decision
// benchmark in decision_test.go.

func microTokens(n int) []uint32 {
	t := make([]uint32, n)
	x := uint32(12345)
	for i := range t {
		x = x*1664525 + 1013904223
		t[i] = x % 151000
	}
	return t
}

func BenchmarkMicroHashChain8k(b *testing.B) {
	toks := microTokens(8192)
	for _, sp := range []hashcore.Spec{
		{Engine: "vllm", Algo: "sha256", BlockSize: 16},
		{Engine: "vllm", Algo: "sha256_cbor", BlockSize: 16},
		{Engine: "vllm", Algo: "xxhash_cbor", BlockSize: 16, Seed: "0", SeedSet: true},
		{Engine: "sglang", BlockSize: 16},
		{Engine: "kvgate", BlockSize: 16},
	} {
		c, err := hashcore.New(sp)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(strings.ReplaceAll(c.Name(), "/", "_"), func(b *testing.B) {
			dst := make([]uint64, 0, 512)
			b.SetBytes(int64(len(toks) * 4))
			b.ReportAllocs()
			for b.Loop() {
				dst = hashcore.Keys(c, dst[:0], toks, nil)
			}
			b.ReportMetric(float64(len(toks))*float64(b.N)/b.Elapsed().Seconds()/1e6, "Mtokens/s")
		})
	}
}

func BenchmarkMicroIngestDecode(b *testing.B) {
	toks := microTokens(16 * 32)
	hashes := make([]uint64, 32)
	for i := range hashes {
		hashes[i] = uint64(i)*0x9e3779b97f4a7c15 | 1<<63
	}
	for _, lay := range []struct {
		name string
		l    enginepub.Layout
	}{{"array", enginepub.LayoutArray}, {"map", enginepub.LayoutMap}} {
		f := enginepub.Format{Flavor: enginepub.VLLM, Layout: lay.l}
		payload := f.AppendBatch(nil, 1.5, []enginepub.Event{
			enginepub.BlockStored{Hashes: hashes, Parent: 7, HasParent: true, TokenIDs: toks, BlockSize: 16},
			enginepub.BlockRemoved{Hashes: hashes[:8]},
		})
		b.Run(lay.name, func(b *testing.B) {
			var d ingest.BatchDecoder
			var ev ingest.Event
			b.SetBytes(int64(len(payload)))
			b.ReportAllocs()
			for b.Loop() {
				if err := d.Reset(payload); err != nil {
					b.Fatal(err)
				}
				n := 0
				for d.Next(&ev) {
					n += len(ev.Hashes)
				}
				if n != 40 {
					b.Fatalf("decoded %d hashes, want 40 (%v)", n, d.Err())
				}
			}
			b.ReportMetric(40*float64(b.N)/b.Elapsed().Seconds()/1e6, "Mkeys/s")
		})
	}
}

func BenchmarkMicroTokenize(b *testing.B) {
	dir, err := tokenize.StagedDir("qwen3")
	if err != nil {
		b.Fatal(err)
	}
	tk, err := tokenize.LoadTokenizer(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		b.Fatalf("%v (run `make fetch`)", err)
	}
	text := Text(Words, 42, 4096)
	var dst []uint32
	b.SetBytes(int64(len(text)))
	b.ReportAllocs()
	for b.Loop() {
		dst, err = tk.Encode(dst[:0], text, true)
		if err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(dst)), "tokens/op")
}
