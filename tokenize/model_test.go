package tokenize

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testfix"
)

var (
	modelCacheMu sync.Mutex
	modelCache   = map[string]*Model{}
)

func loadModelNamed(t testing.TB, name string) *Model {
	modelCacheMu.Lock()
	defer modelCacheMu.Unlock()
	if m := modelCache[name]; m != nil {
		return m
	}
	m, err := newModel(name, testfix.TokenizerDir(t, name), loadNamed(t, name))
	if err != nil {
		t.Fatal(err)
	}
	modelCache[name] = m
	return m
}

func rawOrNil(s *string) []byte {
	if s == nil {
		return nil
	}
	return []byte(*s)
}

// TestEncodeChatGoldens: chat request -> template -> IDs, against Jinja2's rendering encoded by
// the HF library (tools/gen-tok-chat.js).
func TestEncodeChatGoldens(t *testing.T) {
	var g struct {
		Models map[string]struct {
			FixedNow string `json:"fixed_now"`
			Cases    []struct {
				Name                string   `json:"name"`
				Messages            *string  `json:"messages"`
				Tools               *string  `json:"tools"`
				Kwargs              *string  `json:"kwargs"`
				AddGenerationPrompt bool     `json:"add_generation_prompt"`
				ContinueFinal       bool     `json:"continue_final_message"`
				IDs                 []uint32 `json:"ids"`
			} `json:"cases"`
		} `json:"models"`
	}
	if err := json.Unmarshal(readGz(t, filepath.Join(testfix.RepoRoot(t), "testdata", "tokenize", "chat.golden.json.gz")), &g); err != nil {
		t.Fatal(err)
	}
	if len(g.Models) < 4 {
		t.Fatalf("chat goldens cover %d models, want 4", len(g.Models))
	}
	for name, mg := range g.Models {
		t.Run(name, func(t *testing.T) {
			m, err := newModel(name, testfix.TokenizerDir(t, name), loadNamed(t, name)) // with a fixed clock
			if err != nil {
				t.Fatal(err)
			}
			now, err := time.ParseInLocation("2006-01-02T15:04:05", mg.FixedNow, time.Local)
			if err != nil {
				t.Fatal(err)
			}
			m.now = now
			var ids []uint32
			for _, c := range mg.Cases {
				ids, err = m.EncodeChat(ids, &ChatInput{Messages: rawOrNil(c.Messages), Tools: rawOrNil(c.Tools),
					TemplateKwargs: rawOrNil(c.Kwargs), AddGenerationPrompt: c.AddGenerationPrompt, ContinueFinalMessage: c.ContinueFinal})
				if err != nil {
					t.Errorf("%s: %v", c.Name, err)
					continue
				}
				if !slices.Equal(ids, c.IDs) {
					t.Errorf("%s: IDs differ from Jinja2 + HF tokenizers%s", c.Name, firstDiff(ids, c.IDs))
				}
			}
		})
	}
}

// TestEncodePrompt: /v1/completions prompts get the BOS that vLLM's tokenizer adds. For the
// tokenizers whose tokenizer.json post-processor matches the transformers class (all but
// DeepSeek-V3), that is HF encode(add_special_tokens=True), checked against the goldens.
func TestEncodePrompt(t *testing.T) {
	docs := loadCorpus(t)
	for _, name := range goldenNames {
		m := loadModelNamed(t, name)
		tk := m.Tokenizer()
		for _, doc := range docs[:200] {
			got, err := m.EncodePrompt(nil, doc)
			if err != nil {
				t.Fatal(err)
			}
			plain, _ := tk.Encode(nil, doc, false)
			special, _ := tk.Encode(nil, doc, true)
			want := special
			if name == "deepseek_v3" {
				// LlamaTokenizerFast with add_bos_token=true: transformers puts BOS (id 0) first
				// although tokenizer.json's post-processor (ByteLevel) adds nothing.
				want = append([]uint32{0}, plain...)
			}
			if !slices.Equal(got, want) {
				t.Fatalf("%s: EncodePrompt(%q) = %v..., want %v...", name, doc[:min(len(doc), 40)], got[:min(len(got), 8)], want[:min(len(want), 8)])
			}
		}
	}
	// The BOS the engines add, from the oracle goldens: Llama 2 <s>=1, Gemma 3 <bos>=2.
	for name, bos := range map[string]uint32{"llama2": 1, "gemma3": 2} {
		ids, _ := loadModelNamed(t, name).EncodePrompt(nil, "Hello")
		if len(ids) == 0 || ids[0] != bos {
			t.Errorf("%s: EncodePrompt starts %v, want BOS %d", name, ids, bos)
		}
	}
}

func TestPool(t *testing.T) {
	p := NewPool()
	dir := testfix.TokenizerDir(t, "qwen3")
	if err := p.Add("qwen3", dir, "Qwen/Qwen3-8B", "qwen"); err != nil {
		t.Fatal(err)
	}
	if err := p.Add("qwen3-copy", dir); err != nil {
		t.Fatal(err)
	}
	if err := p.Add("other", dir, "qwen"); err == nil || !strings.Contains(err.Error(), "qwen") {
		t.Fatalf("duplicate alias: err = %v", err)
	}
	if err := p.Add("", dir); err == nil {
		t.Fatal("empty name accepted")
	}
	if err := p.Add("broken", t.TempDir()); err == nil {
		t.Fatal("a directory without tokenizer.json was accepted")
	}
	if got, want := p.Names(), []string{"Qwen/Qwen3-8B", "qwen", "qwen3", "qwen3-copy"}; !slices.Equal(got, want) {
		t.Fatalf("Names() = %v, want %v", got, want)
	}
	if p.Get("nope") != nil {
		t.Fatal("unknown model found")
	}
	a, b, c := p.Get("qwen3"), p.Get("qwen"), p.Get("qwen3-copy")
	if a == nil || a != b || a.Name != "qwen3" || c.Name != "qwen3-copy" {
		t.Fatal("aliases do not resolve to their model")
	}
	if a.Tokenizer() != c.Tokenizer() {
		t.Fatal("the same directory was loaded twice")
	}
	// Concurrent readers and a writer.
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			var ids []uint32
			for i := 0; i < 200; i++ {
				m := p.Get("qwen")
				var err error
				ids, err = m.EncodeChat(ids, &ChatInput{Messages: []byte(fmt.Sprintf(`[{"role":"user","content":"hi %d %d"}]`, w, i)), AddGenerationPrompt: true})
				if err != nil || len(ids) < 5 {
					t.Errorf("EncodeChat: %v %v", ids, err)
					return
				}
			}
		}(w)
	}
	for i := 0; i < 3; i++ {
		if err := p.Add(fmt.Sprintf("extra%d", i), dir); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
}

func TestModelWithoutTemplate(t *testing.T) {
	m := loadModelNamed(t, "llama2")
	if m.HasChatTemplate() {
		t.Fatal("llama2's tokenizer_config has no chat template")
	}
	if _, err := m.EncodeChat(nil, &ChatInput{Messages: []byte(`[{"role":"user","content":"x"}]`)}); err == nil {
		t.Fatal("EncodeChat without a template did not fail")
	}
	// A chat_template.jinja next to tokenizer.json is used.
	dir := t.TempDir()
	src := testfix.TokenizerDir(t, "llama2")
	for _, f := range []string{"tokenizer.json", "tokenizer_config.json"} {
		b, err := os.ReadFile(filepath.Join(src, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	tmpl := "{{ bos_token }}{% for m in messages %}[{{ m.role }}] {{ m.content }}{{ eos_token }}{% endfor %}"
	if err := os.WriteFile(filepath.Join(dir, "chat_template.jinja"), []byte(tmpl), 0o644); err != nil {
		t.Fatal(err)
	}
	m2, err := LoadModel("l2", dir)
	if err != nil {
		t.Fatal(err)
	}
	got, err := m2.EncodeChat(nil, &ChatInput{Messages: []byte(`[{"role":"user","content":"hi"}]`)})
	if err != nil {
		t.Fatal(err)
	}
	want, _ := m2.Tokenizer().Encode(nil, "<s>[user] hi</s>", false)
	if !slices.Equal(got, want) || got[0] != 1 || got[len(got)-1] != 2 {
		t.Fatalf("EncodeChat = %v, want %v (BOS 1 ... EOS 2)", got, want)
	}
}
