package proxy

import (
	"encoding/json"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/proxy/openai"
)

// repeatSystemBodies are chat bodies shaped like `kvgate bench -overhead`'s: one
// ~4k-token system prompt shared by every request (single-token words) and a short user
// turn that changes per request.
func repeatSystemBodies(n int) [][]byte {
	words := strings.Fields("the cache block prefix engine route token model query answer light river stone house paper green quick brown over lazy")
	r := rand.New(rand.NewPCG(4096, 1))
	var sb strings.Builder
	for i := 0; i < 4096; i++ {
		sb.WriteByte(' ')
		sb.WriteString(words[r.IntN(len(words))])
	}
	system := sb.String()
	out := make([][]byte, n)
	for i := range out {
		out[i], _ = json.Marshal(map[string]any{"model": "qwen3", "max_tokens": 1, "messages": []map[string]string{
			{"role": "system", "content": system}, {"role": "user", "content": "question " + strconv.Itoa(i)}}})
	}
	return out
}

// BenchmarkRouteRepeatSystem routes the overhead bench's requests (memos on, as by
// default): the system prompt's one long segment is a tokenization-memo hit and its
// blocks chain-memo hits on every request after the first. "hot" runs them back to back;
// "cold" first touches 32 MiB per request (timer stopped), as the engine and the client
// running between two requests on the same cores do, so its figure is what the memo-hit
// path costs from memory rather than from cache. It reports the memo's segment hits
// and misses per request.
func BenchmarkRouteRepeatSystem(b *testing.B) {
	bodies := repeatSystemBodies(64)
	for _, cold := range []bool{false, true} {
		name := "hot"
		if cold {
			name = "cold"
		}
		b.Run(name, func(b *testing.B) {
			s, st := benchServerWith(b, bodies[0], func(*Config) {})
			var d decision
			evict := make([]byte, 32<<20)
			route := func(i int) {
				st.body = append(st.body[:0], bodies[i%len(bodies)]...)
				openai.Scan(st.body, &st.oa)
				clear(st.excluded)
				s.decide(st, &d, false)
			}
			route(0)
			m0 := s.kv.memo.Stats()
			b.ReportAllocs()
			i := 1
			for b.Loop() {
				if cold {
					b.StopTimer()
					for k := 0; k < len(evict); k += 64 {
						evict[k]++
					}
					b.StartTimer()
				}
				route(i)
				i++
			}
			m1 := s.kv.memo.Stats()
			n := float64(i - 1)
			b.ReportMetric(float64(m1.Hits-m0.Hits)/n, "memo-hits/op")
			b.ReportMetric(float64(m1.Misses-m0.Misses)/n, "memo-misses/op")
			b.ReportMetric(float64(len(st.tokens)), "tokens")
		})
	}
}
