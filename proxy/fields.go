package proxy

import (
	"bytes"
	"sync"

	"github.com/kvgate/kvgate/proxy/openai"
	"github.com/kvgate/kvgate/tokenize"
)

// fields.go: the request fields and shapes that change the prompt an engine builds beyond
// plain text messages or one prompt string. Each yields the engine's exact keys, keys of an
// exact prefix (counted as partial), or an explicit counted miss; never keys of a prompt
// the engine does not run. Engine facts: docs/CONTRACTS.md, "Request fields".

// requestTemplate reports that the request brings its own chat template (top-level
// chat_template, or chat_template_kwargs.chat_template). vLLM refuses such a request
// unless it runs with --trust-request-chat-template, and with it renders the client's
// template: kvgate would need to compile an arbitrary template per request, so it counts
// kv-miss:request_template instead of keying the model's own template.
func requestTemplate(oa *openai.Request, b []byte) bool {
	if oa.Value[openai.FChatTemplate].Present() {
		return true
	}
	if kw := oa.Value[openai.FChatTemplateKwargs]; kw.Present() {
		if v := openai.Path(kw.Bytes(b), "chat_template"); len(v) > 0 && v[0] != 'n' {
			return true
		}
	}
	return false
}

// reasoningEffort returns the request's reasoning_effort as one of the values vLLM's
// ChatCompletionRequest accepts ("" when absent); ok is false for any other value, which
// the engine refuses, so kvgate does not key it.
func reasoningEffort(oa *openai.Request, b []byte) (effort string, ok bool) {
	v := oa.Value[openai.FReasoningEffort]
	if !v.Present() {
		return "", true
	}
	q := v.Bytes(b)
	for _, e := range reasoningEfforts {
		if len(q) == len(e)+2 && string(q[1:len(q)-1]) == e {
			return e, true
		}
	}
	return "", false
}

var reasoningEfforts = [...]string{"none", "minimal", "low", "medium", "high", "xhigh", "max"}

// tokenizeChat turns a chat (or Responses) body into st.tokens with every request field
// the engine applies; missed: d holds the miss.
func (k *kvRouter) tokenizeChat(st *reqState, d *decision, model *tokenize.Model) (missed bool, err error) {
	oa, b := &st.oa, st.body
	var in tokenize.ChatInput
	sglang, mixed := k.sglangPool()
	if isResponses(oa) {
		if sglang { // SGLang's /v1/responses builds its own conversation
			k.miss(st, d, RouteMissResponses)
			return true, nil
		}
		var ok bool
		if st.legA, st.legB, in.ContinueFinalMessage, ok = responsesChat(st.legA, st.legB, oa, b); !ok {
			k.miss(st, d, RouteMissResponses)
			return true, nil
		}
		in.Messages, in.TemplateKwargs, in.AddGenerationPrompt = st.legA, st.legB, !in.ContinueFinalMessage
	} else {
		if requestTemplate(oa, b) {
			k.miss(st, d, RouteMissRequestTemplate)
			return true, nil
		}
		if sglang && (sglangCannot(oa, b) || mixed && sglangDiffers(oa, b)) {
			k.miss(st, d, RouteMissEngineFields)
			return true, nil
		}
		effort, ok := reasoningEffort(oa, b)
		if !ok {
			k.miss(st, d, RouteMissTokenize)
			return true, nil
		}
		chatInput(&in, oa, b, effort)
	}
	addSpecial := boolField(oa.Value[openai.FAddSpecialTokens].Bytes(b), false)
	if sglang && !isResponses(oa) {
		// SGLang alone: render its way (see sglangPool).
		in.Documents, in.AddGenerationPrompt, addSpecial = nil, true, false
		if oa.Value[openai.FToolChoice].Present() && string(oa.Value[openai.FToolChoice].Bytes(b)) == `"none"` {
			in.Tools = nil
		}
	}
	if missed, err = k.encodeChat(st, d, model, &in, addSpecial); missed || err != nil {
		return missed, err
	}
	return k.truncated(st, d), nil
}

// SGLang renders chat requests its own way (python/sglang/srt/entrypoints/openai/
// serving_chat.py, _apply_jinja_template): add_generation_prompt is always true, documents
// are not passed, add_special_tokens is not the request's, tools are dropped for
// tool_choice "none" (and otherwise dumped by SGLang's own models, filtered to a named
// tool), continue_final_message re-appends the final assistant message after rendering,
// and reasoning_effort (and a "reasoning" object) follow SGLang's own mapping. In a rule
// whose KV endpoints are all SGLang, kvgate renders the first four its way and counts the
// rest as kv-miss:engine_fields; in a rule mixing vLLM and SGLang endpoints one set of keys
// cannot serve both, so any of them is kv-miss:engine_fields.

// sglangPool reports that some KV endpoint of the rule is SGLang, and whether vLLM
// endpoints are there too.
func (k *kvRouter) sglangPool() (sglang, mixed bool) {
	vllm := false
	for i := range k.s.cfg.Fleet.Endpoints {
		switch k.s.cfg.Fleet.Endpoints[i].Engine {
		case EngineSGLang:
			sglang = true
		case EngineVLLM:
			vllm = true
		}
	}
	return sglang, sglang && vllm
}

// sglangCannot: the request uses a chat field kvgate does not render SGLang's way.
func sglangCannot(oa *openai.Request, b []byte) bool {
	if oa.Value[openai.FReasoningEffort].Present() || oa.Value[openai.FReasoning].Present() || oa.ContinueFinalMessage {
		return true
	}
	if t := oa.Value[openai.FTools]; t.Present() && openai.FirstElement(t.Bytes(b)) != nil {
		c := oa.Value[openai.FToolChoice]
		return !c.Present() || string(c.Bytes(b)) != `"none"`
	}
	return false
}

// sglangDiffers: the request uses a chat field SGLang renders differently from vLLM.
func sglangDiffers(oa *openai.Request, b []byte) bool {
	return sglangCannot(oa, b) || oa.Value[openai.FDocuments].Present() || !oa.AddGenerationPrompt ||
		boolField(oa.Value[openai.FAddSpecialTokens].Bytes(b), false) ||
		oa.Value[openai.FTools].Present() && openai.FirstElement(oa.Value[openai.FTools].Bytes(b)) != nil
}

// boolField reads a JSON boolean member (already checked to be true or false) or its default.
func boolField(v []byte, def bool) bool {
	if len(v) == 0 {
		return def
	}
	return v[0] == 't'
}

// truncated applies truncate_prompt_tokens (chat and completions) and the Responses
// truncation: the engine keeps N tokens of the prompt, from the end or the start depending on
// the request's truncation_side and its tokenizer's own (HF encode truncates with the
// tokenizer's side before vLLM's own cut), and -1 or "auto" means the model's context less
// max_tokens, which kvgate does not know. kvgate keys the prompt only when nothing is cut
// (N >= its length); otherwise kv-miss:truncated.
func (k *kvRouter) truncated(st *reqState, d *decision) bool {
	oa := &st.oa
	if t := oa.Value[openai.FTruncation]; t.Present() && isResponses(oa) && string(t.Bytes(st.body)) != `"disabled"` {
		st.tokens = st.tokens[:0]
		k.miss(st, d, RouteMissTruncated)
		return true
	}
	v := oa.Value[openai.FTruncatePromptTokens]
	if !v.Present() {
		return false
	}
	if n, ok := openai.Int(v.Bytes(st.body)); ok && n >= 0 && n >= int64(len(st.tokens)) {
		return false
	}
	st.tokens = st.tokens[:0]
	k.miss(st, d, RouteMissTruncated)
	return true
}

// chatInput gathers every request field the engine hands its chat template.
func chatInput(in *tokenize.ChatInput, oa *openai.Request, b []byte, effort string) {
	*in = tokenize.ChatInput{
		Messages:             oa.Value[openai.FMessages].Bytes(b),
		Tools:                oa.Value[openai.FTools].Bytes(b),
		TemplateKwargs:       oa.Value[openai.FChatTemplateKwargs].Bytes(b),
		Documents:            oa.Value[openai.FDocuments].Bytes(b),
		ReasoningEffort:      effort,
		AddGenerationPrompt:  oa.AddGenerationPrompt,
		ContinueFinalMessage: oa.ContinueFinalMessage,
	}
	if oa.ContinueFinalMessage && !oa.Value[openai.FAddGenerationPrompt].Present() {
		// vLLM wants add_generation_prompt=false beside it; an unset one yields,
		// exactly as `kvgate tokenize` does.
		in.AddGenerationPrompt = false
	}
}

// Batch prompts. /v1/completions takes a list of prompts (strings or token lists) and the
// engine runs each element as its own request, all on the endpoint kvgate picks for the
// body. kvgate keys the first element only and counts the others
// (kvgate_kv_batch_unkeyed_prompts_total):
//   - the elements of a batch usually share their prefix (the same instructions or
//     few-shot examples with different questions), and the first element's keys carry it;
//   - the engine schedules the elements in order, so the first one's cache is the one
//     the rest reuse from once it is prefilled;
//   - summing every element's overlap would be the better rule for unrelated batches,
//     but costs one tokenize+hash+score per element and a scoring step that accumulates
//     over several chains (kv.go's scoring); it stays a follow-up.

// countBatch counts the elements of a batch prompt past the first, which are not keyed.
func (k *kvRouter) countBatch(st *reqState, prompt []byte) {
	if st.obs != nil {
		return
	}
	n := -1
	openai.Elements(prompt, func([]byte) bool { n++; return true })
	if n > 0 {
		k.s.m.set.GetOrCreateCounter("kvgate_kv_batch_unkeyed_prompts_total").Add(n)
	}
}

// Multimodal content. The tokens of a media item (image, audio, video, embeddings) depend
// on the engine's processor, and vLLM's block keys past it carry the item's identifier in
// extra_keys. kvgate keys only what lies wholly before the first media item: it renders
// the conversation with the media replaced by a sentinel, cuts the rendering at the first
// sentinel and tokenizes that prefix. Where the sentinel goes follows vLLM's content
// formats: with "openai" (the template loops over parts) each media part becomes a
// sentinel text part in place, so the cut sits where the template renders the first media
// part; with "string" vLLM puts a message's placeholders in front of its text, so the whole
// content of the first message holding media becomes the sentinel and the cut sits at the
// start of that content. The prefix's last token is dropped:
// a tokenizer may merge it with the text that follows in the engine's prompt. Keys past
// the first media item are not computed, even with a client "uuid" (vLLM's per-item
// identifier): the engine's processor expands each placeholder into a number of tokens set
// by the item's pixels or samples (e.g. Qwen2-VL's resize of the image), so kvgate, which
// never decodes media, cannot know where any later block starts.

// mediaSentinel marks the cut; a request that contains it is not keyed.
const mediaSentinel = "\u2063kvgate:media-cut\u2063"

// textPart: the content-part types vLLM parses as text. Any other part (and any part
// carrying a media member) is cut at like media: unknown types too, since what precedes
// them is still rendered the same.
func textPart(typ []byte) bool {
	switch string(typ) {
	case `"text"`, `"input_text"`, `"output_text"`, `"refusal"`, `"thinking"`:
		return true
	}
	return false
}

var mediaKeys = [...]string{"image_url", "input_image", "image_pil", "image_embeds", "audio_url",
	"input_audio", "audio_embeds", "video_url", "video_embeds", "prompt_embeds"}

func mediaPart(p []byte) bool {
	if len(p) == 0 || p[0] != '{' {
		return false
	}
	for _, k := range mediaKeys {
		if _, _, ok := openai.Member(p, k); ok {
			return true
		}
	}
	s, e, ok := openai.Member(p, "type")
	return ok && !textPart(p[s:e])
}

// offsetIn is where sub (a subslice of parent) starts in parent.
func offsetIn(parent, sub []byte) int { return cap(parent) - cap(sub) }

// cutMessages appends to dst the messages array with every media part replaced by a
// sentinel text part and, unless inPlace, the whole content of the first message holding
// media replaced by the sentinel string. found is false when no message holds media.
func cutMessages(dst, msgs []byte, inPlace bool) (out []byte, found bool) {
	out = dst
	pos := 0 // msgs[:pos] is copied
	openai.Elements(msgs, func(m []byte) bool {
		cs, ce, ok := openai.Member(m, "content")
		if !ok || m[cs] != '[' {
			return true
		}
		content := m[cs:ce]
		base := offsetIn(msgs, m)
		if !found && !inPlace {
			has := false
			openai.Elements(content, func(p []byte) bool { has = mediaPart(p); return !has })
			if !has {
				return true
			}
			found = true
			out = append(out, msgs[pos:base+cs]...)
			out = append(out, `"`+mediaSentinel+`"`...)
			pos = base + ce
			return true
		}
		openai.Elements(content, func(p []byte) bool {
			if mediaPart(p) {
				found = true
				ps := offsetIn(msgs, p)
				out = append(out, msgs[pos:ps]...)
				out = append(out, `{"type":"text","text":"`+mediaSentinel+`"}`...)
				pos = ps + len(p)
			}
			return true
		})
		return true
	})
	if !found {
		return dst, false
	}
	return append(out, msgs[pos:]...), true
}

var renderPool = sync.Pool{New: func() any { b := make([]byte, 0, 16<<10); return &b }}

// mediaCut says how encodeMediaPrefix went.
type mediaCut uint8

const (
	noMedia    mediaCut = iota // no message holds media: the rendering failed for another reason
	mediaUncut                 // media, but the cut cannot be placed (sentinel in the request, or dropped by the template)
	mediaKeyed                 // tokens hold the prompt up to the first media item
)

// encodeMediaPrefix appends to dst[:0] the tokens of the prompt up to the first media item
// (less its last token); scratch holds the rewritten messages.
func encodeMediaPrefix(dst []uint32, scratch []byte, model *tokenize.Model, in *tokenize.ChatInput) ([]uint32, []byte, mediaCut) {
	msgs, found := cutMessages(scratch[:0], in.Messages, model.ChatKeepsParts(in))
	if !found {
		return dst[:0], msgs, noMedia
	}
	if bytes.Contains(in.Messages, []byte("kvgate:media-cut")) {
		return dst[:0], msgs, mediaUncut
	}
	cut := *in
	cut.Messages = msgs
	cut.ContinueFinalMessage = false // the cut lies before the final message's end
	bp := renderPool.Get().(*[]byte)
	r, err := model.RenderChat((*bp)[:0], &cut)
	defer func() {
		if cap(r) <= 1<<20 { // do not keep huge buffers around
			*bp = r[:0]
			renderPool.Put(bp)
		}
	}()
	if err != nil {
		return dst[:0], msgs, mediaUncut
	}
	i := bytes.Index(r, []byte(mediaSentinel))
	if i < 0 {
		return dst[:0], msgs, mediaUncut
	}
	tokens, err := model.Tokenizer().Encode(dst[:0], bstr(r[:i]), false)
	if err != nil {
		return dst[:0], msgs, mediaUncut
	}
	if len(tokens) > 0 {
		tokens = tokens[:len(tokens)-1]
	}
	return tokens, msgs, mediaKeyed
}

// encodeChat renders and tokenizes a conversation into st.tokens. One holding media (which
// the text renderer refuses) is keyed up to its first media item, or missed as
// kv-miss:media (missed: d holds the miss).
//
// addSpecial is the request's add_special_tokens: vLLM then encodes the rendered prompt as
// a completions prompt (BOS and the like added on top of the template's own).
func (k *kvRouter) encodeChat(st *reqState, d *decision, model *tokenize.Model, in *tokenize.ChatInput, addSpecial bool) (missed bool, err error) {
	if addSpecial {
		bp := renderPool.Get().(*[]byte)
		r, rerr := model.RenderChat((*bp)[:0], in)
		if rerr == nil {
			st.tokens, err = model.EncodePrompt(st.tokens, bstr(r))
		}
		if cap(r) <= 1<<20 {
			*bp = r[:0]
			renderPool.Put(bp)
		}
		if rerr == nil {
			return false, err
		}
		if _, found := cutMessages(st.out[:0], in.Messages, false); !found {
			return false, rerr
		}
		// Media with add_special_tokens: the prefix's special tokens are not worked out.
		st.tokens = st.tokens[:0]
		k.miss(st, d, RouteMissMedia)
		return true, nil
	}
	in.RenderMemo = k.render
	if st.obs != nil { // /debug/explain says what came from the memos
		in.MemoUse, in.RenderUse = &st.memoUse, &st.renderUse
	}
	if st.tokens, err = model.EncodeChatMemo(st.tokens, in, k.memo); err == nil {
		return false, nil
	}
	var cut mediaCut
	if st.tokens, st.out, cut = encodeMediaPrefix(st.tokens, st.out, model, in); cut == noMedia {
		return false, err
	}
	if cut == mediaUncut || len(st.tokens) < k.blockSize {
		st.tokens = st.tokens[:0]
		k.miss(st, d, RouteMissMedia)
		return true, nil
	}
	k.countPartial(st)
	return false, nil
}

// countPartial records a prompt keyed only up to its first media item: requests, and
// tokens keyed. The prompt's full length is known only to the engine (its processor
// expands each item), reported back in usage.prompt_tokens.
func (k *kvRouter) countPartial(st *reqState) {
	if st.obs != nil {
		return
	}
	set := k.s.m.set
	set.GetOrCreateCounter(`kvgate_kv_partial_prompts_total{cut="media"}`).Inc()
	set.GetOrCreateCounter(`kvgate_kv_partial_keyed_tokens_total{cut="media"}`).Add(len(st.tokens))
}

// The Responses API (/v1/responses). vLLM builds the chat conversation from the body and
// renders it with the model's template (responses/utils.py construct_input_messages,
// ResponsesRequest.build_chat_params): a system message from "instructions", the stored
// history of previous_response_id, then "input" (a string is one user message; items of
// type "message" pass through, an assistant message keeps its first content part's text);
// add_generation_prompt unless the last item is a message in progress (then
// continue_final_message), and reasoning.effort as the reasoning_effort variable (no
// enable_thinking, unlike chat). kvgate keys that exactly when the body holds the whole
// conversation; server-side history (previous_response_id, previous_response,
// previous_input_messages), tools, and items other than messages (function calls and
// outputs, reasoning) are kv-miss:responses.

// isResponses: a body routed as chat that carries a Responses "input" instead of messages.
func isResponses(oa *openai.Request) bool {
	return !oa.Value[openai.FMessages].Present() && oa.Value[openai.FInput].Present()
}

// responsesChat appends to msgs[:0] the chat messages vLLM renders for a Responses body and
// to kwargs[:0] its template kwargs ({"reasoning_effort": ...} or empty); ok is false for a
// body kvgate does not key exactly.
func responsesChat(msgs, kwargs []byte, oa *openai.Request, b []byte) (m, kw []byte, continueFinal, ok bool) {
	m, kw = msgs[:0], kwargs[:0]
	if oa.Value[openai.FPreviousResponseID].Present() || oa.Value[openai.FPreviousResponse].Present() ||
		oa.Value[openai.FPreviousInputMessages].Present() {
		return m, kw, false, false
	}
	if t := oa.Value[openai.FTools]; t.Present() && openai.FirstElement(t.Bytes(b)) != nil {
		return m, kw, false, false
	}
	m = append(m, '[')
	if in := oa.Value[openai.FInstructions]; in.End-in.Start > 2 { // a non-empty string
		m = append(m, `{"role":"system","content":`...)
		m = append(m, in.Bytes(b)...)
		m = append(m, '}')
	}
	input := oa.Value[openai.FInput].Bytes(b)
	if input[0] == '"' {
		if len(m) > 1 {
			m = append(m, ',')
		}
		m = append(m, `{"role":"user","content":`...)
		m = append(m, input...)
		m = append(m, '}')
	} else {
		ok = true
		var last []byte
		openai.Elements(input, func(item []byte) bool {
			if m, ok = appendResponsesItem(m, item); !ok {
				return false
			}
			last = item
			return true
		})
		if !ok || last == nil {
			return m, kw, false, false
		}
		if s, e, has := openai.Member(last, "status"); has {
			st := last[s:e]
			continueFinal = string(st) == `"in_progress"` || string(st) == `"incomplete"`
		}
	}
	m = append(m, ']')
	if r := oa.Value[openai.FReasoning]; r.Present() {
		if e := openai.Path(r.Bytes(b), "effort"); len(e) > 0 && e[0] == '"' {
			kw = append(kw, `{"reasoning_effort":`...)
			kw = append(kw, e...)
			kw = append(kw, '}')
		}
	}
	return m, kw, continueFinal, true
}

// appendResponsesItem appends one input item as a chat message (after a comma when m holds
// one already); ok is false for an item kvgate does not key.
func appendResponsesItem(m, item []byte) ([]byte, bool) {
	if len(item) == 0 || item[0] != '{' {
		return m, false
	}
	if s, e, has := openai.Member(item, "type"); has && string(item[s:e]) != `"message"` {
		return m, false // function_call, function_call_output, reasoning, ...
	}
	rs, re, has := openai.Member(item, "role")
	if !has {
		return m, false
	}
	if m[len(m)-1] != '[' {
		m = append(m, ',')
	}
	if string(item[rs:re]) != `"assistant"` {
		return append(m, item...), true // user, system, developer: as sent
	}
	// An assistant message keeps the text of its first content part only.
	text := []byte(`""`)
	if cs, ce, has := openai.Member(item, "content"); has {
		switch c := item[cs:ce]; c[0] {
		case '"':
			text = c
		case '[':
			if first := openai.FirstElement(c); len(first) > 0 {
				switch first[0] {
				case '"':
					text = first
				case '{':
					if t := openai.Path(first, "text"); len(t) > 0 && t[0] == '"' {
						text = t
					}
				}
			}
		}
	}
	m = append(m, `{"role":"assistant","content":`...)
	m = append(m, text...)
	return append(m, '}'), true
}
