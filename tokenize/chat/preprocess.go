package chat

import (
	"errors"
	"fmt"
	"strings"
	"unsafe"
)

// preprocessMessages turns the request's messages into the conversation vLLM hands to the
// template (vllm/entrypoints/chat_utils.py, parse_chat_messages):
//   - each message becomes {"role", "content", ...} with the extra keys in vLLM's order:
//     assistant "tool_calls" (when present and not null), "reasoning" and "reasoning_content"
//     (from "reasoning", else the deprecated input "reasoning_content"), tool "tool_call_id",
//     then "name";
//   - content: a string or a list of text parts; absent/null content is an empty part list.
//     Format "string" joins the texts with "\n"; "openai" keeps [{"type":"text","text":...}]
//     (tool messages are flattened back to a string unless a part is not text);
//   - assistant tool-call "arguments" JSON strings become objects ({} when not valid JSON);
//     an empty tool_calls list is dropped.
func preprocessMessages(a *arena, raw []byte, format ContentFormat) (Value, error) {
	if len(raw) == 0 {
		return undefined, errors.New("chat: request has no messages")
	}
	v, err := parseJSONIn(a, raw)
	if err != nil {
		return undefined, fmt.Errorf("chat: messages: %w", err)
	}
	if v.k != kList {
		return undefined, errors.New("chat: messages must be a JSON array")
	}
	out := a.valSlice(len(v.lst().items))
	for i, m := range v.lst().items {
		cm, err := convertMessage(a, m, format)
		if err != nil {
			return undefined, fmt.Errorf("chat: messages[%d]: %w", i, err)
		}
		out[i] = cm
	}
	return a.list(out, false), nil
}

func convertMessage(a *arena, m Value, format ContentFormat) (Value, error) {
	if m.k != kDict {
		return undefined, errors.New("message must be an object")
	}
	role, ok := m.dct().get("role")
	if !ok || role.k != kString {
		return undefined, errors.New(`message needs a string "role"`)
	}
	// The common message, {"role": "user" or "assistant", "content": "text"}, in the string
	// format is what vLLM hands the template with role first: in that order the parsed dict
	// is kept (values are never mutated); the other order is rebuilt without the general
	// path's lookups of every optional key.
	if md := m.dct(); format == ContentString && len(md.keys) == 2 && (role.s == "user" || role.s == "assistant") {
		switch {
		case md.keys[0] == "role" && md.keys[1] == "content" && md.vals[1].k == kString:
			return m, nil
		case md.keys[0] == "content" && md.keys[1] == "role" && md.vals[0].k == kString:
			d := a.dict(2)
			d.set("role", role)
			d.set("content", md.vals[0])
			return dictValue(d), nil
		}
	}
	texts, srcs, err := contentTexts(a, m, role.s == "system")
	if err != nil {
		return undefined, err
	}
	d := a.dict(6)
	d.set("role", role)
	if format == ContentOpenAI {
		parts := a.valSlice(len(texts))
		for i, t := range texts {
			src := srcs[i]
			n := 2
			if src.k == kDict {
				n += len(src.dct().keys)
			}
			p := a.dict(n)
			p.set("type", strVal("text"))
			p.set("text", strVal(t))
			if src.k == kDict {
				// Fields no content-part type defines (e.g. cache_control) ride along.
				for j, k := range src.dct().keys {
					if !knownPartField(k) {
						p.set(k, src.dct().vals[j])
					}
				}
			}
			parts[i] = dictValue(p)
		}
		if role.s == "tool" {
			// vLLM flattens all-text tool content back to one string.
			d.set("content", strVal(joinLines(texts)))
		} else {
			d.set("content", a.list(parts, false))
		}
	} else {
		d.set("content", strVal(joinLines(texts)))
	}
	switch role.s {
	case "assistant":
		if tc, ok := m.dct().get("tool_calls"); ok && tc.k != kNone {
			calls, err := convertToolCalls(a, tc)
			if err != nil {
				return undefined, err
			}
			if len(calls.lst().items) > 0 {
				d.set("tool_calls", calls)
			}
		}
		rs, ok := m.dct().get("reasoning")
		if !ok || rs.k == kNone {
			// vLLM renames the deprecated reasoning_content to reasoning when reasoning is unset.
			rs, ok = m.dct().get("reasoning_content")
		}
		if ok && rs.k != kNone {
			d.set("reasoning", rs)
			d.set("reasoning_content", rs)
		}
	case "tool":
		if id, ok := m.dct().get("tool_call_id"); ok {
			d.set("tool_call_id", id)
		}
	}
	if name, ok := m.dct().get("name"); ok && name.k == kString {
		d.set("name", name)
	}
	if task, ok := m.dct().get("task"); ok && task.k == kString {
		d.set("task", task)
	}
	if role.s == "developer" {
		tools, ok := m.dct().get("tools")
		if !ok {
			tools = none
		}
		d.set("tools", tools)
	}
	return dictValue(d), nil
}

// developerToSystem is what vLLM does when a conversation has a "developer" message and the
// template never mentions that role: developer messages become system messages (without
// "tools"), and when a system message then sits anywhere but first (or there are several),
// all system contents merge, "\n\n"-joined, into one {"role", "content"} message in front.
func developerToSystem(a *arena, msgs Value) Value {
	items := msgs.lst().items
	hasDev := false
	for _, m := range items {
		if r, _ := m.dct().get("role"); r.s == "developer" {
			hasDev = true
		}
	}
	if !hasDev {
		return msgs
	}
	conv := a.valSlice(len(items))
	for i, m := range items {
		if r, _ := m.dct().get("role"); r.s == "developer" {
			d := a.dict(len(m.dct().keys))
			for j, k := range m.dct().keys {
				if k != "tools" {
					d.set(k, m.dct().vals[j])
				}
			}
			d.set("role", strVal("system"))
			m = dictValue(d)
		}
		conv[i] = m
	}
	var sys []string
	var rest []Value
	merge := false
	for i, m := range conv {
		if r, _ := m.dct().get("role"); r.s != "system" {
			rest = append(rest, m)
			continue
		}
		if i > 0 || len(sys) > 0 {
			merge = true
		}
		c, _ := m.dct().get("content")
		text := ""
		switch c.k {
		case kString:
			text = c.s
		case kList:
			var parts []string
			for _, p := range c.lst().items {
				switch p.k {
				case kDict:
					if t, ok := p.dct().get("text"); ok {
						parts = append(parts, toStr(t))
					}
				case kString:
					parts = append(parts, p.s)
				}
			}
			text = joinLines(parts)
		default:
			if c.k != kUndefined && c.k != kNone {
				text = toStr(c)
			}
		}
		if text != "" {
			sys = append(sys, text)
		}
	}
	if !merge {
		return a.list(conv, false)
	}
	d := a.dict(2)
	d.set("role", strVal("system"))
	d.set("content", strVal(strings.Join(sys, "\n\n")))
	return a.list(append([]Value{dictValue(d)}, rest...), false)
}

func joinLines(texts []string) string {
	switch len(texts) {
	case 0:
		return ""
	case 1:
		return texts[0]
	}
	n := len(texts) - 1
	for _, t := range texts {
		n += len(t)
	}
	b := make([]byte, 0, n)
	for i, t := range texts {
		if i > 0 {
			b = append(b, '\n')
		}
		b = append(b, t...)
	}
	return string(b)
}

// knownPartField: the keys some OpenAI/vLLM content-part type defines; any other key of a
// text part is copied into the part vLLM hands to "openai"-format templates.
func knownPartField(k string) bool {
	switch k {
	case "type", "text", "image_url", "input_audio", "file", "audio_url", "video_url", "refusal",
		"image_pil", "uuid", "image_embeds", "audio_embeds", "video_embeds", "data", "name",
		"thinking", "closed":
		return true
	}
	return false
}

// claudeBillingHeader starts a line Claude Code puts in system prompts; vLLM drops that line
// (it changes on every request and would defeat the prefix cache).
const claudeBillingHeader = "x-anthropic-billing-header"

// stripBillingHeader applies vLLM's rule to one system text part: drop the header line, and
// the whole part when nothing follows it.
func stripBillingHeader(t string) (string, bool) {
	if !strings.HasPrefix(t, claudeBillingHeader) {
		return t, true
	}
	i := strings.IndexByte(t, '\n')
	if i < 0 || i == len(t)-1 {
		return "", false
	}
	return t[i+1:], true
}

// contentTexts returns the text parts of a message's content and, per part, the part object
// it came from (undefined for a string). Parts that are not text (images, audio) cannot be
// routed by a text tokenizer and are refused.
func contentTexts(a *arena, m Value, system bool) ([]string, []Value, error) {
	c, _ := m.dct().get("content")
	switch c.k {
	case kUndefined, kNone:
		return nil, nil, nil
	case kString:
		t := c.s
		if system {
			var keep bool
			if t, keep = stripBillingHeader(t); !keep {
				return nil, nil, nil
			}
		}
		ts := a.strSlice(1)
		ts[0] = t
		srcs := a.valSlice(1)
		return ts, srcs, nil
	case kList:
		texts := a.strSlice(len(c.lst().items))[:0]
		srcs := a.valSlice(len(c.lst().items))[:0]
		for i, p := range c.lst().items {
			switch p.k {
			case kString:
				t := p.s
				if system {
					var keep bool
					if t, keep = stripBillingHeader(t); !keep {
						continue
					}
				}
				texts = append(texts, t)
				srcs = append(srcs, undefined)
				continue
			case kDict:
			default:
				return nil, nil, fmt.Errorf("content[%d] must be a string or an object", i)
			}
			typ, _ := p.dct().get("type")
			field := ""
			switch typ.s {
			case "text", "input_text", "output_text":
				field = "text"
			case "refusal":
				field = "refusal"
			case "thinking":
				field = "thinking"
			default:
				return nil, nil, fmt.Errorf("content[%d]: unsupported content part type %q for text routing", i, typ.s)
			}
			t, _ := p.dct().get(field)
			switch t.k {
			case kUndefined, kNone:
				continue // vLLM skips text parts without text
			case kString:
				s := t.s
				if system && typ.s == "text" {
					var keep bool
					if s, keep = stripBillingHeader(s); !keep {
						continue
					}
				}
				texts = append(texts, s)
				srcs = append(srcs, p)
			default:
				return nil, nil, fmt.Errorf("content[%d].%s must be a string", i, field)
			}
		}
		return texts, srcs, nil
	}
	return nil, nil, errors.New(`"content" must be a string, an array of parts or null`)
}

func convertToolCalls(a *arena, tc Value) (Value, error) {
	if tc.k != kList {
		return undefined, errors.New(`"tool_calls" must be an array`)
	}
	out := a.valSlice(len(tc.lst().items))
	for i, call := range tc.lst().items {
		if call.k != kDict {
			return undefined, fmt.Errorf("tool_calls[%d] must be an object", i)
		}
		fn, ok := call.dct().get("function")
		if typ, has := call.dct().get("type"); (has && (typ.k != kString || typ.s != "function")) || !ok || fn.k != kDict {
			return undefined, fmt.Errorf(`tool_calls[%d] must be of type "function" with a "function" object`, i)
		}
		// Arguments become an object: a JSON string is parsed, and anything that is not (or
		// does not decode to) an object becomes {}.
		args, _ := fn.dct().get("arguments")
		parsed := args
		switch {
		case !args.truth():
			parsed = dictValue(a.dict(0))
		case args.k == kString:
			// args.s may point into the request bytes, which stay put during Render.
			v, err := parseJSONIn(a, unsafe.Slice(unsafe.StringData(args.s), len(args.s)))
			if err != nil || v.k != kDict {
				v = dictValue(a.dict(0))
			}
			parsed = v
		case args.k != kDict:
			parsed = dictValue(a.dict(0))
		}
		nf := a.dict(len(fn.dct().keys))
		for j, k := range fn.dct().keys {
			nf.set(k, fn.dct().vals[j])
		}
		nf.set("arguments", parsed)
		nc := a.dict(len(call.dct().keys))
		for j, k := range call.dct().keys {
			nc.set(k, call.dct().vals[j])
		}
		nc.set("function", dictValue(nf))
		out[i] = dictValue(nc)
	}
	return a.list(out, false), nil
}

// preprocessTools mirrors vLLM's tool.model_dump(): each tool becomes {"type", "function":
// {"name", "description", "parameters", extras...}, extras...}, with null for an absent
// description or parameters.
func preprocessTools(a *arena, raw []byte) (Value, error) {
	v, err := parseJSONIn(a, raw)
	if err != nil {
		return undefined, fmt.Errorf("chat: tools: %w", err)
	}
	if v.k == kNone {
		return none, nil
	}
	if v.k != kList {
		return undefined, errors.New("chat: tools must be a JSON array")
	}
	out := a.valSlice(len(v.lst().items))
	for i, t := range v.lst().items {
		if t.k != kDict {
			return undefined, fmt.Errorf("chat: tools[%d] must be an object", i)
		}
		fn, ok := t.dct().get("function")
		if !ok || fn.k != kDict {
			return undefined, fmt.Errorf(`chat: tools[%d] needs a "function" object`, i)
		}
		name, ok := fn.dct().get("name")
		if !ok || name.k != kString {
			return undefined, fmt.Errorf(`chat: tools[%d].function needs a string "name"`, i)
		}
		nf := a.dict(len(fn.dct().keys) + 2)
		nf.set("name", name)
		for _, k := range [...]string{"description", "parameters"} {
			x, ok := fn.dct().get(k)
			if !ok {
				x = none
			}
			nf.set(k, x)
		}
		for j, k := range fn.dct().keys {
			nf.set(k, fn.dct().vals[j])
		}
		typ, ok := t.dct().get("type")
		if !ok {
			typ = strVal("function")
		}
		if typ.k != kString || typ.s != "function" {
			return undefined, fmt.Errorf(`chat: tools[%d].type must be "function"`, i)
		}
		nt := a.dict(len(t.dct().keys) + 1)
		nt.set("type", typ)
		nt.set("function", dictValue(nf))
		for j, k := range t.dct().keys {
			if k != "function" {
				nt.set(k, t.dct().vals[j])
			}
		}
		out[i] = dictValue(nt)
	}
	return a.list(out, false), nil
}
