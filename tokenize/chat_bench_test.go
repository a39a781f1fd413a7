package tokenize

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"
)

// chatPrompt4k builds a multi-turn chat request whose prompt is about 4,000 tokens for the
// model, from corpus prose and code.
func chatPrompt4k(t testing.TB, m *Model) *ChatInput {
	docs := loadCorpus(t)
	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	msgs := []msg{{"system", "You are a careful assistant. Answer briefly."}}
	for i, d := 0, 0; ; d++ {
		doc := docs[(d*13)%len(docs)]
		if len(doc) > 3000 || strings.Contains(doc, "<") {
			continue
		}
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		msgs = append(msgs, msg{role, doc})
		i++
		raw, _ := json.Marshal(msgs)
		in := &ChatInput{Messages: raw, AddGenerationPrompt: true}
		ids, err := m.EncodeChat(nil, in)
		if err != nil {
			t.Fatal(err)
		}
		if len(ids) >= 4000 && role == "user" {
			return in
		}
	}
}

// BenchmarkChatPrompt4k: one /v1/chat/completions prompt of ~4,000 tokens, template render plus
// tokenization, as the proxy does per request. Reports p50/p99 latency and allocations.
func BenchmarkChatPrompt4k(b *testing.B) {
	for _, name := range []string{"qwen3", "llama3", "deepseek_v3", "gemma3"} {
		b.Run(name, func(b *testing.B) {
			m := loadModelNamed(b, name)
			in := chatPrompt4k(b, m)
			ids, _ := m.EncodeChat(nil, in)
			tokens := len(ids)
			lat := make([]time.Duration, 0, b.N)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				t0 := time.Now()
				ids, _ = m.EncodeChat(ids, in)
				lat = append(lat, time.Since(t0))
			}
			b.StopTimer()
			slices.Sort(lat)
			b.ReportMetric(float64(tokens), "tokens")
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
		})
	}
}

// completionPrompt4k concatenates corpus documents into a prompt of about 4,000 tokens.
func completionPrompt4k(m *Model, docs []string) string {
	var sb strings.Builder
	var ids []uint32
	for d := 0; len(ids) < 4000; d++ {
		sb.WriteString(docs[(d*17)%len(docs)])
		ids, _ = m.EncodePrompt(ids, sb.String())
	}
	return sb.String()
}

// BenchmarkCompletionPrompt4k: a ~4,000-token /v1/completions prompt (tokenization only).
func BenchmarkCompletionPrompt4k(b *testing.B) {
	docs := loadCorpus(b)
	for _, name := range goldenNames {
		b.Run(name, func(b *testing.B) {
			m := loadModelNamed(b, name)
			prompt := completionPrompt4k(m, docs)
			ids, _ := m.EncodePrompt(nil, prompt)
			b.SetBytes(int64(len(prompt)))
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				ids, _ = m.EncodePrompt(ids, prompt)
			}
			b.ReportMetric(float64(len(ids)), "tokens")
		})
	}
}
