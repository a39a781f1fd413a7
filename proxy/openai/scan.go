// Package openai finds the routing-relevant fields of an OpenAI-style request body
// without building a tree: one pass over the bytes records spans, validates the JSON,
// and allocates nothing. Tokenizers and templates take the raw spans from here.
package openai

import (
	"errors"

	"github.com/kvgate/kvgate/internal/jsonlex"
)

// MaxDepth bounds nesting so a hostile body cannot drive the scanner deep.
const MaxDepth = 128

// Errors are values so callers can count them by kind without allocating.
var (
	ErrSyntax   = errors.New("malformed JSON")
	ErrNotObj   = errors.New("request body must be a JSON object")
	ErrDepth    = errors.New("JSON nested too deeply")
	ErrUTF8     = errors.New("invalid UTF-8 in JSON string")
	ErrType     = errors.New("field has the wrong JSON type")
	ErrTrailing = errors.New("trailing data after JSON value")
)

// Span is a half-open byte range [Start, End) of the body. A zero Span is absent.
type Span struct{ Start, End int32 }

// Present says whether the field appeared in the body.
func (s Span) Present() bool { return s.End > s.Start }

// Bytes returns the span's bytes within body.
func (s Span) Bytes(body []byte) []byte { return body[s.Start:s.End] }

// PromptKind says what the "prompt" field holds.
type PromptKind uint8

const (
	PromptNone    PromptKind = iota
	PromptString             // "text"
	PromptStrings            // ["text", ...] (a batch: routing uses the first)
	PromptTokens             // [1, 2, 3]
	PromptBatch              // [[1,2],[3]] (a batch of token lists: routing uses the first)
)

// Field indexes the top-level members kvgate reads or rewrites.
type Field uint8

const (
	FModel Field = iota
	FPrompt
	FMessages
	FTools
	FChatTemplateKwargs
	FCacheSalt
	FStream
	FUser
	FMaxTokens
	FMaxCompletionTokens
	FStreamOptions
	FKVTransferParams
	FAddGenerationPrompt
	FDisaggregatedParams
	FBootstrapHost
	FBootstrapPort
	FBootstrapRoom
	FContinueFinalMessage
	// Chat fields the engine hands its template besides messages (vLLM's
	// ChatCompletionRequest.build_chat_params).
	FDocuments
	FReasoningEffort
	FChatTemplate
	// The Responses API (/v1/responses): the conversation and the server-side state it
	// may refer to.
	FInput
	FInstructions
	FReasoning
	FPreviousResponseID
	FPreviousResponse
	FPreviousInputMessages
	FTruncation // Responses: "auto" truncates to the model's context
	// Tokenization options: add_special_tokens (chat default false, completions true) and
	// truncate_prompt_tokens (keep N tokens).
	FAddSpecialTokens
	FTruncatePromptTokens
	FToolChoice
	numFields
)

var fieldNames = [numFields]string{
	FModel: "model", FPrompt: "prompt", FMessages: "messages", FTools: "tools",
	FChatTemplateKwargs: "chat_template_kwargs", FCacheSalt: "cache_salt", FStream: "stream",
	FUser: "user", FMaxTokens: "max_tokens", FMaxCompletionTokens: "max_completion_tokens",
	FStreamOptions: "stream_options", FKVTransferParams: "kv_transfer_params",
	FAddGenerationPrompt: "add_generation_prompt", FDisaggregatedParams: "disaggregated_params",
	FBootstrapHost: "bootstrap_host", FBootstrapPort: "bootstrap_port", FBootstrapRoom: "bootstrap_room",
	FContinueFinalMessage: "continue_final_message",
	FDocuments:            "documents", FReasoningEffort: "reasoning_effort", FChatTemplate: "chat_template",
	FInput: "input", FInstructions: "instructions", FReasoning: "reasoning",
	FPreviousResponseID: "previous_response_id", FPreviousResponse: "previous_response",
	FPreviousInputMessages: "previous_input_messages", FTruncation: "truncation",
	FAddSpecialTokens: "add_special_tokens", FTruncatePromptTokens: "truncate_prompt_tokens",
	FToolChoice: "tool_choice",
}

// Name is the JSON member name of f.
func (f Field) Name() string { return fieldNames[f] }

// Request holds spans into one body. Value spans cover the JSON value (strings
// include their quotes); Member spans cover `"key": value` for splicing.
type Request struct {
	Value  [numFields]Span
	Member [numFields]Span

	Stream              bool
	AddGenerationPrompt bool // defaults to true, as vLLM's does
	// ContinueFinalMessage: the prompt ends inside the final (assistant) message.
	ContinueFinalMessage bool
	Prompt               PromptKind

	// dup holds the fields whose member appears more than once (1<<f): the last one is
	// what Python's json, and so the engine, reads; AppendRewritten drops every copy.
	dup uint64
}

// Fields fit dup's bits.
var _ [64 - numFields]struct{}

// Reset clears r for reuse.
func (r *Request) Reset() { *r = Request{AddGenerationPrompt: true} }

// Scan validates body as one JSON object and records the spans of the members kvgate
// uses. Unknown members are validated and skipped. It allocates nothing.
func Scan(body []byte, r *Request) error {
	r.Reset()
	i := jsonlex.SkipWS(body, 0)
	if i >= len(body) {
		return ErrSyntax
	}
	if body[i] != '{' {
		if _, err := skipValue(body, i, 0); err != nil {
			return err
		}
		return ErrNotObj
	}
	i = jsonlex.SkipWS(body, i+1)
	if i < len(body) && body[i] == '}' {
		return trailing(body, i+1)
	}
	for {
		if i >= len(body) || body[i] != '"' {
			return ErrSyntax
		}
		keyStart := i
		kEnd, esc, le := jsonlex.ScanString(body, i)
		if le != jsonlex.OK {
			return lexErrors[le]
		}
		f := keyField(body[keyStart:kEnd], esc)
		i = jsonlex.SkipWS(body, kEnd)
		if i >= len(body) || body[i] != ':' {
			return ErrSyntax
		}
		i = jsonlex.SkipWS(body, i+1)
		vStart := i
		vEnd, err := skipValue(body, i, 1)
		if err != nil {
			return err
		}
		if f < numFields {
			if r.Member[f].Present() {
				r.dup |= 1 << f
			}
			if err := r.set(f, body, vStart, vEnd); err != nil {
				return err
			}
			r.Member[f] = Span{int32(keyStart), int32(vEnd)}
		}
		i = jsonlex.SkipWS(body, vEnd)
		if i >= len(body) {
			return ErrSyntax
		}
		if body[i] == ',' {
			i = jsonlex.SkipWS(body, i+1)
			continue
		}
		if body[i] == '}' {
			return trailing(body, i+1)
		}
		return ErrSyntax
	}
}

func trailing(body []byte, i int) error {
	if jsonlex.SkipWS(body, i) != len(body) {
		return ErrTrailing
	}
	return nil
}

// maxEscKey bounds the escaped keys keyField decodes: the longest field name written
// with every byte escaped (\uXXXX) fits.
const maxEscKey = 6*len("previous_input_messages") + 2

// keyField is the field the member key k (quotes included) names, its escapes decoded
// (`"str\u0065am"` is stream to Python's json, and so to the engine).
func keyField(k []byte, esc bool) Field {
	if !esc {
		return lookup(k[1 : len(k)-1])
	}
	if len(k) > maxEscKey {
		return numFields
	}
	var buf [maxEscKey]byte
	return lookup(jsonlex.AppendUnescaped(buf[:0], k[1:len(k)-1]))
}

func lookup(k []byte) Field {
	for f := Field(0); f < numFields; f++ {
		if string(k) == fieldNames[f] {
			return f
		}
	}
	return numFields
}

func (r *Request) set(f Field, body []byte, s, e int) error {
	v := body[s:e]
	r.Value[f] = Span{int32(s), int32(e)}
	switch f {
	case FModel, FCacheSalt, FUser:
		if v[0] == 'n' { // null: treat as absent
			r.Value[f] = Span{}
			return nil
		}
		if v[0] != '"' {
			return ErrType
		}
	case FStream, FAddGenerationPrompt, FContinueFinalMessage:
		switch v[0] {
		case 't':
			r.setBool(f, true)
		case 'f':
			r.setBool(f, false)
		case 'n': // null: the default (a repeated member's last value counts)
			r.setBool(f, f == FAddGenerationPrompt)
		default:
			return ErrType
		}
	case FMessages:
		if v[0] != '[' {
			return ErrType
		}
	case FDocuments, FReasoningEffort, FChatTemplate, FInput, FInstructions, FReasoning,
		FPreviousResponseID, FPreviousResponse, FPreviousInputMessages, FTruncation,
		FAddSpecialTokens, FTruncatePromptTokens, FToolChoice:
		// Fields of one endpoint that others ignore: a value of another JSON type (or
		// null) is treated as absent, never refused; the engine judges it.
		if !fieldKinds[f][v[0]] {
			r.Value[f] = Span{}
		}
	case FPrompt:
		r.Prompt = promptKind(v)
		if r.Prompt == PromptNone && v[0] != 'n' {
			return ErrType
		}
	}
	return nil
}

// fieldKinds are the first bytes of the values each lenient field takes.
var fieldKinds = func() (k [numFields][256]bool) {
	for _, f := range []Field{FReasoningEffort, FChatTemplate, FInstructions, FPreviousResponseID, FInput, FTruncation} {
		k[f]['"'] = true
	}
	for _, f := range []Field{FDocuments, FInput, FPreviousInputMessages} {
		k[f]['['] = true
	}
	k[FToolChoice]['"'] = true
	for _, f := range []Field{FReasoning, FPreviousResponse, FToolChoice} {
		k[f]['{'] = true
	}
	k[FAddSpecialTokens]['t'], k[FAddSpecialTokens]['f'] = true, true
	for _, c := range "-0123456789" {
		k[FTruncatePromptTokens][c] = true
	}
	return k
}()

func (r *Request) setBool(f Field, b bool) {
	switch f {
	case FStream:
		r.Stream = b
	case FAddGenerationPrompt:
		r.AddGenerationPrompt = b
	case FContinueFinalMessage:
		r.ContinueFinalMessage = b
	}
}

func promptKind(v []byte) PromptKind {
	switch v[0] {
	case '"':
		return PromptString
	case '[':
		j := jsonlex.SkipWS(v, 1)
		switch {
		case j >= len(v):
			return PromptNone
		case v[j] == '"':
			return PromptStrings
		case v[j] == '[':
			return PromptBatch
		case v[j] == ']' || v[j] == '-' || (v[j] >= '0' && v[j] <= '9'):
			return PromptTokens
		}
	}
	return PromptNone
}

// lexErrors are the error values the lexical faults count as (none for jsonlex.OK).
var lexErrors = func() (t [256]error) {
	for e := range t[1:] {
		t[e+1] = ErrSyntax
	}
	t[jsonlex.BadUTF8] = ErrUTF8
	return t
}()

// skipValue validates the JSON value at b[i] and returns the index after it.
func skipValue(b []byte, i, depth int) (int, error) {
	if i >= len(b) {
		return 0, ErrSyntax
	}
	switch c := b[i]; {
	case c == '"':
		e, _, le := jsonlex.ScanString(b, i)
		if le != jsonlex.OK {
			return 0, lexErrors[le]
		}
		return e, nil
	case c == '{':
		if depth >= MaxDepth {
			return 0, ErrDepth
		}
		i = jsonlex.SkipWS(b, i+1)
		if i < len(b) && b[i] == '}' {
			return i + 1, nil
		}
		for {
			if i >= len(b) || b[i] != '"' {
				return 0, ErrSyntax
			}
			e, _, le := jsonlex.ScanString(b, i)
			if le != jsonlex.OK {
				return 0, lexErrors[le]
			}
			i = jsonlex.SkipWS(b, e)
			if i >= len(b) || b[i] != ':' {
				return 0, ErrSyntax
			}
			var err error
			if i, err = skipValue(b, jsonlex.SkipWS(b, i+1), depth+1); err != nil {
				return 0, err
			}
			i = jsonlex.SkipWS(b, i)
			if i >= len(b) {
				return 0, ErrSyntax
			}
			if b[i] == '}' {
				return i + 1, nil
			}
			if b[i] != ',' {
				return 0, ErrSyntax
			}
			i = jsonlex.SkipWS(b, i+1)
		}
	case c == '[':
		if depth >= MaxDepth {
			return 0, ErrDepth
		}
		i = jsonlex.SkipWS(b, i+1)
		if i < len(b) && b[i] == ']' {
			return i + 1, nil
		}
		for {
			var err error
			if i, err = skipValue(b, i, depth+1); err != nil {
				return 0, err
			}
			i = jsonlex.SkipWS(b, i)
			if i >= len(b) {
				return 0, ErrSyntax
			}
			if b[i] == ']' {
				return i + 1, nil
			}
			if b[i] != ',' {
				return 0, ErrSyntax
			}
			i = jsonlex.SkipWS(b, i+1)
		}
	case c == 't':
		return literal(b, i, "true")
	case c == 'f':
		return literal(b, i, "false")
	case c == 'n':
		return literal(b, i, "null")
	case c == '-' || c >= '0' && c <= '9':
		return skipNumber(b, i)
	}
	return 0, ErrSyntax
}

func literal(b []byte, i int, lit string) (int, error) {
	end, e := jsonlex.Literal(b, i, lit)
	return end, lexErrors[e]
}

func skipNumber(b []byte, i int) (int, error) {
	end, _, e := jsonlex.ScanNumber(b, i)
	return end, lexErrors[e]
}
