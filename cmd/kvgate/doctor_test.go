package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/bench/enginepub"
	"github.com/kvgate/kvgate/hashcore"
	"github.com/kvgate/kvgate/internal/testfix"
	"github.com/kvgate/kvgate/tokenize"
)

var (
	docPoolOnce sync.Once
	docPool     *tokenize.Pool
	docPoolErr  error
)

func qwen3(t *testing.T) (*tokenize.Model, string) {
	t.Helper()
	dir := testfix.TokenizerDir(t, "qwen3")
	docPoolOnce.Do(func() {
		docPool = tokenize.NewPool()
		docPoolErr = docPool.Add("qwen3", dir)
	})
	if docPoolErr != nil {
		t.Fatal(docPoolErr)
	}
	return docPool.Get("qwen3"), dir
}

// drift says how a test engine departs from the rule (zero value: it follows it).
type drift struct {
	template  bool   // its chat template drops the generation prompt
	blockSize int    // block size on /metrics and in its events (0: 16)
	algo      string // hash algo on /metrics and of its keys ("": sha256_cbor)
	lora      string // a LoRA adapter it serves that the rule does not know
}

// docEngine is a test engine speaking vLLM's shapes: /v1/models, /metrics with
// vllm:cache_config_info, POST /tokenize ({"model","messages","add_generation_prompt"}
// or {"model","prompt"} -> {"count","max_model_len","tokens"}), and chat completions
// that publish the prompt's blocks as KV events over a real ZeroMQ PUB socket.
type docEngine struct {
	srv *httptest.Server
	pub *enginepub.Publisher
}

func newDocEngine(t *testing.T, dr drift) *docEngine {
	t.Helper()
	m, _ := qwen3(t)
	bs, algo := 16, "sha256_cbor"
	if dr.blockSize != 0 {
		bs = dr.blockSize
	}
	if dr.algo != "" {
		algo = dr.algo
	}
	chain, err := hashcore.New(hashcore.Spec{Engine: "vllm", Algo: algo, BlockSize: bs})
	if err != nil {
		t.Fatal(err)
	}
	pub, err := enginepub.New(enginepub.Config{Endpoint: "tcp://127.0.0.1:0", Format: enginepub.Format{Flavor: enginepub.VLLM}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	chatTokens := func(msgs json.RawMessage) []uint32 {
		toks, err := m.EncodeChat(nil, &tokenize.ChatInput{Messages: msgs, AddGenerationPrompt: true})
		if err != nil {
			t.Error(err)
		}
		if dr.template {
			toks = toks[:len(toks)-3] // "<|im_start|>assistant\n" is missing
		}
		return toks
	}
	e := &docEngine{pub: pub}
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var req struct {
			Model    string          `json:"model"`
			Messages json.RawMessage `json:"messages"`
			Prompt   *string         `json:"prompt"`
		}
		json.Unmarshal(body, &req)
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/v1/models":
			data := `{"id":"qwen3","object":"model","root":"qwen3","parent":null}`
			if dr.lora != "" {
				data += `,{"id":"` + dr.lora + `","object":"model","root":"/adapters/x","parent":"qwen3"}`
			}
			io.WriteString(w, `{"object":"list","data":[`+data+`]}`)
		case "/metrics":
			w.Header().Set("Content-Type", "text/plain")
			fmt.Fprintf(w, "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n# TYPE vllm:cache_config_info gauge\n"+
				"vllm:cache_config_info{block_size=\"%d\",cache_dtype=\"auto\",enable_prefix_caching=\"True\",engine=\"0\",prefix_caching_hash_algo=\"%s\"} 1.0\n", bs, algo)
		case "/tokenize":
			var toks []uint32
			if req.Prompt != nil {
				toks, _ = m.EncodePrompt(nil, *req.Prompt)
			} else {
				toks = chatTokens(req.Messages)
			}
			json.NewEncoder(w).Encode(map[string]any{"count": len(toks), "max_model_len": 40960, "tokens": toks})
		case "/v1/chat/completions":
			toks := chatTokens(req.Messages)
			n := len(toks) / bs * bs
			pub.Publish(enginepub.BlockStored{Hashes: hashcore.Keys(chain, nil, toks[:n], nil), TokenIDs: toks[:n], BlockSize: bs})
			io.WriteString(w, `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"One"},"finish_reason":"length"}]}`)
		default:
			w.WriteHeader(404)
		}
	}))
	t.Cleanup(e.srv.Close)
	return e
}

func (e *docEngine) flag(name string) string {
	return "name=" + name + ",url=" + e.srv.URL + ",engine=vllm,events=" + e.pub.Addr()
}

func runDoctorCLI(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := runDoctor(args, nil, &out, &errb)
	return code, out.String(), errb.String()
}

// rows returns the report rows of endpoint ep as "check result".
func rows(out, ep string) map[string][]string {
	got := map[string][]string{}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) >= 3 && f[0] == ep {
			got[f[1]] = append(got[f[1]], f[2])
		}
	}
	return got
}

// An engine that follows the rule passes every check (models, metrics' block size and
// hash algo, /tokenize on prompt and chat, attested event keys): exit 0. A drifted
// one (chat template, block size, hash algo, an unknown LoRA adapter) is reported
// parameter by parameter: exit 1, the good endpoint still ok beside it.
func TestDoctorReportsEachDriftedParameter(t *testing.T) {
	_, dir := qwen3(t)
	good := newDocEngine(t, drift{})
	bad := newDocEngine(t, drift{template: true, blockSize: 32, algo: "sha256", lora: "sql-lora"})
	for _, e := range []*docEngine{good, bad} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		go func() { e.pub.WaitSubscribed(ctx); cancel() }()
	}
	rule := []string{"-kv-mode", "3", "-kv-hash-algo", "sha256_cbor", "-kv-block-size", "16", "-model", "qwen3", "-tokenizer", dir}

	code, out, stderr := runDoctorCLI(t, append([]string{"-events-wait", "1s"}, append(rule, "-endpoint", good.flag("good"))...)...)
	if code != 0 {
		t.Fatalf("good engine: exit %d\n%s\n%s", code, out, stderr)
	}
	g := rows(out, "good")
	for _, check := range []string{"models", "block-size", "hash-algo", "tokenizer", "chat-template", "hash-contract"} {
		if len(g[check]) == 0 || g[check][0] != "ok" {
			t.Errorf("good %s: %v\n%s", check, g[check], out)
		}
	}

	code, out, _ = runDoctorCLI(t, append([]string{"-events-wait", "1s"}, append(rule, "-endpoint", good.flag("good"), "-endpoint", bad.flag("bad"))...)...)
	if code != 1 {
		t.Fatalf("drifted engine: exit %d\n%s", code, out)
	}
	b := rows(out, "bad")
	for _, check := range []string{"chat-template", "block-size", "hash-algo", "lora"} {
		if !slices.Contains(b[check], "DRIFT") {
			t.Errorf("bad %s: %v, want DRIFT\n%s", check, b[check], out)
		}
	}
	if !slices.Contains(b["tokenizer"], "ok") {
		t.Errorf("bad tokenizer (its tokenizer is the rule's): %v", b["tokenizer"])
	}
	for check, res := range rows(out, "good") {
		if slices.Contains(res, "DRIFT") || slices.Contains(res, "ERROR") {
			t.Errorf("good %s: %v beside a drifted endpoint\n%s", check, res, out)
		}
	}
	if !strings.Contains(out, "chat tokens differ from token") {
		t.Errorf("no token position in the chat drift:\n%s", out)
	}
}

// An endpoint that does not answer is an error (exit 1), and bad flags exit 2 naming
// the flag.
func TestDoctorUnreachableAndBadFlags(t *testing.T) {
	code, out, _ := runDoctorCLI(t, "-probe-timeout", "2s", "-endpoint", "name=gone,url=http://"+freeAddr(t))
	if code != 1 || !slices.Contains(rows(out, "gone")["models"], "ERROR") {
		t.Errorf("unreachable: exit %d\n%s", code, out)
	}
	code, _, stderr := runDoctorCLI(t, "-kv-mode", "7", "-endpoint", "name=a,url=http://127.0.0.1:1")
	if code != 2 || !strings.Contains(stderr, "-kv-mode") {
		t.Errorf("bad flag: exit %d %q", code, stderr)
	}
}
