package main

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/testfix"
)

func readGzJSON(t *testing.T, path string, v any) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatal(err)
	}
}

func idsLine(ids []uint32) string {
	b, _ := json.Marshal(map[string][]uint32{"ids": ids})
	return string(b)
}

// TestTokenizeCommand drives `kvgate tokenize` with raw text, completions and chat bodies and
// bad lines; expected IDs come from the HF tokenizers and Jinja2 goldens (testdata/tokenize).
func TestTokenizeCommand(t *testing.T) {
	var golden struct {
		FullPlain   [][]uint32 `json:"full_plain"`
		FullSpecial [][]uint32 `json:"full_special"`
	}
	readGzJSON(t, filepath.Join("..", "..", "testdata", "tokenize", "llama2.golden.json.gz"), &golden)
	var chat struct {
		Models map[string]struct {
			Cases []struct {
				Name                string   `json:"name"`
				Messages            string   `json:"messages"`
				Tools               *string  `json:"tools"`
				Kwargs              *string  `json:"kwargs"`
				AddGenerationPrompt bool     `json:"add_generation_prompt"`
				ContinueFinal       bool     `json:"continue_final_message"`
				IDs                 []uint32 `json:"ids"`
			} `json:"cases"`
		} `json:"models"`
	}
	readGzJSON(t, filepath.Join("..", "..", "testdata", "tokenize", "chat.golden.json.gz"), &chat)

	// Corpus document 4 is "Hello world" (tools/gen-tok-corpus.js).
	in := `{"text":"Hello world"}` + "\n" +
		"this is not json\n" +
		`{"prompt":"Hello world"}` + "\n" +
		"\n" +
		`{"nothing":1}` + "\n" +
		`{"prompt":["Hello world"]}` + "\n" +
		`{"prompt":[1,2,3]}` + "\n" +
		`{"prompt":["a","b"]}`
	var out, errOut bytes.Buffer
	if rc := runTokenize([]string{"-tokenizer", testfix.TokenizerDir(t, "llama2")}, strings.NewReader(in), &out, &errOut); rc != 0 {
		t.Fatalf("rc %d: %s", rc, errOut.String())
	}
	lines := strings.Split(strings.TrimRight(out.String(), "\n"), "\n")
	want := []string{idsLine(golden.FullPlain[4]), `{"error":`, idsLine(golden.FullSpecial[4]), `{"error":`, idsLine(golden.FullSpecial[4]), `{"ids":[1,2,3]}`, `{"error":`}
	if len(lines) != len(want) {
		t.Fatalf("got %d lines, want %d:\n%s", len(lines), len(want), out.String())
	}
	for i := range want {
		if !strings.HasPrefix(lines[i], want[i]) {
			t.Errorf("line %d = %s, want %s", i, lines[i], want[i])
		}
	}

	// -add-special-tokens applies to {"text"} lines.
	out.Reset()
	runTokenize([]string{"-tokenizer", testfix.TokenizerDir(t, "llama2"), "-add-special-tokens"}, strings.NewReader(`{"text":"Hello world"}`), &out, &errOut)
	if got := strings.TrimSpace(out.String()); got != idsLine(golden.FullSpecial[4]) {
		t.Errorf("-add-special-tokens: %s, want %s", got, idsLine(golden.FullSpecial[4]))
	}

	// Chat bodies, as OpenAI requests.
	cases := chat.Models["qwen3"].Cases
	var body strings.Builder
	n := 0
	for _, c := range cases { // the Qwen3 template does not read the clock
		req := map[string]json.RawMessage{"model": json.RawMessage(`"qwen3"`), "messages": json.RawMessage(c.Messages),
			"add_generation_prompt": json.RawMessage(map[bool]string{true: "true", false: "false"}[c.AddGenerationPrompt])}
		if c.Tools != nil {
			req["tools"] = json.RawMessage(*c.Tools)
		}
		if c.Kwargs != nil {
			req["chat_template_kwargs"] = json.RawMessage(*c.Kwargs)
		}
		if c.ContinueFinal {
			req["continue_final_message"] = json.RawMessage("true")
		}
		b, _ := json.Marshal(req)
		body.Write(b)
		body.WriteByte('\n')
		n++
	}
	out.Reset()
	if rc := runTokenize([]string{"-tokenizer", testfix.TokenizerDir(t, "qwen3")}, strings.NewReader(body.String()), &out, &errOut); rc != 0 {
		t.Fatalf("rc %d: %s", rc, errOut.String())
	}
	lines = strings.Split(strings.TrimRight(out.String(), "\n"), "\n")
	if len(lines) != n {
		t.Fatalf("got %d lines for %d chat requests", len(lines), n)
	}
	for i, c := range cases[:n] {
		if lines[i] != idsLine(c.IDs) {
			t.Errorf("chat case %s: %.120s, want %.120s", c.Name, lines[i], idsLine(c.IDs))
		}
	}

	// Usage errors.
	if rc := runTokenize(nil, strings.NewReader(""), io.Discard, io.Discard); rc != 2 {
		t.Errorf("no -tokenizer: rc %d, want 2", rc)
	}
	if rc := runTokenize([]string{"-tokenizer", t.TempDir()}, strings.NewReader(""), io.Discard, io.Discard); rc != 1 {
		t.Errorf("bad directory: rc %d, want 1", rc)
	}
}
