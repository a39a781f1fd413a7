// Package chat renders Hugging Face chat templates (Jinja2) exactly as vLLM does for
// /v1/chat/completions: transformers' apply_chat_template environment plus vLLM's message
// preprocessing. It is a small self-contained Jinja2 engine over an ordered value model, so
// dict key order, tojson output and Python string semantics match Jinja2 byte for byte.
package chat

import "errors"

// Template is a compiled chat template. It is immutable after Compile and safe for concurrent
// Render calls.
type Template struct {
	source string
}

// Input is one chat request's template inputs.
type Input struct {
	// Raw JSON from the OpenAI request: "messages", "tools", "chat_template_kwargs"; nil if absent.
	Messages, Tools, Kwargs []byte
	AddGenerationPrompt     bool
	BOSToken, EOSToken      string
	// Other special-token variables from tokenizer_config.json (e.g. pad_token, unk_token).
	Special map[string]string
}

// Compile parses a chat template once.
func Compile(source string) (*Template, error) {
	return &Template{source: source}, nil
}

// Render appends the rendered prompt to dst.
func (t *Template) Render(dst []byte, in *Input) ([]byte, error) {
	return dst, errors.New("chat: Render not implemented yet")
}
