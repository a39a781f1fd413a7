package proxy

import (
	"compress/gzip"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/kvgate/kvgate/bench/enginepub"
	"github.com/kvgate/kvgate/hashcore"
)

// chatGolden is one Qwen3 chat case: the request pieces and the token IDs that Jinja2 +
// the HF tokenizers library produce for it (testdata/tokenize/chat.golden.json.gz,
// written by tools/gen-tok-chat.js).
type chatGolden struct {
	Name                string   `json:"name"`
	Messages            string   `json:"messages"`
	Tools               *string  `json:"tools"`
	Kwargs              *string  `json:"kwargs"`
	AddGenerationPrompt bool     `json:"add_generation_prompt"`
	ContinueFinal       bool     `json:"continue_final_message"`
	IDs                 []uint32 `json:"ids"`
}

func qwen3ChatGoldens(t *testing.T) []chatGolden {
	t.Helper()
	f, err := os.Open(filepath.Join("..", "testdata", "tokenize", "chat.golden.json.gz"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	var g struct {
		Models map[string]struct {
			Cases []chatGolden `json:"cases"`
		} `json:"models"`
	}
	if err := json.NewDecoder(zr).Decode(&g); err != nil {
		t.Fatal(err)
	}
	cases := g.Models["qwen3"].Cases
	if len(cases) < 10 {
		t.Fatalf("only %d qwen3 chat goldens", len(cases))
	}
	return cases
}

// The request path must derive, from an OpenAI chat body, exactly the token IDs the
// engine would (chat template + tokenizer + request flags such as continue_final_message):
// for every golden case, an engine that published the keys of the ORACLE's token IDs is
// a full-depth KV hit on /debug/explain.
func TestChatRequestParityWithOracle(t *testing.T) {
	c := vllmChain(t)
	a := newKVEngine(t, "a", enginepub.VLLM)
	s := startProxy(t, kvConfig(t, KVConverged, a.spec(0, "vllm", "")))
	checked := 0
	for _, gc := range qwen3ChatGoldens(t) {
		blocks := len(gc.IDs) / blockSize
		if blocks == 0 {
			continue
		}
		s.kv.inv.ClearEndpoint(0)
		a.store(t, c, gc.IDs, blocks)
		want := len(hashcore.Keys(c, nil, gc.IDs, nil))
		waitFor(t, "events applied", func() bool { return s.kv.inv.Count(0) == want })

		req := map[string]json.RawMessage{"model": json.RawMessage(`"qwen3"`), "messages": json.RawMessage(gc.Messages)}
		if !gc.AddGenerationPrompt {
			req["add_generation_prompt"] = json.RawMessage("false")
		}
		if gc.Tools != nil {
			req["tools"] = json.RawMessage(*gc.Tools)
		}
		if gc.Kwargs != nil {
			req["chat_template_kwargs"] = json.RawMessage(*gc.Kwargs)
		}
		if gc.ContinueFinal {
			req["continue_final_message"] = json.RawMessage("true")
		}
		body, _ := json.Marshal(req)
		res, out := post(t, s.admURL("/debug/explain"), string(body))
		var ex Explanation
		if err := json.Unmarshal([]byte(out), &ex); err != nil || res.StatusCode != 200 {
			t.Fatalf("%s: %d %s", gc.Name, res.StatusCode, out)
		}
		if ex.Tokens != len(gc.IDs) || ex.Scores["a"] != blocks || ex.Route != "kv-hit" {
			t.Errorf("%s: tokens=%d score=%d route=%s, want tokens=%d score=%d kv-hit",
				gc.Name, ex.Tokens, ex.Scores["a"], ex.Route, len(gc.IDs), blocks)
		}
		checked++
	}
	if checked < 10 {
		t.Fatalf("only %d cases had a full block", checked)
	}
}
