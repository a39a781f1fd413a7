package enginesim

import "github.com/kvgate/kvgate/tokenize"

// ChatPrompt is a chat request as the engine renders it: the raw JSON the client sent
// (nil when absent) and the template switches vLLM reads from the request.
type ChatPrompt struct {
	Messages, Tools, TemplateKwargs []byte
	AddGenerationPrompt             bool
	ContinueFinalMessage            bool // the prompt ends inside the final message
	// AddSpecialTokens encodes the rendered template with the tokenizer's special tokens
	// (BOS) on top of what the template writes; vLLM's default for chat is false.
	AddSpecialTokens bool
}

// Encoder turns a request's prompt into token IDs the way the engine does. Completions:
// the tokenizer with its post-processor (BOS), add_special_tokens=True (EncodePrompt) or
// without it (EncodeText); chat: the model's chat template, then the tokenizer.
type Encoder interface {
	EncodePrompt(dst []uint32, prompt string) ([]uint32, error)
	EncodeText(dst []uint32, text string) ([]uint32, error)
	EncodeChat(dst []uint32, c *ChatPrompt) ([]uint32, error)
}

// LoadEncoder loads the tokenizer (tokenizer.json, tokenizer_config.json with its chat
// template) from dir for the served model name: the same tokenize.Model kvgate uses, so
// the simulator tokenizes and templates exactly like the router (and like vLLM).
func LoadEncoder(model, dir string) (Encoder, error) {
	m, err := tokenize.LoadModel(model, dir)
	if err != nil {
		return nil, err
	}
	return modelEncoder{m}, nil
}

type modelEncoder struct{ m *tokenize.Model }

func (e modelEncoder) EncodePrompt(dst []uint32, prompt string) ([]uint32, error) {
	return e.m.EncodePrompt(dst, prompt)
}

func (e modelEncoder) EncodeText(dst []uint32, text string) ([]uint32, error) {
	return e.m.Tokenizer().Encode(dst, text, false)
}

func (e modelEncoder) EncodeChat(dst []uint32, c *ChatPrompt) ([]uint32, error) {
	in := &tokenize.ChatInput{Messages: c.Messages, Tools: c.Tools, TemplateKwargs: c.TemplateKwargs,
		AddGenerationPrompt: c.AddGenerationPrompt, ContinueFinalMessage: c.ContinueFinalMessage}
	if !c.AddSpecialTokens {
		return e.m.EncodeChat(dst, in)
	}
	text, err := e.m.RenderChat(nil, in)
	if err != nil {
		return dst[:0], err
	}
	return e.m.EncodePrompt(dst, string(text))
}

// driftEncoder is an engine whose tokenization deliberately differs from the model's (as
// after a tokenizer or chat-template upgrade on one side only): every prompt gains one
// token up front, which moves every block boundary, so no block key matches a router's.
// It exists so `kvgate doctor` and parity checks can be shown a mismatch.
type driftEncoder struct{ Encoder }

// driftToken is the extra token; any ID the tests' prompts do not start with.
const driftToken = 7

func (e driftEncoder) EncodePrompt(dst []uint32, prompt string) ([]uint32, error) {
	out, err := e.Encoder.EncodePrompt(dst, prompt)
	return drift(out), err
}

func (e driftEncoder) EncodeText(dst []uint32, text string) ([]uint32, error) {
	out, err := e.Encoder.EncodeText(dst, text)
	return drift(out), err
}

func (e driftEncoder) EncodeChat(dst []uint32, c *ChatPrompt) ([]uint32, error) {
	out, err := e.Encoder.EncodeChat(dst, c)
	return drift(out), err
}

func drift(ids []uint32) []uint32 {
	if len(ids) == 0 {
		return ids
	}
	ids = append(ids, 0)
	copy(ids[1:], ids)
	ids[0] = driftToken
	return ids
}
