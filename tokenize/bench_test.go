package tokenize

import (
	"testing"
)

// BenchmarkEncodeCorpus encodes the whole corpus per iteration on one goroutine; compare with
// `node tools/bench-tok-hf.js` (the HF tokenizers library on the same documents).
func BenchmarkEncodeCorpus(b *testing.B) {
	docs := loadCorpus(b)
	total := 0
	for _, d := range docs {
		total += len(d)
	}
	for _, name := range goldenNames {
		b.Run(name, func(b *testing.B) {
			tk := loadNamed(b, name)
			var ids []uint32
			tokens := 0
			for _, d := range docs { // warm the word cache, as the HF run does
				ids, _ = tk.Encode(ids, d, false)
				tokens += len(ids)
			}
			b.SetBytes(int64(total))
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				for _, d := range docs {
					ids, _ = tk.Encode(ids, d, false)
				}
			}
			b.ReportMetric(float64(tokens)*float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
		})
	}
}
