package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"strconv"

	"github.com/kvgate/kvgate/tokenize"
)

func init() {
	register("tokenize", "print the token IDs the engine computes for JSON lines on stdin", runTokenize)
}

// runTokenize reads JSON lines: {"text": ...} is encoded raw; an OpenAI completions body
// ({"prompt": ...}) or chat body ({"messages": [...]}) is processed as the proxy does. One
// {"ids": [...]} or {"error": "..."} line is printed per input line, in order.
func runTokenize(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("tokenize", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("tokenizer", "", "directory holding tokenizer.json, tokenizer_config.json and optionally chat_template.jinja")
	addSpecial := fs.Bool("add-special-tokens", false, `for {"text"} lines: add the post-processor's special tokens (e.g. BOS), as HF encode(add_special_tokens=True)`)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: kvgate tokenize -tokenizer DIR [-add-special-tokens] < lines.jsonl")
		fmt.Fprintln(stderr, `Each input line is {"text": "..."} (encoded raw), an OpenAI /v1/completions body ({"prompt": ...},`)
		fmt.Fprintln(stderr, `encoded with add_special_tokens=true as vLLM does) or a /v1/chat/completions body ({"messages": [...]},`)
		fmt.Fprintln(stderr, `chat template rendered, then encoded without special tokens). Prints {"ids":[...]} or {"error":"..."} per line.`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *dir == "" || fs.NArg() > 0 {
		fs.Usage()
		return 2
	}
	m, err := tokenize.LoadModel(filepath.Base(*dir), *dir)
	if err != nil {
		fmt.Fprintf(stderr, "kvgate tokenize: %v\n", err)
		return 1
	}
	in := bufio.NewReaderSize(stdin, 1<<16)
	out := bufio.NewWriterSize(stdout, 1<<16)
	var ids []uint32
	var line []byte
	for {
		line, err = in.ReadBytes('\n')
		if len(bytes.TrimSpace(line)) > 0 {
			var lerr error
			ids, lerr = tokenizeLine(m, bytes.TrimSpace(line), *addSpecial, ids)
			if lerr != nil {
				msg, _ := json.Marshal(lerr.Error())
				out.WriteString(`{"error":`)
				out.Write(msg)
				out.WriteString("}\n")
			} else {
				writeIDs(out, ids)
			}
		}
		if err != nil {
			break
		}
	}
	if flushErr := out.Flush(); flushErr != nil {
		fmt.Fprintf(stderr, "kvgate tokenize: %v\n", flushErr)
		return 1
	}
	if err != io.EOF {
		fmt.Fprintf(stderr, "kvgate tokenize: reading stdin: %v\n", err)
		return 1
	}
	return 0
}

func writeIDs(w *bufio.Writer, ids []uint32) {
	w.WriteString(`{"ids":[`)
	var num [20]byte
	for i, id := range ids {
		if i > 0 {
			w.WriteByte(',')
		}
		w.Write(strconv.AppendUint(num[:0], uint64(id), 10))
	}
	w.WriteString("]}\n")
}

type tokenizeRequest struct {
	Text                 *string         `json:"text"`
	Prompt               json.RawMessage `json:"prompt"`
	Messages             json.RawMessage `json:"messages"`
	Tools                json.RawMessage `json:"tools"`
	ChatTemplateKwargs   json.RawMessage `json:"chat_template_kwargs"`
	AddGenerationPrompt  *bool           `json:"add_generation_prompt"`
	ContinueFinalMessage bool            `json:"continue_final_message"`
	AddSpecialTokens     *bool           `json:"add_special_tokens"`
}

func nullOrEmpty(b json.RawMessage) bool {
	b = bytes.TrimSpace(b)
	return len(b) == 0 || string(b) == "null"
}

func tokenizeLine(m *tokenize.Model, line []byte, addSpecial bool, ids []uint32) ([]uint32, error) {
	var req tokenizeRequest
	if err := json.Unmarshal(line, &req); err != nil {
		return ids, fmt.Errorf("bad JSON line: %v", err)
	}
	switch {
	case req.Text != nil:
		return m.Tokenizer().Encode(ids, *req.Text, addSpecial)
	case !nullOrEmpty(req.Messages):
		if req.AddSpecialTokens != nil && *req.AddSpecialTokens {
			return ids, errors.New("add_special_tokens=true on a chat request is not supported")
		}
		in := &tokenize.ChatInput{Messages: req.Messages, AddGenerationPrompt: true}
		if !nullOrEmpty(req.Tools) {
			in.Tools = req.Tools
		}
		if !nullOrEmpty(req.ChatTemplateKwargs) {
			in.TemplateKwargs = req.ChatTemplateKwargs
		}
		if req.AddGenerationPrompt != nil {
			in.AddGenerationPrompt = *req.AddGenerationPrompt
		}
		if req.ContinueFinalMessage {
			// vLLM requires add_generation_prompt=false with it; the default true yields.
			in.ContinueFinalMessage = true
			if req.AddGenerationPrompt == nil {
				in.AddGenerationPrompt = false
			}
		}
		return m.EncodeChat(ids, in)
	case !nullOrEmpty(req.Prompt):
		if req.AddSpecialTokens != nil && !*req.AddSpecialTokens {
			return ids, errors.New("add_special_tokens=false on a completions request is not supported")
		}
		return encodeCompletionPrompt(m, req.Prompt, ids)
	}
	return ids, errors.New(`line has none of "text", "prompt", "messages"`)
}

// encodeCompletionPrompt handles the prompt forms of /v1/completions that name one prompt: a
// string, a list of token IDs, or a one-element list of either.
func encodeCompletionPrompt(m *tokenize.Model, raw json.RawMessage, ids []uint32) ([]uint32, error) {
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return m.EncodePrompt(ids, s)
	}
	var toks []uint32
	if err := json.Unmarshal(raw, &toks); err == nil {
		return append(ids[:0], toks...), nil
	}
	var list []json.RawMessage
	if err := json.Unmarshal(raw, &list); err == nil && len(list) == 1 {
		return encodeCompletionPrompt(m, list[0], ids)
	}
	return ids, errors.New("prompt must be a string, a list of token IDs, or a one-element list of either (batched prompts are not supported)")
}
