package enginesim

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/proxy"
)

// startRule runs kvgate (-kv-block-size 16, vLLM sha256_cbor) over the given sims, each
// declared with its extra endpoint options, and returns its public and admin URLs.
func startRule(t *testing.T, sims []*Sim, extra []string) (pub, adm string) {
	t.Helper()
	cfg, pool := kvRule(t, proxy.KVConverged, EngineVLLM)
	cfg.KV.LoadScrape = 0
	cfg.KV.PendingTTL = 0
	for i, s := range sims {
		spec := fmt.Sprintf("name=%s,url=%s,engine=%s,events=%s%s", s.Config().Name, s.URL(), s.Config().Engine, s.EventsAddr(), extra[i])
		ep, err := proxy.ParseEndpoint(spec)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Fleet.Endpoints = append(cfg.Fleet.Endpoints, ep)
	}
	pubURL, admURL := startProxy(t, cfg, pool)
	for _, s := range sims {
		if err := s.WaitSubscribed(context.Background(), 10*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	return pubURL, admURL
}

type keyingState struct {
	Name   string `json:"name"`
	Parity string `json:"parity"`
	Keys   int    `json:"keys"`
	Keying struct {
		Contract  string `json:"contract"`
		BlockSize int    `json:"block_size"`
		Source    string `json:"block_size_source"`
		Mismatch  bool   `json:"block_size_mismatch"`
	} `json:"keying"`
}

func keyingOf(t *testing.T, adm string) map[string]keyingState {
	t.Helper()
	res, err := http.Get(adm + "/debug/inventory")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var inv struct {
		Endpoints []keyingState `json:"endpoints"`
	}
	if err := json.NewDecoder(res.Body).Decode(&inv); err != nil {
		t.Fatal(err)
	}
	out := map[string]keyingState{}
	for _, e := range inv.Endpoints {
		out[e.Name] = e
	}
	return out
}

// TestBlockSizePerEndpoint: one rule (-kv-block-size 16) over engines of three block
// sizes, over real ZeroMQ and HTTP: a vLLM engine of 16, a vLLM engine of 32 and an
// SGLang engine of page size 1. Each is keyed under its own contract and block size,
// from its block_size= option or, unset, adopted from what its events prove; its parity
// holds; a prompt primed on one of them routes there as a kv-hit, with its match counted
// in the rule's 16-token blocks. Pinning 16 on the 32-token engine shows the mismatch.
func TestBlockSizePerEndpoint(t *testing.T) {
	for _, declare := range []string{"option", "adopted", "pinned-wrong"} {
		t.Run(declare, func(t *testing.T) {
			v16 := pdSpec(t, EngineVLLM, "", "v16")
			v32 := pdSpec(t, EngineVLLM, "", "v32")
			v32.BlockSize = 32
			sg := pdSpec(t, EngineSGLang, "", "sg1")
			sg.BlockSize = 1
			sims := []*Sim{launch(t, v16), launch(t, v32), launch(t, sg)}
			extra := []string{"", "", ""}
			switch declare {
			case "option":
				extra = []string{",block_size=16", ",block_size=32", ",block_size=1"}
			case "pinned-wrong":
				extra[1] = ",block_size=16"
			}
			pub, adm := startRule(t, sims, extra)
			prompts := map[string]string{"v16": dpPrompt("sixteen"), "v32": dpPrompt("thirtytwo"), "sg1": dpPrompt("pageone")}
			for _, s := range sims {
				code, b, _ := post(t, s.URL()+"/v1/completions", fmt.Sprintf(`{"model":"qwen3","prompt":%q,"max_tokens":1}`, prompts[s.Config().Name]))
				if code != 200 {
					t.Fatalf("%s: %d %s", s.Config().Name, code, b)
				}
			}
			deadline := time.Now().Add(10 * time.Second)
			var st map[string]keyingState
			for {
				st = keyingOf(t, adm)
				if st["v16"].Keys > 0 && st["v32"].Keys > 0 && st["sg1"].Keys > 0 && st["v32"].Parity != "unknown" {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("events: %+v", st)
				}
				time.Sleep(10 * time.Millisecond)
			}
			want := map[string]int{"v16": 16, "v32": 32, "sg1": 1}
			if declare == "pinned-wrong" {
				want["v32"] = 16
			}
			for name, bs := range want {
				k := st[name].Keying
				source := map[string]string{"option": "endpoint", "adopted": "events", "pinned-wrong": "events"}[declare]
				if name == "v16" && declare != "option" {
					source = "rule"
				}
				if name == "v32" && declare == "pinned-wrong" {
					source = "endpoint"
				}
				if k.BlockSize != bs || k.Source != source {
					t.Errorf("%s keyed at %d from %s, want %d from %s: %+v", name, k.BlockSize, k.Source, bs, source, st[name])
				}
			}
			if declare == "pinned-wrong" {
				if st["v32"].Parity != "mismatch" {
					t.Fatalf("a 32-token engine pinned at 16: parity %s", st["v32"].Parity)
				}
				return
			}
			for name, s := range st {
				if s.Parity != "ok" {
					t.Errorf("%s parity %s", name, s.Parity)
				}
			}
			for name, p := range prompts {
				req, _ := http.NewRequest("POST", pub+"/v1/completions", strings.NewReader(fmt.Sprintf(`{"model":"qwen3","prompt":%q,"max_tokens":1}`, p)))
				res, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				io.Copy(io.Discard, res.Body)
				res.Body.Close()
				if got, route := res.Header.Get("X-Kvgate-Endpoint"), res.Header.Get("X-Kvgate-Route"); got != name || route != "kv-hit" {
					t.Errorf("%s's prompt went to %s (%s)", name, got, route)
				}
			}
			// Explain counts every match in the rule's 16-token blocks.
			res, err := http.Post(adm+"/debug/explain", "application/json", strings.NewReader(fmt.Sprintf(`{"model":"qwen3","prompt":%q}`, prompts["v32"])))
			if err != nil {
				t.Fatal(err)
			}
			var ex struct {
				Tokens int            `json:"tokens"`
				Scores map[string]int `json:"scores"`
			}
			json.NewDecoder(res.Body).Decode(&ex)
			res.Body.Close()
			if w := ex.Tokens / 32 * 2; ex.Scores["v32"] != w {
				t.Errorf("v32's score %d, want %d rule blocks (%d tokens in 32-token blocks)", ex.Scores["v32"], w, ex.Tokens)
			}
		})
	}
}
