package enginesim

import "errors"

// LoadEncoder loads the tokenizer (tokenizer.json, tokenizer_config.json with its chat
// template) from dir for the served model name.
func LoadEncoder(model, dir string) (Encoder, error) {
	return nil, errors.New("enginesim: tokenizer support is not wired yet")
}
