package enginesim

import (
	"compress/gzip"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/tokenize"
)

func readGz(t *testing.T, path string, v any) {
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

func get(t *testing.T, url string) (int, []byte, http.Header) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b, resp.Header
}

func stagedEncoder(t *testing.T, name string) Encoder {
	t.Helper()
	dir, err := tokenize.StagedDir(name)
	if err != nil {
		t.Fatalf("%v: run `make fetch`", err)
	}
	enc, err := LoadEncoder(name, dir)
	if err != nil {
		t.Fatal(err)
	}
	return enc
}

type vllmTokenize struct {
	Count       int      `json:"count"`
	MaxModelLen int      `json:"max_model_len"`
	Tokens      []uint32 `json:"tokens"`
	TokenStrs   []string `json:"token_strs"`
}

func tokenizeAt(t *testing.T, url, body string) (int, vllmTokenize, []byte) {
	t.Helper()
	code, b, _ := post(t, url, body)
	var r vllmTokenize
	if code == 200 {
		if err := json.Unmarshal(b, &r); err != nil {
			t.Fatalf("%s: %v", b, err)
		}
		if r.Count != len(r.Tokens) {
			t.Fatalf("count %d for %d tokens", r.Count, len(r.Tokens))
		}
	}
	return code, r, b
}

type chatGolden struct {
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

// vLLM's chat form against testdata's chat goldens (Jinja2 + the HF tokenizers library,
// tools/gen-chat-goldens.py), and the generate path must use the very same tokens.
func TestTokenizeChatMatchesGoldenAndGenerate(t *testing.T) {
	var g chatGolden
	readGz(t, filepath.Join("..", "..", "testdata", "tokenize", "chat.golden.json.gz"), &g)
	cases := g.Models["qwen3"].Cases // the Qwen3 template does not read the clock
	if len(cases) < 5 {
		t.Fatalf("%d qwen3 chat cases", len(cases))
	}
	s := launch(t, Spec{Encoder: stagedEncoder(t, "qwen3"), Model: "qwen3", BlockSize: 16, NumBlocks: 4096})
	for _, c := range cases {
		req := map[string]any{"model": "qwen3", "messages": json.RawMessage(c.Messages), "add_generation_prompt": c.AddGenerationPrompt}
		if c.Tools != nil {
			req["tools"] = json.RawMessage(*c.Tools)
		}
		if c.Kwargs != nil {
			req["chat_template_kwargs"] = json.RawMessage(*c.Kwargs)
		}
		if c.ContinueFinal {
			req["continue_final_message"] = true
		}
		b, _ := json.Marshal(req)
		code, r, raw := tokenizeAt(t, s.URL()+"/tokenize", string(b))
		if code != 200 {
			t.Fatalf("%s: HTTP %d %s", c.Name, code, raw)
		}
		if !slices.Equal(r.Tokens, c.IDs) || r.MaxModelLen != 4096*16 || !strings.Contains(string(raw), `"token_strs":null`) {
			t.Errorf("%s: /tokenize %v (max_model_len %d), want %v", c.Name, r.Tokens, r.MaxModelLen, c.IDs)
		}
		// The same body generates over exactly those tokens.
		req["max_tokens"] = 1
		b, _ = json.Marshal(req)
		code, out, _ := post(t, s.URL()+"/v1/chat/completions", string(b))
		var cc completion
		json.Unmarshal(out, &cc)
		if code != 200 || cc.Usage.PromptTokens != len(c.IDs) {
			t.Errorf("%s: generate HTTP %d prompt_tokens %d, want %d", c.Name, code, cc.Usage.PromptTokens, len(c.IDs))
		}
	}
}

// The chat switches' defaults and effects, on the word encoder (BOS = 1).
func TestTokenizeChatSwitches(t *testing.T) {
	s := launch(t, Spec{Encoder: WordEncoder{}, BlockSize: 4, NumBlocks: 64})
	msgs := `[{"role":"user","content":"hi"}]`
	u, hi, a := wordID("<|user|>"), wordID("hi"), wordID("<|assistant|>")
	for body, want := range map[string][]uint32{
		`{"messages":` + msgs + `}`:                               {u, hi, a},
		`{"messages":` + msgs + `,"add_generation_prompt":false}`: {u, hi},
		`{"messages":` + msgs + `,"continue_final_message":true}`: {u, hi},
		`{"messages":` + msgs + `,"add_special_tokens":true}`:     {1, u, hi, a},
		`{"messages":` + msgs + `,"add_special_tokens":false}`:    {u, hi, a},
	} {
		code, r, raw := tokenizeAt(t, s.URL()+"/tokenize", body)
		if code != 200 || !slices.Equal(r.Tokens, want) {
			t.Errorf("%s: HTTP %d %s, want %v", body, code, raw, want)
		}
		// Generation reads the same switches.
		code, out, _ := post(t, s.URL()+"/v1/chat/completions", strings.TrimSuffix(body, "}")+`,"max_tokens":1}`)
		var cc completion
		json.Unmarshal(out, &cc)
		if code != 200 || cc.Usage.PromptTokens != len(want) {
			t.Errorf("%s: generate HTTP %d prompt_tokens %d, want %d", body, code, cc.Usage.PromptTokens, len(want))
		}
	}
}

// vLLM's completion form: add_special_tokens defaults to true (Llama 2's BOS), against the
// HF tokenizers goldens for the corpus (document 4 is "Hello world").
func TestTokenizeCompletionAddSpecialTokens(t *testing.T) {
	var g struct {
		FullPlain   [][]uint32 `json:"full_plain"`
		FullSpecial [][]uint32 `json:"full_special"`
	}
	readGz(t, filepath.Join("..", "..", "testdata", "tokenize", "llama2.golden.json.gz"), &g)
	s := launch(t, Spec{Encoder: stagedEncoder(t, "llama2"), Model: "llama2", BlockSize: 4, NumBlocks: 64})
	for body, want := range map[string][]uint32{
		`{"model":"llama2","prompt":"Hello world"}`:                            g.FullSpecial[4],
		`{"prompt":"Hello world","add_special_tokens":true}`:                   g.FullSpecial[4],
		`{"model":"llama2","prompt":"Hello world","add_special_tokens":false}`: g.FullPlain[4],
	} {
		code, r, raw := tokenizeAt(t, s.URL()+"/tokenize", body)
		if code != 200 || !slices.Equal(r.Tokens, want) {
			t.Errorf("%s: HTTP %d %s, want %v", body, code, raw, want)
		}
	}
	if slices.Equal(g.FullSpecial[4], g.FullPlain[4]) {
		t.Fatal("golden: Llama 2 adds no BOS? the test cannot tell the defaults apart")
	}
	// The completion generate path agrees with the default.
	c := complete(t, s, `{"prompt":"Hello world","max_tokens":1}`)
	if c.Usage.PromptTokens != len(g.FullSpecial[4]) {
		t.Errorf("generate prompt_tokens %d, want %d", c.Usage.PromptTokens, len(g.FullSpecial[4]))
	}
}

func TestTokenizeRefusesBadInput(t *testing.T) {
	s := launch(t, Spec{Encoder: WordEncoder{}, Model: "m", LoRAs: []string{"ad"}, BlockSize: 4, NumBlocks: 4})
	msgs := `[{"role":"user","content":"hi"}]`
	for body, want := range map[string]int{
		`not json`:                               400,
		`{}`:                                     400,
		`{"prompt":"a","messages":` + msgs + `}`: 400,
		`{"prompt":[1,2,3]}`:                     400,
		`{"model":"other","prompt":"a"}`:         404,
		`{"messages":` + msgs + `,"chat_template":"{{ messages }}"}`:                           400,
		`{"prompt":"a","return_token_strs":true}`:                                              400,
		`{"messages":` + msgs + `,"continue_final_message":true,"add_generation_prompt":true}`: 400,
		`{"prompt":"` + strings.Repeat("w ", 20) + `"}`:                                        400, // 21 tokens > 16
		`{"model":"ad","prompt":"a b"}`:                                                        200,
		`{"messages":` + msgs + `,"continue_final_message":true}`:                              200,
	} {
		code, raw, _ := post(t, s.URL()+"/tokenize", body)
		if code != want {
			t.Errorf("%s: HTTP %d %s, want %d", body, code, raw, want)
			continue
		}
		if code != 200 {
			var e struct {
				Object, Message string
			}
			if json.Unmarshal(raw, &e) != nil || e.Object != "error" || e.Message == "" {
				t.Errorf("%s: error body %s", body, raw)
			}
		}
	}
	bare := launch(t, Spec{BlockSize: 4, NumBlocks: 4})
	if code, raw, _ := post(t, bare.URL()+"/tokenize", `{"prompt":"a"}`); code != 400 || !strings.Contains(string(raw), "tokenizer") {
		t.Errorf("no tokenizer: HTTP %d %s", code, raw)
	}
	trt := launch(t, Spec{Engine: EngineTRTLLM, Encoder: WordEncoder{}, BlockSize: 4, NumBlocks: 4})
	if code, _, _ := post(t, trt.URL()+"/tokenize", `{"prompt":"a"}`); code != 404 && code != 405 {
		t.Errorf("trtllm-serve has no /tokenize; the sim answered %d", code)
	}
}

// SGLang's shape: prompt may be a list (lists back), both /tokenize and /v1/tokenize.
func TestTokenizeSGLangShape(t *testing.T) {
	s := launch(t, Spec{Engine: EngineSGLang, Encoder: WordEncoder{}, Model: "m", NumBlocks: 64})
	w := func(ws ...string) []uint32 {
		var out []uint32
		for _, x := range ws {
			out = append(out, wordID(x))
		}
		return out
	}
	for _, path := range []string{"/tokenize", "/v1/tokenize"} {
		code, b, _ := post(t, s.URL()+path, `{"prompt":["a b","c"],"add_special_tokens":false}`)
		var list struct {
			Tokens      [][]uint32 `json:"tokens"`
			Count       []int      `json:"count"`
			MaxModelLen int        `json:"max_model_len"`
		}
		if code != 200 || json.Unmarshal(b, &list) != nil || len(list.Tokens) != 2 || !slices.Equal(list.Tokens[0], w("a", "b")) ||
			!slices.Equal(list.Tokens[1], w("c")) || !slices.Equal(list.Count, []int{2, 1}) || list.MaxModelLen != 64 {
			t.Errorf("%s list: HTTP %d %s", path, code, b)
		}
	}
	code, b, _ := post(t, s.URL()+"/tokenize", `{"prompt":"a b"}`)
	var one struct {
		Tokens []uint32 `json:"tokens"`
		Count  int      `json:"count"`
	}
	if code != 200 || json.Unmarshal(b, &one) != nil || !slices.Equal(one.Tokens, append([]uint32{1}, w("a", "b")...)) || one.Count != 3 {
		t.Errorf("string prompt: HTTP %d %s", code, b)
	}
	if code, b, _ := get(t, s.URL()+"/v1/models"); code != 200 || !strings.Contains(string(b), `"owned_by":"sglang"`) {
		t.Errorf("/v1/models: HTTP %d %s", code, b)
	}
	code, b, _ = post(t, s.URL()+"/tokenize", `{"messages":[{"role":"user","content":"hi"}]}`)
	if code != 200 || json.Unmarshal(b, &one) != nil || !slices.Equal(one.Tokens, w("<|user|>", "hi", "<|assistant|>")) {
		t.Errorf("chat: HTTP %d %s", code, b)
	}
}

// -tokenize-drift: /tokenize and generation both see the drifted tokens, so a client
// comparing its own tokenization with the engine's finds the mismatch, and the engine's
// block keys differ from a router's.
func TestTokenizeDrift(t *testing.T) {
	s := launch(t, Spec{Encoder: WordEncoder{}, TokenizeDrift: true, BlockSize: 4, NumBlocks: 64})
	code, r, raw := tokenizeAt(t, s.URL()+"/tokenize", `{"prompt":"a b c"}`)
	want, _ := WordEncoder{}.EncodePrompt(nil, "a b c")
	if code != 200 || slices.Equal(r.Tokens, want) || !slices.Equal(r.Tokens[1:], want) {
		t.Fatalf("drift /tokenize: HTTP %d %s, undrifted %v", code, raw, want)
	}
	c := complete(t, s, `{"prompt":"a b c","max_tokens":1}`)
	if c.Usage.PromptTokens != len(want)+1 {
		t.Errorf("drift generate prompt_tokens %d, want %d", c.Usage.PromptTokens, len(want)+1)
	}
	if _, err := Launch(Spec{TokenizeDrift: true, Listen: "127.0.0.1:0"}); err == nil {
		t.Error("drift without a tokenizer was accepted")
	}
}
