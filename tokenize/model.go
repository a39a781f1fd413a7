package tokenize

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/tokenize/chat"
)

// Model is one served model's tokenization: its tokenizer, chat template and special tokens,
// loaded from a directory holding tokenizer.json, tokenizer_config.json and optionally
// chat_template.jinja.
type Model struct {
	Name string

	tok      *Tokenizer
	tmpl     *chat.Template // nil when the model has no chat template
	toolTmpl *chat.Template // the "tool_use" named template, when there is one
	bos, eos string
	special  map[string]string // other special-token variables for the template
	// Completions: the IDs the engine's tokenizer adds around a prompt (add_special_tokens=True).
	promptPrefix, promptSuffix []uint32
	renderPool                 sync.Pool // *renderScratch
	now                        time.Time // tests: the clock strftime_now reads (zero: time.Now)
}

// ChatInput is the part of a /v1/chat/completions body the template needs.
type ChatInput struct {
	Messages, Tools, TemplateKwargs []byte // raw JSON as sent by the client, nil if absent
	AddGenerationPrompt             bool
	// ContinueFinalMessage: the prompt ends inside the final (assistant) message, as vLLM's
	// continue_final_message (exclusive with AddGenerationPrompt).
	ContinueFinalMessage bool
	// Documents (raw JSON, nil if absent) and ReasoningEffort ("" if absent) are the request's
	// own template variables; see chat.Input.
	Documents       []byte
	ReasoningEffort string
	// MemoUse, when set, receives what the encode took from the Memo (/debug/explain).
	MemoUse *MemoUse
	// RenderMemo, when set, lets the template render replay the turns rendered before
	// (chat.RenderMemo; same output); RenderUse receives what it took from it.
	RenderMemo *RenderMemo
	RenderUse  *RenderUse
}

// RenderMemo is the chat template render memo (see chat.RenderMemo).
type RenderMemo = chat.RenderMemo

// RenderUse is what one render took from a RenderMemo.
type RenderUse = chat.MemoUse

// The render memo's bounds (-render-memo-bytes).
const (
	DefaultRenderMemoBytes = chat.DefaultRenderMemoBytes
	MinRenderMemoBytes     = chat.MinRenderMemoBytes
)

// NewRenderMemo returns a render memo bounded by maxBytes.
func NewRenderMemo(maxBytes int64) (*RenderMemo, error) { return chat.NewRenderMemo(maxBytes) }

type jsonTokenizerConfig struct {
	ChatTemplate       json.RawMessage            `json:"chat_template"`
	TokenizerClass     string                     `json:"tokenizer_class"`
	AddBOSToken        *bool                      `json:"add_bos_token"`
	AddEOSToken        *bool                      `json:"add_eos_token"`
	ExtraSpecialTokens map[string]json.RawMessage `json:"extra_special_tokens"`
}

// specialTokenNames are transformers' SPECIAL_TOKENS_ATTRIBUTES with a single string value.
var specialTokenNames = []string{"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"}

// tokenString reads a special token from tokenizer_config.json: a string, an AddedToken
// object ({"content": ...}) or null.
func tokenString(raw json.RawMessage) (string, error) {
	if isNull(raw) {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var o struct {
		Content string `json:"content"`
	}
	if err := json.Unmarshal(raw, &o); err != nil {
		return "", err
	}
	return o.Content, nil
}

// LoadModel loads the model served as name from dir.
func LoadModel(name, dir string) (*Model, error) {
	tok, err := LoadTokenizer(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		return nil, err
	}
	return newModel(name, dir, tok)
}

func newModel(name, dir string, tok *Tokenizer) (*Model, error) {
	m := &Model{Name: name, tok: tok, special: map[string]string{}}
	m.renderPool.New = func() any { return &renderScratch{out: make([]byte, 0, 4096)} }
	m.promptPrefix, m.promptSuffix = tok.postPrefix, tok.postSuffix

	cfgPath := filepath.Join(dir, "tokenizer_config.json")
	data, err := os.ReadFile(cfgPath)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("tokenize: %w", err)
	}
	var cfg jsonTokenizerConfig
	var all map[string]json.RawMessage
	if err == nil {
		if err := json.Unmarshal(data, &cfg); err != nil {
			return nil, fmt.Errorf("tokenize: %s: %w", cfgPath, err)
		}
		if err := json.Unmarshal(data, &all); err != nil {
			return nil, fmt.Errorf("tokenize: %s: %w", cfgPath, err)
		}
	}
	for _, k := range specialTokenNames {
		s, err := tokenString(all[k])
		if err != nil {
			return nil, fmt.Errorf("tokenize: %s: %s: %w", cfgPath, k, err)
		}
		if s == "" {
			continue
		}
		switch k {
		case "bos_token":
			m.bos = s
		case "eos_token":
			m.eos = s
		default:
			m.special[k] = s
		}
	}
	for k, raw := range cfg.ExtraSpecialTokens {
		if s, err := tokenString(raw); err == nil && s != "" {
			m.special[k] = s
		}
	}
	if err := m.applyTokenizerClass(&cfg); err != nil {
		return nil, fmt.Errorf("tokenize: %s: %w", cfgPath, err)
	}

	// The chat template: chat_template.jinja wins over tokenizer_config.json (as transformers).
	src, toolSrc := "", ""
	if b, err := os.ReadFile(filepath.Join(dir, "chat_template.jinja")); err == nil {
		src = string(b)
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("tokenize: %w", err)
	} else if !isNull(cfg.ChatTemplate) {
		if src, toolSrc, err = parseChatTemplateField(cfg.ChatTemplate); err != nil {
			return nil, fmt.Errorf("tokenize: %s: chat_template: %w", cfgPath, err)
		}
	}
	if src != "" {
		if m.tmpl, err = chat.Compile(src); err != nil {
			return nil, fmt.Errorf("tokenize: %s: chat template: %w", dir, err)
		}
	}
	if toolSrc != "" {
		if m.toolTmpl, err = chat.Compile(toolSrc); err != nil {
			return nil, fmt.Errorf("tokenize: %s: tool_use chat template: %w", dir, err)
		}
	}
	return m, nil
}

// parseChatTemplateField reads chat_template: a string, or a list of {"name", "template"}
// (transformers uses "default", and "tool_use" when the request has tools).
func parseChatTemplateField(raw json.RawMessage) (def, tool string, err error) {
	if err := json.Unmarshal(raw, &def); err == nil {
		return def, "", nil
	}
	var named []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	if err := json.Unmarshal(raw, &named); err != nil {
		return "", "", err
	}
	for _, n := range named {
		switch n.Name {
		case "default":
			def = n.Template
		case "tool_use":
			tool = n.Template
		}
	}
	if def == "" && tool == "" {
		return "", "", errors.New("no template named default or tool_use")
	}
	return def, tool, nil
}

// applyTokenizerClass reproduces what transformers' tokenizer classes do to the completions
// prompt on top of tokenizer.json: LlamaTokenizerFast and GemmaTokenizerFast rebuild the
// post-processor from add_bos_token / add_eos_token (update_post_processor), so for example
// DeepSeek-V3 (LlamaTokenizerFast, add_bos_token=true, a ByteLevel post-processor in
// tokenizer.json) gets its BOS on /v1/completions in vLLM.
func (m *Model) applyTokenizerClass(cfg *jsonTokenizerConfig) error {
	switch cfg.TokenizerClass {
	case "LlamaTokenizer", "LlamaTokenizerFast", "GemmaTokenizer", "GemmaTokenizerFast",
		"CodeLlamaTokenizer", "CodeLlamaTokenizerFast":
	default:
		return nil
	}
	addBOS := cfg.AddBOSToken == nil || *cfg.AddBOSToken // both classes default to true
	addEOS := cfg.AddEOSToken != nil && *cfg.AddEOSToken
	m.promptPrefix, m.promptSuffix = nil, nil
	if addBOS {
		id, ok := m.tok.TokenID(m.bos)
		if m.bos == "" || !ok {
			return fmt.Errorf("add_bos_token is set but bos_token %q is not a known token", m.bos)
		}
		m.promptPrefix = []uint32{id}
	}
	if addEOS {
		id, ok := m.tok.TokenID(m.eos)
		if m.eos == "" || !ok {
			return fmt.Errorf("add_eos_token is set but eos_token %q is not a known token", m.eos)
		}
		m.promptSuffix = []uint32{id}
	}
	return nil
}

// Tokenizer returns the model's tokenizer.
func (m *Model) Tokenizer() *Tokenizer { return m.tok }

// HasChatTemplate reports whether EncodeChat can work for this model.
func (m *Model) HasChatTemplate() bool { return m.tmpl != nil || m.toolTmpl != nil }

// ChatKeepsParts reports that the template EncodeChat uses for in takes message content as
// a list of parts (vLLM's "openai" content format), so media parts stay in place.
func (m *Model) ChatKeepsParts(in *ChatInput) bool {
	tmpl, _, _ := m.pickTemplate(in)
	return tmpl != nil && tmpl.ContentFormat() == chat.ContentOpenAI
}

// EncodePrompt appends the IDs of a /v1/completions text prompt to dst[:0]: the prompt is
// encoded with add_special_tokens=True, as vLLM does.
func (m *Model) EncodePrompt(dst []uint32, prompt string) ([]uint32, error) {
	return m.EncodePromptMemo(dst, prompt, nil)
}

// EncodePromptMemo is EncodePrompt through memo (nil: none), with the same result.
func (m *Model) EncodePromptMemo(dst []uint32, prompt string, memo *Memo) ([]uint32, error) {
	dst = append(dst[:0], m.promptPrefix...)
	dst, err := m.tok.appendEncode(dst, prompt, memo, nil, nil)
	if err != nil {
		return dst[:0], err
	}
	return append(dst, m.promptSuffix...), nil
}

// EncodeChat renders the chat template for a /v1/chat/completions request and appends its IDs
// to dst[:0], encoded with add_special_tokens=False (the template writes the special tokens).
func (m *Model) EncodeChat(dst []uint32, in *ChatInput) ([]uint32, error) {
	return m.EncodeChatMemo(dst, in, nil)
}

// EncodeChatMemo is EncodeChat through memo (nil: none), with the same result. The template
// is rendered in full every time (through in.RenderMemo when set); the memo saves the
// tokenization of the text between the special tokens the template writes, which for a
// follow-up turn is all but the new turns. With both memos, an iteration the render replays
// carries the IDs its output had the turn before (chat.TokenNote), checked and copied whole.
func (m *Model) EncodeChatMemo(dst []uint32, in *ChatInput, memo *Memo) ([]uint32, error) {
	tmpl, tools, kwargs := m.pickTemplate(in)
	if tmpl == nil {
		return dst[:0], fmt.Errorf("tokenize: model %q has no chat template", m.Name)
	}
	rs := m.renderPool.Get().(*renderScratch)
	var spans *[]chat.OutSpan
	if memo != nil && in.RenderMemo != nil {
		spans = &rs.spans
	}
	out, err := tmpl.Render(rs.out[:0], &chat.Input{
		Messages:             in.Messages,
		Tools:                tools,
		Kwargs:               kwargs,
		AddGenerationPrompt:  in.AddGenerationPrompt,
		ContinueFinalMessage: in.ContinueFinalMessage,
		Documents:            in.Documents,
		ReasoningEffort:      in.ReasoningEffort,
		BOSToken:             m.bos,
		EOSToken:             m.eos,
		Special:              m.special,
		Now:                  m.now,
		Memo:                 in.RenderMemo,
		MemoUse:              in.RenderUse,
		Spans:                spans,
	})
	if err == nil {
		dst, err = m.tok.appendEncode(dst[:0], unsafeString(out), memo, in.MemoUse, rs.spans)
	}
	if err != nil {
		dst = dst[:0]
	}
	clear(rs.spans) // they point into the memo: let evicted entries go
	rs.spans = rs.spans[:0]
	if cap(out) <= 1<<20 { // do not keep huge buffers around
		rs.out = out[:0]
		m.renderPool.Put(rs)
	}
	return dst, err
}

// renderScratch is one chat encode's reused buffers: the rendered text and its replayed
// iterations.
type renderScratch struct {
	out   []byte
	spans []chat.OutSpan
}

// pickTemplate chooses the template for a request (the "tool_use" one when the request has
// tools and the model has it, as transformers does) and drops JSON nulls.
func (m *Model) pickTemplate(in *ChatInput) (tmpl *chat.Template, tools, kwargs []byte) {
	tools, kwargs = in.Tools, in.TemplateKwargs
	if isNull(tools) {
		tools = nil
	}
	if isNull(kwargs) {
		kwargs = nil
	}
	tmpl = m.tmpl
	if tools != nil && m.toolTmpl != nil {
		tmpl = m.toolTmpl
	}
	return tmpl, tools, kwargs
}

// RenderChat appends the rendered chat template to dst (for debugging and the CLI).
func (m *Model) RenderChat(dst []byte, in *ChatInput) ([]byte, error) {
	tmpl, tools, kwargs := m.pickTemplate(in)
	if tmpl == nil {
		return dst, fmt.Errorf("tokenize: model %q has no chat template", m.Name)
	}
	return tmpl.Render(dst, &chat.Input{Messages: in.Messages, Tools: tools, Kwargs: kwargs,
		AddGenerationPrompt: in.AddGenerationPrompt, ContinueFinalMessage: in.ContinueFinalMessage,
		Documents: in.Documents, ReasoningEffort: in.ReasoningEffort,
		BOSToken: m.bos, EOSToken: m.eos, Special: m.special, Now: m.now})
}

// Pool holds the served models by name (and aliases). Reads are lock-free: a lookup loads
// an immutable map that writers replace (copy on write).
type Pool struct {
	mu     sync.Mutex // serializes writers
	models atomic.Pointer[map[string]*Model]
	byDir  map[string]*Tokenizer // a directory served under several names is loaded once
}

// NewPool returns an empty pool.
func NewPool() *Pool {
	p := &Pool{byDir: map[string]*Tokenizer{}}
	m := map[string]*Model{}
	p.models.Store(&m)
	return p
}

// Add loads the model in dir and serves it as name and each alias. A name already in the pool
// is an error.
func (p *Pool) Add(name, dir string, aliases ...string) error {
	if name == "" {
		return errors.New("tokenize: empty model name")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	cur := *p.models.Load()
	names := append([]string{name}, aliases...)
	for _, n := range names {
		if n == "" {
			return fmt.Errorf("tokenize: empty alias for model %q", name)
		}
		if _, dup := cur[n]; dup {
			return fmt.Errorf("tokenize: model name %q is already in the pool", n)
		}
	}
	key, err := filepath.Abs(dir)
	if err != nil {
		key = dir
	}
	var m *Model
	if tok := p.byDir[key]; tok != nil {
		m, err = newModel(name, dir, tok)
	} else {
		m, err = LoadModel(name, dir)
	}
	if err != nil {
		return err
	}
	p.byDir[key] = m.tok
	next := make(map[string]*Model, len(cur)+len(names))
	for k, v := range cur {
		next[k] = v
	}
	for _, n := range names {
		next[n] = m
	}
	p.models.Store(&next)
	return nil
}

// Get returns the model served as name, or nil.
func (p *Pool) Get(name string) *Model {
	return (*p.models.Load())[name]
}

// Names returns every name the pool serves (models and aliases), sorted.
func (p *Pool) Names() []string {
	m := *p.models.Load()
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
