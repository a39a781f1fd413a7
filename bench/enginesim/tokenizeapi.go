package enginesim

import (
	"encoding/json"
	"io"
	"net/http"
	"strconv"
)

// POST /tokenize: the engine's own tokenization of a prompt, through exactly the encoder
// and chat template its generate path uses (so a router can compare its tokens with the
// engine's). vLLM's shape in vllm mode, SGLang's in sglang mode (docs/CONTRACTS.md,
// "/tokenize"); trtllm-serve has no such endpoint.

type tokenizeRequest struct {
	Model              string          `json:"model"`
	Prompt             json.RawMessage `json:"prompt"`
	Messages           json.RawMessage `json:"messages"`
	Tools              json.RawMessage `json:"tools"`
	ChatTemplate       json.RawMessage `json:"chat_template"`
	ChatTemplateKwargs json.RawMessage `json:"chat_template_kwargs"`
	ReturnTokenStrs    bool            `json:"return_token_strs"`
	chatSwitches
}

// maxModelLen is the longest sequence the engine holds: its whole KV pool (also what
// /v1/models reports).
func (s *Sim) maxModelLen() int { return s.pool.NumBlocks() * s.pool.BlockSize() }

func (s *Sim) serveTokenize(w http.ResponseWriter, r *http.Request) {
	var req tokenizeRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, 64<<20)).Decode(&req); err != nil {
		writeError(w, badRequest("invalid JSON body: %v", err))
		return
	}
	var b []byte
	var err error
	if s.cfg.Engine == EngineSGLang {
		b, err = s.tokenizeSGLang(&req)
	} else {
		b, err = s.tokenizeVLLM(&req)
	}
	if err != nil {
		writeError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(b)
}

// checkTokenize refuses what the simulator cannot do the engine's way.
func (s *Sim) checkTokenize(req *tokenizeRequest) error {
	if _, err := s.lookupModel(req.Model); err != nil {
		return err
	}
	if s.cfg.Encoder == nil {
		return badRequest("this engine has no tokenizer (engine-sim started without -tokenizer)")
	}
	if !isNull(req.ChatTemplate) {
		return badRequest("chat_template is not supported by the simulator: it renders the model's own template")
	}
	if req.ReturnTokenStrs {
		return badRequest("return_token_strs is not supported by the simulator (it has no detokenizer)")
	}
	hasPrompt, hasMessages := !isNull(req.Prompt), !isNull(req.Messages)
	if hasPrompt == hasMessages {
		return badRequest("Exactly one of 'prompt' or 'messages' must be provided.")
	}
	return nil
}

func isNull(raw json.RawMessage) bool { return len(raw) == 0 || string(raw) == "null" }

// tokenizeOne encodes one text prompt or the chat of req.
func (s *Sim) tokenizeOne(req *tokenizeRequest, prompt json.RawMessage) ([]uint32, error) {
	var ids []uint32
	var err error
	if prompt == nil {
		var c *ChatPrompt
		if c, err = req.chatPrompt(req.Messages, req.Tools, req.ChatTemplateKwargs); err != nil {
			return nil, err
		}
		ids, err = s.cfg.Encoder.EncodeChat(nil, c)
	} else {
		var text string
		if prompt[0] != '"' || json.Unmarshal(prompt, &text) != nil {
			return nil, badRequest("prompt must be a string")
		}
		if req.promptSpecial() {
			ids, err = s.cfg.Encoder.EncodePrompt(nil, text)
		} else {
			ids, err = s.cfg.Encoder.EncodeText(nil, text)
		}
	}
	if err != nil {
		return nil, badRequest("tokenize: %v", err)
	}
	if max := s.maxModelLen(); len(ids) > max {
		return nil, badRequest("This model's maximum context length is %d tokens. However, your request has %d input tokens. Please reduce the length of the input.", max, len(ids))
	}
	return ids, nil
}

// tokenizeVLLM: TokenizeCompletionRequest {prompt: str, add_special_tokens=true} or
// TokenizeChatRequest {messages, add_generation_prompt=true, continue_final_message=false,
// add_special_tokens=false, tools, chat_template_kwargs}; answers TokenizeResponse.
func (s *Sim) tokenizeVLLM(req *tokenizeRequest) ([]byte, error) {
	if err := s.checkTokenize(req); err != nil {
		return nil, err
	}
	var prompt json.RawMessage
	if !isNull(req.Prompt) {
		prompt = req.Prompt
	}
	ids, err := s.tokenizeOne(req, prompt)
	if err != nil {
		return nil, err
	}
	b := append([]byte(`{"count":`), strconv.Itoa(len(ids))...)
	b = append(b, `,"max_model_len":`...)
	b = strconv.AppendInt(b, int64(s.maxModelLen()), 10)
	b = append(b, `,"tokens":`...)
	b = appendIDs(b, ids)
	return append(b, `,"token_strs":null}`...), nil
}

// tokenizeSGLang: TokenizeRequest {prompt: str | [str], add_special_tokens=true} or
// {messages, tools, continue_final_message, chat_template_kwargs} (the chat is rendered as
// a chat completion would be: add_special_tokens does not apply); a list prompt answers
// lists of tokens and counts.
func (s *Sim) tokenizeSGLang(req *tokenizeRequest) ([]byte, error) {
	if err := s.checkTokenize(req); err != nil {
		return nil, err
	}
	var prompts []json.RawMessage
	list := false
	switch {
	case isNull(req.Prompt):
		req.AddSpecialTokens = nil
		prompts = []json.RawMessage{nil}
	case req.Prompt[0] == '[':
		list = true
		if err := json.Unmarshal(req.Prompt, &prompts); err != nil {
			return nil, badRequest("prompt must be a string or a list of strings")
		}
	default:
		prompts = []json.RawMessage{req.Prompt}
	}
	tokens := []byte{'['}
	counts := []byte{'['}
	for i, p := range prompts {
		if p != nil && isNull(p) {
			return nil, badRequest("prompt must be a string or a list of strings")
		}
		ids, err := s.tokenizeOne(req, p)
		if err != nil {
			return nil, err
		}
		if i > 0 {
			tokens = append(tokens, ',')
			counts = append(counts, ',')
		}
		tokens = appendIDs(tokens, ids)
		counts = strconv.AppendInt(counts, int64(len(ids)), 10)
	}
	tokens = append(tokens, ']')
	counts = append(counts, ']')
	if !list {
		tokens, counts = tokens[1:len(tokens)-1], counts[1:len(counts)-1]
	}
	b := append([]byte(`{"tokens":`), tokens...)
	b = append(b, `,"count":`...)
	b = append(b, counts...)
	b = append(b, `,"max_model_len":`...)
	b = strconv.AppendInt(b, int64(s.maxModelLen()), 10)
	return append(b, '}'), nil
}

func appendIDs(b []byte, ids []uint32) []byte {
	b = append(b, '[')
	for i, id := range ids {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendUint(b, uint64(id), 10)
	}
	return append(b, ']')
}
