package proxy

import (
	"strings"
	"testing"

	"github.com/kvgate/kvgate/hashcore"
)

// BenchmarkHugePrompt is what -kv-max-prompt-bytes saves: tokenizing and hashing a
// ~1M-token prompt (4.25 MB of text) per request.
func BenchmarkHugePrompt(b *testing.B) {
	m := sharedPool(b).Get("qwen3")
	text := strings.Repeat("hello world, the quick brown fox. ", 1<<20/8)
	c, err := hashcore.New(hashcore.Spec{Engine: "vllm", Algo: "sha256_cbor", BlockSize: blockSize})
	if err != nil {
		b.Fatal(err)
	}
	var toks []uint32
	var keys []uint64
	b.ReportAllocs()
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		toks, err = m.EncodePrompt(toks[:0], text)
		if err != nil {
			b.Fatal(err)
		}
		keys = hashcore.Keys(c, keys[:0], toks, nil)
	}
	b.ReportMetric(float64(len(toks)), "tokens")
	b.ReportMetric(float64(len(keys)), "blocks")
}
