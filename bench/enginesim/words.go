package enginesim

import (
	"encoding/json"
	"fmt"
	"strings"
)

// WordEncoder is a tokenizer-free encoder: each whitespace-separated word is one token
// whose ID is a hash of the word, and a chat renders as role and content words in order.
// It lets a simulator run without tokenizer files; a router must then be told the same
// rule, so it is for harness tests and standalone runs, not parity with a real model.
type WordEncoder struct{}

func wordID(w string) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(w); i++ {
		h = (h ^ uint32(w[i])) * 16777619
	}
	return h % 150000
}

// EncodePrompt appends one token per word, after a BOS token (ID 1).
func (e WordEncoder) EncodePrompt(dst []uint32, prompt string) ([]uint32, error) {
	return e.EncodeText(append(dst, 1), prompt)
}

// EncodeText appends one token per word.
func (WordEncoder) EncodeText(dst []uint32, prompt string) ([]uint32, error) {
	for _, w := range strings.Fields(prompt) {
		dst = append(dst, wordID(w))
	}
	return dst, nil
}

// EncodeChat appends <role> words... per message, then the assistant role token when the
// generation prompt is asked for (BOS first with AddSpecialTokens).
func (WordEncoder) EncodeChat(dst []uint32, c *ChatPrompt) ([]uint32, error) {
	var msgs []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(c.Messages, &msgs); err != nil {
		return dst, fmt.Errorf("messages: %v", err)
	}
	if c.ContinueFinalMessage && len(msgs) == 0 {
		return dst, fmt.Errorf("continue_final_message needs a final message")
	}
	if c.AddSpecialTokens {
		dst = append(dst, 1)
	}
	for _, m := range msgs {
		dst = append(dst, wordID("<|"+m.Role+"|>"))
		var text string
		if len(m.Content) > 0 && m.Content[0] == '"' {
			if err := json.Unmarshal(m.Content, &text); err != nil {
				return dst, fmt.Errorf("message content: %v", err)
			}
		} else {
			var parts []struct {
				Text string `json:"text"`
			}
			if err := json.Unmarshal(m.Content, &parts); err != nil {
				return dst, fmt.Errorf("message content must be a string or a list of text parts")
			}
			for _, p := range parts {
				text += p.Text
			}
		}
		for _, w := range strings.Fields(text) {
			dst = append(dst, wordID(w))
		}
	}
	if c.AddGenerationPrompt {
		dst = append(dst, wordID("<|assistant|>"))
	}
	return dst, nil
}
