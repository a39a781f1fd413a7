package bench

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/kvgate/kvgate/bench/enginesim"
	"github.com/kvgate/kvgate/internal/testfix"
)

// BenchmarkOracleRoute is one oracle decision over 4 engines for a ~1k-token chat with the
// Qwen3 tokenizer: four probes (each tokenizes and hashes the request) and the admission
// model. It runs under the oracle's lock, so it bounds the rate the oracle can place at.
func BenchmarkOracleRoute(b *testing.B) {
	dir := testfix.TokenizerDir(b, "qwen3")
	enc, err := enginesim.LoadEncoder("qwen3", dir)
	if err != nil {
		b.Fatal(err)
	}
	var sims []*enginesim.Sim
	for range 4 {
		s, err := enginesim.Launch(enginesim.Spec{Name: "e", Model: "qwen3", Encoder: enc, BlockSize: 16, NumBlocks: 4096, MaxBatch: 8,
			PrefillBase: time.Millisecond, PrefillPerToken: time.Microsecond, DecodePerToken: time.Millisecond, Listen: "127.0.0.1:0"})
		if err != nil {
			b.Fatal(err)
		}
		defer s.Close()
		sims = append(sims, s)
	}
	words := FilterWords(enc, Words)
	body, _ := json.Marshal(requestBody{Model: "qwen3", MaxTokens: 16, Messages: []chatMessage{
		{Role: "system", Content: Text(words, 1, 1000)}, {Role: "user", Content: Text(words, 2, 32)}}})
	o := newOracle(sims)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		_, done, err := o.RouteTracked(body, true)
		if err != nil {
			b.Fatal(err)
		}
		done()
	}
}
