package enginesim

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/proxy"
	"github.com/kvgate/kvgate/tokenize"
)

// Every P/D path kvgate's proxy supports (proxy/pd.go: vLLM, SGLang, TensorRT-LLM), run
// end to end: a real proxy.Server in -kv-mode 1 in front of a simulated prefill engine
// and a simulated decode engine of that flavour, speaking the engine's own protocol.

var (
	qwenOnce sync.Once
	qwenEnc  Encoder
	qwenPool *tokenize.Pool
	qwenErr  error
)

func qwen3(t *testing.T) (Encoder, *tokenize.Pool) {
	t.Helper()
	qwenOnce.Do(func() {
		dir, err := tokenize.StagedDir("qwen3")
		if err != nil {
			qwenErr = err
			return
		}
		if qwenEnc, qwenErr = LoadEncoder("qwen3", dir); qwenErr != nil {
			return
		}
		qwenPool = tokenize.NewPool()
		qwenErr = qwenPool.Add("qwen3", dir)
	})
	if qwenErr != nil {
		t.Fatalf("%v: run `make fetch`", qwenErr)
	}
	return qwenEnc, qwenPool
}

type pdPair struct {
	pre, dec *Sim
	url      string // the proxy's public base URL
}

// pdSpec is one simulated engine of a P/D pair.
func pdSpec(t *testing.T, engine, role, name string) Spec {
	enc, _ := qwen3(t)
	sp := Spec{Name: name, Engine: engine, Role: role, Model: "qwen3", Encoder: enc, BlockSize: 16, NumBlocks: 1024,
		MaxBatch: 8, DefaultMaxTokens: 4, DecodePerToken: time.Millisecond}
	if engine != EngineTRTLLM {
		sp.Events = "tcp://127.0.0.1:0"
	}
	if engine == EngineVLLM {
		sp.HashAlgo = "sha256_cbor"
	}
	return sp
}

// startPD starts the two sims and a proxy whose rule declares them as proxyEngine.
func startPD(t *testing.T, pre, dec Spec, proxyEngine string) pdPair {
	t.Helper()
	ps, ds := launch(t, pre), launch(t, dec)
	endpoint := func(s *Sim, role string) proxy.EndpointSpec {
		spec := fmt.Sprintf("name=%s,url=%s,engine=%s,role=%s", s.Config().Name, s.URL(), proxyEngine, role)
		switch a := s.EventsAddr(); {
		case proxyEngine == EngineTRTLLM: // HTTP drain, no events=
		case a != "":
			spec += ",events=" + a
		default: // a TensorRT-LLM sim declared as another engine publishes nothing
			spec += ",events=tcp://127.0.0.1:1"
		}
		if a := s.BootstrapAddr(); a != "" {
			_, port, _ := net.SplitHostPort(a)
			spec += ",bootstrap_port=" + port
		}
		e, err := proxy.ParseEndpoint(spec)
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	cfg, pool := kvRule(t, proxy.KVDisaggregated, proxyEngine)
	cfg.Shutdown.Grace = 5 * time.Second
	cfg.Upstream.ConnectTimeout = time.Second
	cfg.Fleet.Endpoints = []proxy.EndpointSpec{endpoint(ps, "prefill"), endpoint(ds, "decode")}
	pubURL, _ := startProxy(t, cfg, pool)
	return pdPair{pre: ps, dec: ds, url: pubURL}
}

// sseText joins the text of a streamed answer's chunks and returns its usage.
func sseText(t *testing.T, body string, chat bool) (string, completion) {
	t.Helper()
	var text strings.Builder
	var last completion
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || line == "[DONE]" {
			continue
		}
		var ch struct {
			Choices []struct {
				Text  string `json:"text"`
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
			Usage *json.RawMessage `json:"usage"`
		}
		if err := json.Unmarshal([]byte(line), &ch); err != nil {
			t.Fatalf("chunk %q: %v", line, err)
		}
		for _, c := range ch.Choices {
			text.WriteString(c.Text + c.Delta.Content)
		}
		if ch.Usage != nil {
			json.Unmarshal([]byte(line), &last)
		}
	}
	return text.String(), last
}

func proxyPost(t *testing.T, url, body string) (int, string, http.Header, time.Duration) {
	t.Helper()
	t0 := time.Now()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b), resp.Header, time.Since(t0)
}

// runPDCases sends a chat (streamed and not) and a completion through the proxy and checks
// that the decode engine answered every output token, over the prompt the prefill engine
// computed, and that the prefill engine stopped after one token.
func runPDCases(t *testing.T, pd pdPair) {
	chat := `{"model":"qwen3","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Name three rivers."}],"max_tokens":6`
	compl := `{"model":"qwen3","prompt":"The three longest rivers are","max_tokens":5`
	for _, c := range []struct {
		name, path, body string
		stream           bool
		words            int
	}{
		{"chat", "/v1/chat/completions", chat + "}", false, 6},
		{"chat-stream", "/v1/chat/completions", chat + `,"stream":true,"stream_options":{"include_usage":true}}`, true, 6},
		{"completion", "/v1/completions", compl + "}", false, 5},
		{"completion-stream", "/v1/completions", compl + `,"stream":true,"stream_options":{"include_usage":true}}`, true, 5},
	} {
		preBefore, decBefore := pd.pre.Stats(), pd.dec.Stats()
		code, out, hdr, _ := proxyPost(t, pd.url+c.path, c.body)
		if code != 200 {
			t.Fatalf("%s: HTTP %d %s", c.name, code, out)
		}
		if hdr.Get("x-kvgate-endpoint") != pd.dec.Config().Name || hdr.Get("x-kvgate-prefill") != pd.pre.Config().Name {
			t.Errorf("%s: endpoint %q prefill %q", c.name, hdr.Get("x-kvgate-endpoint"), hdr.Get("x-kvgate-prefill"))
		}
		var text string
		var u completion
		if c.stream {
			text, u = sseText(t, out, strings.Contains(c.path, "chat"))
		} else {
			json.Unmarshal([]byte(out), &u)
			var whole struct {
				Choices []struct {
					Text    string `json:"text"`
					Message struct {
						Content string `json:"content"`
					} `json:"message"`
				} `json:"choices"`
			}
			json.Unmarshal([]byte(out), &whole)
			if len(whole.Choices) == 1 {
				text = whole.Choices[0].Text + whole.Choices[0].Message.Content
			}
		}
		if n := len(strings.Fields(text)); n != c.words || u.Usage.CompletionTokens != c.words {
			t.Errorf("%s: %d words, completion_tokens %d, want %d: %s", c.name, n, u.Usage.CompletionTokens, c.words, out)
		}
		// Wait for the legs to be counted: the prefill leg of SGLang runs beside decode.
		deadline := time.Now().Add(5 * time.Second)
		var ps, ds Stats
		for {
			ps, ds = pd.pre.Stats(), pd.dec.Stats()
			if ps.Requests > preBefore.Requests && ds.Requests > decBefore.Requests || time.Now().After(deadline) {
				break
			}
			time.Sleep(2 * time.Millisecond)
		}
		if ps.Requests != preBefore.Requests+1 || ps.OutputTokens != preBefore.OutputTokens+1 {
			t.Errorf("%s: prefill engine ran %d requests, %d tokens (want 1 and 1)", c.name, ps.Requests-preBefore.Requests, ps.OutputTokens-preBefore.OutputTokens)
		}
		if ds.Requests != decBefore.Requests+1 || ds.OutputTokens != decBefore.OutputTokens+uint64(c.words) ||
			ds.PromptTokens-decBefore.PromptTokens != ps.PromptTokens-preBefore.PromptTokens || u.Usage.PromptTokens != int(ds.PromptTokens-decBefore.PromptTokens) {
			t.Errorf("%s: decode %+v -> %+v, prefill prompt tokens %d, usage %+v", c.name, decBefore, ds, ps.PromptTokens-preBefore.PromptTokens, u.Usage)
		}
	}
}

func TestPDThroughProxyVLLM(t *testing.T) {
	pd := startPD(t, pdSpec(t, EngineVLLM, RolePrefill, "vp"), pdSpec(t, EngineVLLM, RoleDecode, "vd"), EngineVLLM)
	runPDCases(t, pd)
}

func TestPDThroughProxyTensorRTLLM(t *testing.T) {
	pd := startPD(t, pdSpec(t, EngineTRTLLM, RolePrefill, "ctx"), pdSpec(t, EngineTRTLLM, RoleDecode, "gen"), EngineTRTLLM)
	runPDCases(t, pd)
}

// SGLang's legs run at once; the decode engine must wait for the prefill engine's KV:
// with a slow prefill and no prefill cost on decode, the answer cannot come sooner.
func TestPDThroughProxySGLang(t *testing.T) {
	pre := pdSpec(t, EngineSGLang, RolePrefill, "sp")
	pre.PrefillBase = 150 * time.Millisecond
	pd := startPD(t, pre, pdSpec(t, EngineSGLang, RoleDecode, "sd"), EngineSGLang)
	runPDCases(t, pd)
	// The legs as the proxy sends them (at once, one room): the decode engine answers
	// only after the prefill engine's 150 ms, though its own prefill costs nothing. The
	// proxy itself waits for both legs, so this is measured at the decode engine.
	host, port, _ := net.SplitHostPort(pd.pre.BootstrapAddr())
	body := `{"model":"qwen3","prompt":"A fresh prompt about lakes","max_tokens":2,"bootstrap_host":"` + host +
		`","bootstrap_port":` + port + `,"bootstrap_room":4242}`
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if code, b, _ := post(t, pd.pre.URL()+"/v1/completions", body); code != 200 {
			t.Errorf("prefill leg: HTTP %d %s", code, b)
		}
	}()
	code, out, _, took := proxyPost(t, pd.dec.URL()+"/v1/completions", body)
	wg.Wait()
	if code != 200 || took < 150*time.Millisecond {
		t.Errorf("decode answered in %v (HTTP %d %s): it did not wait for the 150ms prefill", took, code, out)
	}
}

// A rule that declares the wrong engine gets the engine's own 400, relayed to the client:
// it names the protocol the engine speaks.
func TestPDMismatchedProtocolIsRefused(t *testing.T) {
	for _, c := range []struct{ simEngine, ruleEngine, want string }{
		{EngineVLLM, EngineTRTLLM, "kv_transfer_params"},
		{EngineTRTLLM, EngineVLLM, "disaggregated_params"},
		{EngineSGLang, EngineVLLM, "bootstrap"},
	} {
		t.Run(c.simEngine+"-as-"+c.ruleEngine, func(t *testing.T) {
			pd := startPD(t, pdSpec(t, c.simEngine, RolePrefill, "p"), pdSpec(t, c.simEngine, RoleDecode, "d"), c.ruleEngine)
			code, out, _, _ := proxyPost(t, pd.url+"/v1/completions", `{"model":"qwen3","prompt":"hello there","max_tokens":3}`)
			if code != 400 || !strings.Contains(out, c.want) {
				t.Errorf("HTTP %d %s, want 400 naming %s", code, out, c.want)
			}
		})
	}
}

// Refusals straight at the engines: the wrong role, forged or foreign P/D state.
func TestPDRefusalsAtTheEngine(t *testing.T) {
	enc, _ := qwen3(t)
	ctxS := launch(t, Spec{Engine: EngineTRTLLM, Role: RolePrefill, Encoder: enc, Model: "qwen3", NumBlocks: 256})
	genS := launch(t, Spec{Engine: EngineTRTLLM, Role: RoleDecode, Encoder: enc, Model: "qwen3", NumBlocks: 256})
	code, b, _ := post(t, ctxS.URL()+"/v1/completions", `{"prompt":"one two three","max_tokens":4,"disaggregated_params":{"request_type":"context_only"}}`)
	var ctxAns struct {
		Choices []struct {
			FinishReason        string          `json:"finish_reason"`
			DisaggregatedParams json.RawMessage `json:"disaggregated_params"`
		} `json:"choices"`
		PromptTokenIDs []uint32 `json:"prompt_token_ids"`
	}
	if code != 200 || json.Unmarshal(b, &ctxAns) != nil || len(ctxAns.Choices) != 1 || ctxAns.Choices[0].FinishReason != "not_finished" || len(ctxAns.PromptTokenIDs) == 0 {
		t.Fatalf("context_only: HTTP %d %s", code, b)
	}
	dp := string(ctxAns.Choices[0].DisaggregatedParams)
	genDP := strings.Replace(dp, `"context_only"`, `"generation_only"`, 1)
	ids, _ := json.Marshal(ctxAns.PromptTokenIDs)
	for _, c := range []struct {
		name, url, body, want string
		code                  int
	}{
		{"generation ok", genS.URL(), `{"prompt":` + string(ids) + `,"max_tokens":4,"disaggregated_params":` + genDP + `}`, `"finish_reason":"length"`, 200},
		{"chat with the context's ids", genS.URL(), `{"messages":[{"role":"user","content":"ignored: the ids are the prompt"}],"prompt_token_ids":` + string(ids) + `,"max_tokens":4,"disaggregated_params":` + genDP + `}`, `"finish_reason":"length"`, 200},
		{"another prompt", genS.URL(), `{"prompt":"other words","max_tokens":4,"disaggregated_params":` + genDP + `}`, "another prompt", 400},
		{"forged state", genS.URL(), `{"prompt":"one","disaggregated_params":{"request_type":"generation_only","ctx_request_id":1,"encoded_opaque_state":"eHl6"}}`, "encoded_opaque_state", 400},
		{"no state", genS.URL(), `{"prompt":"one","disaggregated_params":{"request_type":"generation_only"}}`, "ctx_request_id", 400},
		{"context on gen", genS.URL(), `{"prompt":"one","disaggregated_params":{"request_type":"context_only"}}`, "generation-only", 400},
		{"generation on ctx", ctxS.URL(), `{"prompt":"one","disaggregated_params":` + genDP + `}`, "context-only", 400},
		{"bad type", ctxS.URL(), `{"prompt":"one","disaggregated_params":{"request_type":"both"}}`, "request_type", 400},
		{"streamed context", ctxS.URL(), `{"prompt":"one","stream":true,"disaggregated_params":{"request_type":"context_only"}}`, "stream", 400},
		{"vllm fields", ctxS.URL(), `{"prompt":"one","kv_transfer_params":{"do_remote_decode":true}}`, "disaggregated_params", 400},
	} {
		path := "/v1/completions"
		if strings.HasPrefix(c.body, `{"messages"`) {
			path = "/v1/chat/completions"
		}
		code, b, _ := post(t, c.url+path, c.body)
		if code != c.code || !strings.Contains(string(b), c.want) {
			t.Errorf("%s: HTTP %d %s, want %d with %q", c.name, code, b, c.code, c.want)
		}
	}

	sp := launch(t, Spec{Engine: EngineSGLang, Role: RolePrefill, Encoder: enc, Model: "qwen3", NumBlocks: 256})
	sd := launch(t, Spec{Engine: EngineSGLang, Role: RoleDecode, Encoder: enc, Model: "qwen3", NumBlocks: 256, BootstrapTimeout: 300 * time.Millisecond})
	host, port, _ := net.SplitHostPort(sp.BootstrapAddr())
	boot := func(room int) string {
		return `,"bootstrap_host":"` + host + `","bootstrap_port":` + port + `,"bootstrap_room":` + strconv.Itoa(room)
	}
	for _, c := range []struct {
		name, url, body, want string
		code                  int
	}{
		{"decode without bootstrap", sd.URL(), `{"prompt":"one two"}`, "bootstrap_room", 400},
		{"prefill without bootstrap", sp.URL(), `{"prompt":"one two"}`, "bootstrap_room", 400},
		{"bad room", sd.URL(), `{"prompt":"one two","bootstrap_host":"h","bootstrap_port":1,"bootstrap_room":"x"}`, "bootstrap_room", 400},
		{"no prefill came", sd.URL(), `{"prompt":"one two"` + boot(7) + `}`, "no prefill finished", 504},
		{"unreachable", sd.URL(), `{"prompt":"one two","bootstrap_host":"127.0.0.1","bootstrap_port":1,"bootstrap_room":8}`, "bootstrap 127.0.0.1:1", 502},
		{"trt fields", sd.URL(), `{"prompt":"one two","disaggregated_params":{"request_type":"generation_only"}}`, "bootstrap", 400},
	} {
		code, b, _ := post(t, c.url+"/v1/completions", c.body)
		if code != c.code || !strings.Contains(string(b), c.want) {
			t.Errorf("%s: HTTP %d %s, want %d with %q", c.name, code, b, c.code, c.want)
		}
	}
	// A room prefilled for one prompt does not serve another.
	if code, b, _ := post(t, sp.URL()+"/v1/completions", `{"prompt":"one two three"`+boot(9)+`}`); code != 200 {
		t.Fatalf("prefill: HTTP %d %s", code, b)
	}
	if code, b, _ := post(t, sd.URL()+"/v1/completions", `{"prompt":"four five"`+boot(9)+`}`); code != 400 || !strings.Contains(string(b), "another prompt") {
		t.Errorf("foreign room: HTTP %d %s", code, b)
	}
	// vLLM engines refuse the other engines' fields.
	v := launch(t, Spec{Encoder: enc, Model: "qwen3", NumBlocks: 256})
	for body, want := range map[string]string{
		`{"prompt":"one","disaggregated_params":{"request_type":"context_only"}}`:                  "kv_transfer_params",
		`{"prompt":"one","bootstrap_room":5}`:                                                      "kv_transfer_params",
		`{"prompt":"one","kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":true}}`: "both",
	} {
		if code, b, _ := post(t, v.URL()+"/v1/completions", body); code != 400 || !strings.Contains(string(b), want) {
			t.Errorf("vllm %s: HTTP %d %s", body, code, b)
		}
	}
}

// startProxy runs kvgate with cfg on loopback for the rest of the test and returns its
// public and admin base URLs.
// kvRule is the rule every end-to-end rig starts from: KV-Exact in mode over 16-token
// blocks, hashed as vLLM's sha256_cbor (engine SGLang: SGLang's own page hash), the qwen3
// tokenizer, no health checks; with the staged pool startProxy takes.
func kvRule(t *testing.T, mode proxy.KVMode, engine string) (proxy.Config, *tokenize.Pool) {
	t.Helper()
	_, pool := qwen3(t)
	cfg := proxy.Defaults()
	cfg.Health.Interval = 0
	cfg.KV.Mode = mode
	cfg.KV.BlockSize = 16
	cfg.KV.HashAlgo = "sha256_cbor"
	if engine == EngineSGLang {
		cfg.KV.HashAlgo = ""
	}
	dir, _ := tokenize.StagedDir("qwen3")
	cfg.Models.Tokenizers = []proxy.TokenizerSpec{{Model: "qwen3", Dir: dir}}
	return cfg, pool
}

func startProxy(t *testing.T, cfg proxy.Config, pool *tokenize.Pool) (public, admin string) {
	t.Helper()
	srv, err := proxy.New(cfg, proxy.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Tokenizers: pool})
	if err != nil {
		t.Fatal(err)
	}
	pub, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	adm, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.StartWith(context.Background(), pub, adm); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	})
	return "http://" + pub.Addr().String(), "http://" + adm.Addr().String()
}
