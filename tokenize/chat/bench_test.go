package chat

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// benchConversation builds a chat request of about 4,000 tokens (about 16 KB of English text,
// roughly 4 bytes per token): a system prompt, 12 user/assistant turns, one tool call with its
// result, and two tool definitions.
func benchConversation() *Input {
	sentence := "The quick brown fox jumps over the lazy dog while the routing layer keeps every prefix warm. "
	para := func(n int) string { return strings.Repeat(sentence, n) }
	msgs := []map[string]any{{"role": "system", "content": "You are a careful assistant. " + para(4)}}
	for i := 0; i < 12; i++ {
		msgs = append(msgs,
			map[string]any{"role": "user", "content": fmt.Sprintf("Question %d: ", i) + para(7)},
			map[string]any{"role": "assistant", "content": fmt.Sprintf("Answer %d: ", i) + para(7)})
	}
	msgs = append(msgs,
		map[string]any{"role": "user", "content": "What is the weather in Paris? " + para(2)},
		map[string]any{"role": "assistant", "content": "", "tool_calls": []any{map[string]any{
			"id": "call_1", "type": "function", "function": map[string]any{"name": "get_weather", "arguments": `{"city": "Paris", "unit": "celsius"}`}}}},
		map[string]any{"role": "tool", "tool_call_id": "call_1", "content": `{"temp": 21, "sky": "clear"}`},
		map[string]any{"role": "user", "content": "Thanks. Summarise everything. " + para(3)})
	tools := []any{
		map[string]any{"type": "function", "function": map[string]any{"name": "get_weather", "description": "Get the weather.",
			"parameters": map[string]any{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}}, "required": []any{"city"}}}},
		map[string]any{"type": "function", "function": map[string]any{"name": "get_time", "description": "Get the time.",
			"parameters": map[string]any{"type": "object", "properties": map[string]any{"tz": map[string]any{"type": "string"}}}}},
	}
	m, _ := json.Marshal(msgs)
	t, _ := json.Marshal(tools)
	return &Input{Messages: m, Tools: t, AddGenerationPrompt: true, BOSToken: "<s>", EOSToken: "</s>", Now: fixedNow}
}

// benchInputFor adapts the benchmark conversation to what model's template accepts.
func benchInputFor(model string, base *Input) Input {
	in := *base
	if model == "gemma3" {
		// Gemma 3 refuses system-less alternation breaks and tool turns: plain turns only.
		var msgs []map[string]any
		_ = json.Unmarshal(in.Messages, &msgs)
		in.Messages, _ = json.Marshal(msgs[:25])
		in.Tools = nil
	}
	return in
}

// BenchmarkRender4kTokens renders a ~4,000-token conversation with each real template.
// Run: go test -run '^$' -bench Render4k -benchmem ./tokenize/chat
func BenchmarkRender4kTokens(b *testing.B) {
	in := benchConversation()
	for _, model := range []string{"qwen3", "llama3_1", "deepseek_v3", "gemma3"} {
		b.Run(model, func(b *testing.B) {
			tmpl := mustCompile(b, loadChatTemplate(b, model))
			in := benchInputFor(model, in)
			out, err := tmpl.Render(nil, &in)
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(out)))
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if out, err = tmpl.Render(out[:0], &in); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(out)), "prompt-bytes")
		})
	}
}

func BenchmarkCompileQwen3(b *testing.B) {
	src := loadChatTemplate(b, "qwen3")
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if _, err := Compile(src); err != nil {
			b.Fatal(err)
		}
	}
}
