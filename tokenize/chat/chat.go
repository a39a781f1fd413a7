// Package chat renders Hugging Face chat templates (Jinja2) exactly as vLLM does for
// /v1/chat/completions: transformers' apply_chat_template environment (sandboxed Jinja2 with
// trim_blocks, lstrip_blocks, loop controls, tojson, raise_exception, strftime_now) plus
// vLLM's message preprocessing (content flattened per the template's detected content format,
// tool-call arguments parsed to objects, tools as vLLM's model_dump() gives them, developer
// messages folded into system ones for templates that do not know that role).
//
// It is a small self-contained Jinja2 engine (lexer, parser, tree-walking evaluator) over an
// ordered value model, so dict key order, tojson output, Python reprs and Python string
// methods match Jinja2 byte for byte. Go Jinja ports take Go maps (unordered) as input and
// format values the Go way (sorted tojson keys, "1" for 1.0, HTML-escaped indented JSON);
// matching vLLM token for token needs Python's behaviour everywhere, so the engine is ours.
//
// Anything the engine does not implement (call blocks, with, recursive loops, rare filters,
// format specs) is an error, never a guess: the caller falls back to routing without KV keys.
// Tests compare every rendering with Python Jinja2 (tools/gen-chat-goldens.py).
package chat

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
)

// ContentFormat is how vLLM hands message content to a template.
type ContentFormat uint8

const (
	// ContentString joins text parts with "\n" into one string (most templates).
	ContentString ContentFormat = iota
	// ContentOpenAI keeps content as a list of {"type": "text", "text": ...} parts, for
	// templates that loop over message content (detected like vLLM does).
	ContentOpenAI
)

func (f ContentFormat) String() string {
	if f == ContentOpenAI {
		return "openai"
	}
	return "string"
}

// Template is a compiled chat template. It is immutable after Compile and safe for concurrent
// Render calls.
type Template struct {
	src    string
	body   []*stmt
	format ContentFormat
	// developerRole: the template names the "developer" role itself; otherwise vLLM turns
	// developer messages into system messages.
	developerRole bool
	// rootUndef: template-level locals that hide render variables until assigned.
	rootUndef []string
}

// Input is one chat request's template inputs.
type Input struct {
	// Raw JSON from the OpenAI request: "messages", "tools", "chat_template_kwargs"; nil if absent.
	Messages, Tools, Kwargs []byte
	AddGenerationPrompt     bool
	// BOSToken and EOSToken become bos_token / eos_token; an empty one is left undefined, as
	// transformers leaves a special token that is not set.
	BOSToken, EOSToken string
	// Other special-token variables from tokenizer_config.json (e.g. pad_token, unk_token).
	Special map[string]string
	// Now is the clock strftime_now reads; the zero value means time.Now().
	Now time.Time
	// Documents is the request's raw "documents" JSON (RAG templates); it overrides a
	// "documents" key in chat_template_kwargs. nil or null: none.
	Documents []byte
	// ReasoningEffort is the request's reasoning_effort ("none", "low", "high", ...); when set it
	// becomes the reasoning_effort variable, overriding chat_template_kwargs, and unless the
	// kwargs name enable_thinking, enable_thinking becomes ReasoningEffort != "none" (vLLM's
	// build_chat_params).
	ReasoningEffort string
	// ContinueFinalMessage is the request's continue_final_message: the prompt ends inside the
	// last message instead of after it (transformers cuts the rendering right after that
	// message's text). It cannot be combined with AddGenerationPrompt.
	ContinueFinalMessage bool
	// Memo, when set, lets this render replay the loop iterations and reuse the bound
	// messages of earlier renders (memo.go); the output is the same. MemoUse, when set,
	// receives what the render took from it.
	Memo    *RenderMemo
	MemoUse *MemoUse
	// Spans, when set with Memo, is reset and receives the output's replayed iterations in
	// order (memo_note.go), so that a tokenizer can reuse what it noted on them.
	Spans *[]OutSpan
}

// Compile parses a chat template once.
func Compile(source string) (*Template, error) {
	src := normalizeNewlines(source)
	body, err := parse(src)
	if err != nil {
		return nil, err
	}
	markMemoLoops(body)
	return &Template{src: src, body: body, format: detectContentFormat(body), rootUndef: analyzeScopes(body),
		developerRole: strings.Contains(source, `"developer"`) || strings.Contains(source, `'developer'`)}, nil
}

// ContentFormat reports the content format vLLM's auto-detection picks for this template.
func (t *Template) ContentFormat() ContentFormat { return t.format }

var rendererPool = sync.Pool{New: func() any {
	return &renderer{vars: make([]binding, 0, 32), frames: make([]int, 0, 8)}
}}

// Render appends the rendered prompt to dst.
func (t *Template) Render(dst []byte, in *Input) (out []byte, err error) {
	if in == nil {
		return dst, errors.New("chat: nil Input")
	}
	r := rendererPool.Get().(*renderer)
	r.t = t
	r.out = dst
	r.vars = r.vars[:0]
	r.frames = append(r.frames[:0], 0)
	r.barrier, r.visTop = 0, 0
	r.steps = 0
	r.depth = 0
	r.now = in.Now // zero: strftime_now reads the clock when a template calls it
	r.memo, r.memoUse = in.Memo, in.MemoUse
	if in.Spans != nil {
		*in.Spans = (*in.Spans)[:0]
		if in.Memo != nil {
			r.outSpans = in.Spans
		}
	}
	defer func() {
		if p := recover(); p != nil {
			// A bug in the engine must not take the proxy down; report it as an error.
			out, err = dst, fmt.Errorf("chat: internal error rendering template: %v", p)
		}
		clear(r.vars)
		if cap(r.vars) > maxKeptVars { // an unusually large request: keep no more than usual
			r.vars = make([]binding, 0, 32)
		}
		r.rootIndex = nil
		clear(r.argStack[:cap(r.argStack)])
		clear(r.kwStack[:cap(r.kwStack)])
		r.argStack, r.kwStack = r.argStack[:0], r.kwStack[:0]
		r.a.reset()
		r.t, r.out = nil, nil
		if r.memo != nil && r.memoHits|r.memoMisses != 0 {
			r.memo.hits.Add(r.memoHits)
			r.memo.misses.Add(r.memoMisses)
			r.memoHits, r.memoMisses = 0, 0
		}
		r.memo, r.memoUse, r.outSpans = nil, nil, nil
		r.recording, r.replaying, r.memoBad, r.recFrame = false, false, false, 0
		clear(r.recEv)
		r.recEv = r.recEv[:0]
		rendererPool.Put(r)
	}()
	if in.ContinueFinalMessage && in.AddGenerationPrompt {
		return dst, errors.New("chat: continue_final_message and add_generation_prompt cannot both be set")
	}
	msgs, err := t.bind(r, in)
	if err != nil {
		return dst, err
	}
	mark := len(r.out)
	if _, err := r.execBody(t.body); err != nil {
		return r.out[:mark], err
	}
	if in.ContinueFinalMessage {
		n, err := continueFinalMessage(r.out[mark:], msgs)
		if err != nil {
			return r.out[:mark], err
		}
		r.out = r.out[:mark+n]
		if r.outSpans != nil { // the cut may fall inside the last spans
			sp := *r.outSpans
			for len(sp) > 0 && sp[len(sp)-1].Start+sp[len(sp)-1].Len > len(r.out) {
				sp = sp[:len(sp)-1]
			}
			*r.outSpans = sp
		}
	}
	return r.out, nil
}

// continueFinalMessage returns how much of rendered to keep so the prompt ends right after
// the final message's text, as transformers does: find the last occurrence of the stripped
// text; keep its full (left-stripped) length when the rendering preserved it, else only the
// stripped length.
func continueFinalMessage(rendered []byte, msgs Value) (int, error) {
	if msgs.k != kList || len(msgs.lst().items) == 0 {
		return 0, errors.New("chat: continue_final_message needs a final message")
	}
	last := msgs.lst().items[len(msgs.lst().items)-1]
	c, _ := last.dct().get("content")
	final := ""
	switch c.k {
	case kString:
		final = c.s
	case kList:
		found := false
		for i := len(c.lst().items) - 1; i >= 0 && !found; i-- {
			if p := c.lst().items[i]; p.k == kDict {
				if t, ok := p.dct().get("text"); ok {
					final, found = toStr(t), true
				}
			}
		}
		if !found {
			return 0, errors.New("chat: continue_final_message is set but the final message has no text to continue")
		}
	default:
		return 0, errors.New("chat: continue_final_message is set but the final message has no text to continue")
	}
	stripped := pyStrip(final, true, true)
	loc := strings.LastIndex(string(rendered), stripped)
	if loc < 0 {
		return 0, errors.New("chat: continue_final_message is set but the final message does not appear in the rendered chat")
	}
	left := pyStrip(final, true, false)
	if end := loc + len(left); end <= len(rendered) && string(rendered[loc:end]) == final {
		return end, nil
	}
	return loc + len(stripped), nil
}

// bind sets the variables transformers passes to the template: messages, tools, documents,
// add_generation_prompt, the special tokens, the Jinja globals, then chat_template_kwargs.
func (t *Template) bind(r *renderer, in *Input) (Value, error) {
	var msgs Value
	ok := false
	if r.memo != nil {
		msgs, ok = r.bindMessagesMemo(in.Messages, t.format)
	}
	if !ok {
		var err error
		if msgs, err = preprocessMessages(&r.a, in.Messages, t.format); err != nil {
			return undefined, err
		}
	}
	var err error
	if !t.developerRole {
		msgs = developerToSystem(&r.a, msgs)
	}
	tools := none
	if len(in.Tools) > 0 {
		ok := false
		if r.memo != nil {
			tools, ok = r.boundTools(in.Tools)
		}
		if !ok {
			if tools, err = preprocessTools(&r.a, in.Tools); err != nil {
				return undefined, err
			}
		}
	}
	r.vars = append(r.vars,
		binding{"range", gRange},
		binding{"dict", gDict},
		binding{"namespace", gNamespace},
		binding{"raise_exception", gRaise},
		binding{"strftime_now", gStrftime},
	)
	for k, v := range in.Special {
		r.setVar(k, strVal(v))
	}
	if in.BOSToken != "" {
		r.setVar("bos_token", strVal(in.BOSToken))
	}
	if in.EOSToken != "" {
		r.setVar("eos_token", strVal(in.EOSToken))
	}
	// Request kwargs override the special tokens ({**special_tokens_map, **kwargs}).
	documents := none
	kwThinking := false // chat_template_kwargs names enable_thinking
	if len(in.Kwargs) > 0 {
		kw, err := parseJSONIn(&r.a, in.Kwargs)
		if err != nil {
			return undefined, fmt.Errorf("chat: chat_template_kwargs: %w", err)
		}
		switch kw.k {
		case kNone:
		case kDict:
			for i, k := range kw.dct().keys {
				switch k {
				case "chat_template", "tokenize":
					if k == "chat_template" && kw.dct().vals[i].k == kNone {
						continue // null: the model's own template, as vLLM merges it
					}
					// vLLM refuses these.
					return undefined, fmt.Errorf("chat: unexpected chat_template_kwargs key %q", k)
				case "messages", "conversation", "tools":
					// They collide with apply_chat_template's own arguments; rather than
					// guess the engine's outcome, refuse (the request falls back).
					return undefined, fmt.Errorf("chat: chat_template_kwargs key %q is not supported", k)
				case "add_generation_prompt", "continue_final_message":
					// The request's own fields override these (vLLM's merge_kwargs).
					continue
				case "documents":
					documents = kw.dct().vals[i]
					continue
				case "enable_thinking":
					kwThinking = true
				}
				r.setVar(k, kw.dct().vals[i])
			}
		default:
			return undefined, errors.New("chat: chat_template_kwargs must be a JSON object")
		}
	}
	// vLLM merges the request's own fields over chat_template_kwargs unless they are unset
	// (None or "auto").
	if len(in.Documents) > 0 {
		d, err := parseJSONIn(&r.a, in.Documents)
		if err != nil {
			return undefined, fmt.Errorf("chat: documents: %w", err)
		}
		if d.k != kNone {
			documents = d
		}
	}
	if in.ReasoningEffort != "" && in.ReasoningEffort != "auto" {
		r.setVar("reasoning_effort", strVal(in.ReasoningEffort))
		if !kwThinking {
			r.setVar("enable_thinking", boolVal(in.ReasoningEffort != "none"))
		}
	}
	r.setVar("messages", msgs)
	r.setVar("tools", tools)
	r.setVar("documents", documents)
	r.setVar("add_generation_prompt", boolVal(in.AddGenerationPrompt))
	r.bindUndef(t.rootUndef)
	return msgs, nil
}

// renderVars renders with exactly the variables of a JSON object plus the Jinja globals; the
// engine tests use it to compare plain templates with Jinja2, through memo when not nil.
func (t *Template) renderVars(dst []byte, vars []byte, now time.Time, memo *RenderMemo) (out []byte, err error) {
	v, err := parseJSON(vars)
	if err != nil {
		return dst, err
	}
	if v.k != kDict {
		return dst, errors.New("chat: vars must be a JSON object")
	}
	r := &renderer{t: t, out: dst, frames: []int{0}, now: now, memo: memo}
	defer func() {
		if p := recover(); p != nil {
			out, err = dst, fmt.Errorf("chat: internal error rendering template: %v", p)
		}
	}()
	r.vars = append(r.vars,
		binding{"range", gRange}, binding{"dict", gDict}, binding{"namespace", gNamespace},
		binding{"raise_exception", gRaise}, binding{"strftime_now", gStrftime})
	for i, k := range v.dct().keys {
		r.setVar(k, v.dct().vals[i])
	}
	r.bindUndef(t.rootUndef)
	if _, err := r.execBody(t.body); err != nil {
		return dst, err
	}
	return r.out, nil
}
