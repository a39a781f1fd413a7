package enginesim

import "github.com/kvgate/kvgate/tokenize"

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

func (e modelEncoder) EncodeChat(dst []uint32, messages, tools, kwargs []byte) ([]uint32, error) {
	return e.m.EncodeChat(dst, &tokenize.ChatInput{Messages: messages, Tools: tools, TemplateKwargs: kwargs, AddGenerationPrompt: true})
}
