package tokenize

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testfix"
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

// followupChat is a Qwen3-style conversation of about 4,700 tokens: turns[:n] as sent before
// and the follow-up, whose last assistant reply and user message are new text with an
// 8-digit counter at counterAt (two offsets in Messages) to make every iteration unseen.
type followupChat struct {
	turns     []*ChatInput // turn k: messages up to the k-th user message
	next      *ChatInput   // the follow-up: turns' last messages + a new reply + a new question
	counterAt [2]int
	newText   int // bytes of new message text in next
}

func buildFollowupChat(t testing.TB, m *Model, tokens int) *followupChat {
	docs := loadCorpus(t)
	msgs := []chatMsg{{"system", "You are a careful assistant. Answer briefly."}}
	fc := &followupChat{}
	var reply string
	for d := 0; ; d++ {
		doc := docs[(d*13)%len(docs)]
		if len(doc) > 3000 || len(doc) < 200 || strings.Contains(doc, "<") {
			continue
		}
		if reply == "" && len(doc) > 700 && len(doc) < 1100 {
			reply = doc // the follow-up's new assistant reply, ~300 tokens
			continue
		}
		role := "user"
		if len(msgs)%2 == 0 {
			role = "assistant"
		}
		msgs = append(msgs, chatMsg{role, doc})
		if role != "user" {
			continue
		}
		raw, _ := json.Marshal(msgs)
		in := &ChatInput{Messages: raw, AddGenerationPrompt: true}
		fc.turns = append(fc.turns, in)
		ids, err := m.EncodeChat(nil, in)
		if err != nil {
			t.Fatal(err)
		}
		if len(ids) >= tokens-350-m.tokensOf(reply) && reply != "" {
			break
		}
	}
	question := "00000000: and how does that compare with the version you showed before?"
	next := append(msgs, chatMsg{"assistant", "00000000 " + reply}, chatMsg{"user", question})
	raw, _ := json.Marshal(next)
	first := strings.Index(string(raw), "00000000 ")
	second := strings.LastIndex(string(raw), question)
	fc.counterAt = [2]int{first, second}
	fc.next = &ChatInput{Messages: raw, AddGenerationPrompt: true}
	fc.newText = len(reply) + len(question) + 9 // JSON escapes make the span approximate
	if first < 0 || second < 0 {
		t.Fatal("follow-up counters not found")
	}
	return fc
}

func (m *Model) tokensOf(s string) int {
	ids, _ := m.tok.Encode(nil, s, false)
	return len(ids)
}

// stamp writes i into the follow-up's two counters, so its new text is unseen.
func (fc *followupChat) stamp(i int) {
	for _, at := range fc.counterAt {
		for k, v := 7, i; k >= 0; k, v = k-1, v/10 {
			fc.next.Messages[at+k] = byte('0' + v%10)
		}
	}
}

// BenchmarkEncodeChatFollowup: turn n+1 of a Qwen3 chat reaching ~4.7k tokens (a new ~300-token
// assistant reply and a new question on top of turn n), template render plus tokenization.
// memo: the memo is warm from turns <= n and the new text differs every iteration; cold: no
// memo; repeat: the same follow-up again (every segment hits); render: the template alone.
func BenchmarkEncodeChatFollowup(b *testing.B) {
	m := loadModelNamed(b, "qwen3")
	fc := buildFollowupChat(b, m, 4700)
	ids, _ := m.EncodeChat(nil, fc.next)
	tokens := len(ids)
	newIDs, _ := m.Tokenizer().Encode(nil, string(fc.next.Messages[fc.counterAt[0]:fc.counterAt[0]+fc.newText]), false)
	report := func(b *testing.B) {
		b.ReportMetric(float64(tokens), "tokens")
		b.ReportMetric(float64(len(newIDs)), "new-tokens")
	}
	b.Run("memo", func(b *testing.B) {
		memo := newTestMemo(b, DefaultMemoBytes)
		for _, in := range fc.turns {
			ids, _ = m.EncodeChatMemo(ids, in, memo)
		}
		b.ReportAllocs()
		b.ResetTimer()
		clk := testfix.StartCPUClock()
		for i := 0; i < b.N; i++ {
			fc.stamp(i + 1)
			ids, _ = m.EncodeChatMemo(ids, fc.next, memo)
		}
		clk.Stop(b, b.N)
		report(b)
	})
	b.Run("cold", func(b *testing.B) {
		b.ReportAllocs()
		clk := testfix.StartCPUClock()
		for i := 0; i < b.N; i++ {
			fc.stamp(i + 1)
			ids, _ = m.EncodeChat(ids, fc.next)
		}
		clk.Stop(b, b.N)
		report(b)
	})
	b.Run("repeat", func(b *testing.B) {
		memo := newTestMemo(b, DefaultMemoBytes)
		ids, _ = m.EncodeChatMemo(ids, fc.next, memo)
		b.ReportAllocs()
		b.ResetTimer()
		clk := testfix.StartCPUClock()
		for i := 0; i < b.N; i++ {
			ids, _ = m.EncodeChatMemo(ids, fc.next, memo)
		}
		clk.Stop(b, b.N)
		report(b)
	})
	b.Run("render", func(b *testing.B) {
		var out []byte
		b.ReportAllocs()
		clk := testfix.StartCPUClock()
		for i := 0; i < b.N; i++ {
			out, _ = m.RenderChat(out[:0], fc.next)
		}
		clk.Stop(b, b.N)
		report(b)
	})
}
