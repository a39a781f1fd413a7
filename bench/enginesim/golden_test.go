package enginesim

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// cacheDir is $KVGATE_CACHE, else the repository's .cache.
func cacheDir() string {
	if c := os.Getenv("KVGATE_CACHE"); c != "" {
		return c
	}
	return filepath.Join("..", "..", ".cache")
}

// The golden (tools/gen-bench-cache.py) holds requests rendered by Jinja2, tokenized by the HF
// tokenizers library, and the cached_tokens vLLM's prefix-cache rule gives for each when
// they are sent in order to one fresh engine.
func TestCachedTokensGolden(t *testing.T) {
	raw, err := os.ReadFile("../testdata/cached_tokens.json")
	if err != nil {
		t.Fatal(err)
	}
	var g struct {
		ModelDir  string `json:"model_dir"`
		BlockSize int    `json:"block_size"`
		Requests  []struct {
			Name         string          `json:"name"`
			Messages     json.RawMessage `json:"messages"`
			Prompt       *string         `json:"prompt"`
			PromptTokens int             `json:"prompt_tokens"`
			CachedTokens int             `json:"cached_tokens"`
		} `json:"requests"`
	}
	if err := json.Unmarshal(raw, &g); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(cacheDir(), g.ModelDir)
	enc, err := LoadEncoder("qwen3", dir)
	if err != nil {
		t.Fatalf("%v: run `make fetch`", err)
	}
	s := launch(t, Spec{Encoder: enc, Model: "qwen3", BlockSize: g.BlockSize, NumBlocks: 1024})
	for _, r := range g.Requests {
		path, body := "/v1/chat/completions", map[string]any{"model": "qwen3", "max_tokens": 2, "messages": r.Messages}
		if r.Prompt != nil {
			path, body = "/v1/completions", map[string]any{"model": "qwen3", "max_tokens": 2, "prompt": *r.Prompt}
		}
		b, _ := json.Marshal(body)
		code, resp, _ := post(t, s.URL()+path, string(b))
		var c completion
		if err := json.Unmarshal(resp, &c); err != nil || code != 200 {
			t.Fatalf("%s: HTTP %d %s", r.Name, code, resp)
		}
		if c.Usage.PromptTokens != r.PromptTokens || c.Usage.PromptTokensDetails.CachedTokens != r.CachedTokens {
			t.Errorf("%s: prompt %d cached %d, want %d and %d", r.Name, c.Usage.PromptTokens,
				c.Usage.PromptTokensDetails.CachedTokens, r.PromptTokens, r.CachedTokens)
		}
	}
}
