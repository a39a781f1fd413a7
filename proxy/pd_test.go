package proxy

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/kvgate/kvgate/bench/enginepub"
)

func decodeJSON(t *testing.T, s string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		t.Fatalf("engine got non-JSON %q: %v", s, err)
	}
	return m
}

func lastBody(t *testing.T, e *fakeEngine, path string) map[string]any {
	t.Helper()
	var last string
	for _, r := range e.requests() {
		if r.path == path {
			last = r.body
		}
	}
	if last == "" {
		t.Fatalf("%s got no %s request", e.name, path)
	}
	return decodeJSON(t, last)
}

const vllmKTP = `{"do_remote_prefill":true,"do_remote_decode":false,"remote_engine_id":"P-1","remote_block_ids":[3,4],"remote_host":"127.0.0.1","remote_port":5600}`

func TestPDvLLM(t *testing.T) {
	p1, p2, dec := newKVEngine(t, "p1", enginepub.VLLM), newKVEngine(t, "p2", enginepub.VLLM), newKVEngine(t, "d1", enginepub.VLLM)
	prefill := func(w http.ResponseWriter, r *http.Request, body []byte) bool {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"p","choices":[{"index":0,"text":"x","finish_reason":"length"}],"kv_transfer_params":`+vllmKTP+`}`)
		return true
	}
	p1.handle, p2.handle = prefill, prefill
	cfg := kvConfig(t, KVDisaggregated, p1.spec(0, "vllm", ",role=prefill"), p2.spec(1, "vllm", ",role=prefill"), dec.spec(2, "vllm", ",role=decode"))
	s := startProxy(t, cfg)
	body := `{"model":"qwen3","messages":[{"role":"user","content":"hello"}],"stream":true,"stream_options":{"include_usage":true},"max_tokens":50,"user":"alice"}`
	res, out := post(t, s.url("/v1/chat/completions"), body)
	if res.StatusCode != 200 || out != strings.Join(sseEvents("d1"), "") {
		t.Fatalf("%d %q", res.StatusCode, out)
	}
	if res.Header.Get("x-kvgate-endpoint") != "d1" || res.Header.Get("x-kvgate-route") != "kv-miss:no_blocks" {
		t.Errorf("headers %v", res.Header)
	}
	pname := res.Header.Get("x-kvgate-prefill")
	pe := map[string]*kvEngine{"p1": p1, "p2": p2}[pname]
	if pe == nil {
		t.Fatalf("x-kvgate-prefill %q", pname)
	}
	pb := lastBody(t, pe.fakeEngine, "/v1/chat/completions")
	ktp, _ := pb["kv_transfer_params"].(map[string]any)
	if pb["stream"] != false || pb["max_tokens"] != 1.0 || pb["stream_options"] != nil || ktp["do_remote_decode"] != true || ktp["do_remote_prefill"] != false {
		t.Errorf("prefill body %v", pb)
	}
	if pb["messages"] == nil || pb["user"] != "alice" {
		t.Errorf("prefill lost fields: %v", pb)
	}
	db := lastBody(t, dec.fakeEngine, "/v1/chat/completions")
	got, _ := json.Marshal(db["kv_transfer_params"])
	var want any
	json.Unmarshal([]byte(vllmKTP), &want)
	w, _ := json.Marshal(want)
	if string(got) != string(w) || db["stream"] != true || db["max_tokens"] != 50.0 {
		t.Errorf("decode body %v", db)
	}
	// The session sticks to its pair.
	res, _ = post(t, s.url("/v1/chat/completions"), body)
	if res.Header.Get("x-kvgate-route") != "affinity" || res.Header.Get("x-kvgate-prefill") != pname {
		t.Errorf("second turn: route %q prefill %q", res.Header.Get("x-kvgate-route"), res.Header.Get("x-kvgate-prefill"))
	}
	// A prefill endpoint that refuses connections is replaced by the other prefill
	// endpoint, never by the decode one.
	pe.srv.Close()
	res, out = post(t, s.url("/v1/chat/completions"), strings.Replace(body, "alice", "bob", 1))
	if res.StatusCode != 200 || res.Header.Get("x-kvgate-prefill") == pname || res.Header.Get("x-kvgate-endpoint") != "d1" {
		t.Errorf("after prefill death: %d %v %s", res.StatusCode, res.Header, out)
	}
}

func TestPDSGLang(t *testing.T) {
	p, dec := newKVEngine(t, "p1", enginepub.SGLang), newKVEngine(t, "d1", enginepub.SGLang)
	p.handle = func(w http.ResponseWriter, r *http.Request, body []byte) bool {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"prefill"}`)
		return true
	}
	cfg := kvConfig(t, KVDisaggregated, p.spec(0, "sglang", ",role=prefill,bootstrap_port=9123"), dec.spec(1, "sglang", ",role=decode"))
	cfg.KV.HashAlgo = ""
	s := startProxy(t, cfg)
	body := `{"model":"qwen3","prompt":"hello world","max_tokens":5}`
	res, out := post(t, s.url("/v1/completions"), body)
	if res.StatusCode != 200 || !strings.Contains(out, "cmpl-d1") {
		t.Fatalf("%d %s", res.StatusCode, out)
	}
	pb := lastBody(t, p.fakeEngine, "/v1/completions")
	db := lastBody(t, dec.fakeEngine, "/v1/completions")
	for _, m := range []map[string]any{pb, db} {
		if m["bootstrap_host"] != "127.0.0.1" || m["bootstrap_port"] != 9123.0 || m["prompt"] != "hello world" || m["max_tokens"] != 5.0 {
			t.Errorf("body %v", m)
		}
	}
	if pb["bootstrap_room"] == nil || pb["bootstrap_room"] != db["bootstrap_room"] {
		t.Errorf("rooms %v vs %v", pb["bootstrap_room"], db["bootstrap_room"])
	}
}

func trtEngine(t *testing.T, name string, handle func(w http.ResponseWriter, r *http.Request, body []byte) bool) *fakeEngine {
	e := newFakeEngine(t, name)
	e.handle = func(w http.ResponseWriter, r *http.Request, body []byte) bool {
		if r.URL.Path == "/kv_cache_events" {
			io.WriteString(w, "[]")
			return true
		}
		return handle != nil && handle(w, r, body)
	}
	return e
}

func TestPDTensorRTLLM(t *testing.T) {
	var mu sync.Mutex
	finish := "length"
	ctxSrv := trtEngine(t, "ctx", func(w http.ResponseWriter, r *http.Request, body []byte) bool {
		mu.Lock()
		fr := finish
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"ctx","choices":[{"index":0,"text":"A","finish_reason":%q,"disaggregated_params":{"request_type":"context_only","first_gen_tokens":[17],"ctx_request_id":7,"opaque_state":"b3BhcXVl"}}],"prompt_token_ids":[9,8,7],"usage":{"prompt_tokens":3,"prompt_tokens_details":{"cached_tokens":0}}}`, fr)
		return true
	})
	gen := trtEngine(t, "gen", nil)
	cfg := kvConfig(t, KVDisaggregated,
		fmt.Sprintf("name=ctx,url=%s,engine=trtllm,role=prefill", ctxSrv.url()),
		fmt.Sprintf("name=gen,url=%s,engine=trtllm,role=decode", gen.url()))
	s := startProxy(t, cfg)
	res, out := post(t, s.url("/v1/completions"), `{"model":"qwen3","prompt":"hi there","stream":true,"max_tokens":9}`)
	if res.StatusCode != 200 || out != strings.Join(sseEvents("gen"), "") {
		t.Fatalf("%d %q", res.StatusCode, out)
	}
	cb := lastBody(t, ctxSrv, "/v1/completions")
	if dp, _ := cb["disaggregated_params"].(map[string]any); dp["request_type"] != "context_only" || cb["stream"] != false {
		t.Errorf("context body %v", cb)
	}
	gb := lastBody(t, gen, "/v1/completions")
	dp, _ := gb["disaggregated_params"].(map[string]any)
	if dp["request_type"] != "generation_only" || dp["ctx_request_id"] != 7.0 || dp["opaque_state"] != "b3BhcXVl" || gb["stream"] != true {
		t.Errorf("generation body %v", gb)
	}
	if ids, _ := gb["prompt"].([]any); len(ids) != 3 || ids[0] != 9.0 {
		t.Errorf("generation prompt %v", gb["prompt"])
	}
	// Early exit: the context answer already finished.
	mu.Lock()
	finish = "stop"
	mu.Unlock()
	n := gen.count("/v1/completions")
	res, out = post(t, s.url("/v1/completions"), `{"model":"qwen3","prompt":"hi there","max_tokens":1}`)
	if res.StatusCode != 200 || !strings.Contains(out, `"id":"ctx"`) || gen.count("/v1/completions") != n {
		t.Errorf("early exit: %d %s (gen requests %d -> %d)", res.StatusCode, out, n, gen.count("/v1/completions"))
	}
}

func TestPDRuleRefusals(t *testing.T) {
	a := newKVEngine(t, "a", enginepub.VLLM)
	cfg := kvConfig(t, KVDisaggregated, a.spec(0, "vllm", ",role=prefill"))
	_, err := New(cfg, Options{Logger: quietLog, Tokenizers: sharedPool(t)})
	if fe, ok := err.(*FlagError); !ok || fe.Flag != "-kv-mode" || !strings.Contains(fe.Msg, "role=decode") {
		t.Errorf("mode 1 without decode: %v", err)
	}
	cfg = kvConfig(t, KVConverged, "name=l,url=http://127.0.0.1:1,engine=llamacpp")
	_, err = New(cfg, Options{Logger: quietLog})
	if fe, ok := err.(*FlagError); !ok || fe.Flag != "-kv-mode" || !strings.Contains(fe.Msg, "no event contract") || !strings.Contains(fe.Msg, "-select chwbl") {
		t.Errorf("llama.cpp KV-Exact: %v", err)
	}
}

// Mode 1 scores prefill endpoints only: the one holding the prompt's blocks prefills;
// a conversation id keeps the next turn on the same pair.
func TestPDKVHitAndConversationAffinity(t *testing.T) {
	c := vllmChain(t)
	p1, p2, dec := newKVEngine(t, "p1", enginepub.VLLM), newKVEngine(t, "p2", enginepub.VLLM), newKVEngine(t, "d1", enginepub.VLLM)
	prefill := func(w http.ResponseWriter, r *http.Request, body []byte) bool {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"p","choices":[{"index":0,"text":"x","finish_reason":"length"}],"kv_transfer_params":`+vllmKTP+`}`)
		return true
	}
	p1.handle, p2.handle = prefill, prefill
	cfg := kvConfig(t, KVDisaggregated, p1.spec(0, "vllm", ",role=prefill"), p2.spec(1, "vllm", ",role=prefill"), dec.spec(2, "vllm", ",role=decode"))
	s := startProxy(t, cfg)
	toks := engineTokens(t, sharedPrefix)
	p2.store(t, c, toks, 5)
	dec.store(t, c, toks, 7) // decode endpoints are never scored
	waitFor(t, "events", func() bool { return s.kv.inv.Count(1) == 5 && s.kv.inv.Count(2) == 7 })
	res, _ := post(t, s.url("/v1/completions"), complPrompt(sharedPrefix), "X-Conversation-Id", "conv-9")
	if res.StatusCode != 200 || res.Header.Get("x-kvgate-prefill") != "p2" || res.Header.Get("x-kvgate-route") != "kv-hit" || res.Header.Get("x-kvgate-endpoint") != "d1" {
		t.Fatalf("%d %v", res.StatusCode, res.Header)
	}
	res, _ = post(t, s.url("/v1/completions"), complPrompt("another turn entirely"), "X-Conversation-Id", "conv-9")
	if res.Header.Get("x-kvgate-route") != "affinity" || res.Header.Get("x-kvgate-prefill") != "p2" {
		t.Errorf("conversation affinity: %v", res.Header)
	}
}

// The mode-1 prefix trie: prefill engines that have not reported a prompt's blocks yet
// (here: they publish nothing) still get the requests that share its prefix, because
// kvgate remembers where it sent it. Without the trie the load tier alternates between
// the two idle prefill endpoints; /debug/explain records nothing; -pd-prefix-trie-keys 0
// turns the tier off.
func TestPDPrefixTrie(t *testing.T) {
	for _, trieKeys := range []int{1 << 18, 0} {
		t.Run(fmt.Sprintf("keys=%d", trieKeys), func(t *testing.T) {
			p1, p2, dec := newKVEngine(t, "p1", enginepub.VLLM), newKVEngine(t, "p2", enginepub.VLLM), newKVEngine(t, "d1", enginepub.VLLM)
			prefill := func(w http.ResponseWriter, r *http.Request, body []byte) bool {
				w.Header().Set("Content-Type", "application/json")
				io.WriteString(w, `{"id":"p","choices":[{"index":0,"text":"x","finish_reason":"length"}],"kv_transfer_params":`+vllmKTP+`}`)
				return true
			}
			p1.handle, p2.handle = prefill, prefill
			cfg := kvConfig(t, KVDisaggregated, p1.spec(0, "vllm", ",role=prefill"), p2.spec(1, "vllm", ",role=prefill"), dec.spec(2, "vllm", ",role=decode"))
			cfg.PD.PrefixTrieKeys = trieKeys
			s := startProxy(t, cfg)

			res, _ := post(t, s.url("/v1/completions"), complPrompt(sharedPrefix+"first question"))
			if res.StatusCode != 200 || res.Header.Get("x-kvgate-route") != "kv-miss:no_worker" {
				t.Fatalf("first: %d route %q", res.StatusCode, res.Header.Get("x-kvgate-route"))
			}
			first := res.Header.Get("x-kvgate-prefill")
			trieRoutes, elsewhere := 0, 0
			for i := 0; i < 4; i++ {
				res, _ = post(t, s.url("/v1/completions"), complPrompt(sharedPrefix+fmt.Sprintf("follow-up %d", i)))
				route, pre := res.Header.Get("x-kvgate-route"), res.Header.Get("x-kvgate-prefill")
				if trieKeys > 0 && (route != "prefix-trie" || pre != first) {
					t.Errorf("follow-up %d: route %q prefill %q, want prefix-trie to %s", i, route, pre, first)
				}
				if route == "prefix-trie" {
					trieRoutes++
				}
				if pre != first {
					elsewhere++
				}
			}
			if m := scrapeMetrics(t, s); trieKeys > 0 {
				// Requests count against the endpoint that answered the client: the decode one.
				routed := m[`kvgate_requests_total{endpoint="d1",route="prefix-trie"}`]
				if m["kvgate_prefix_trie_keys"] < 1 || routed != 4 {
					t.Errorf("metrics: prefix_trie_keys %v, prefix-trie requests %v", m["kvgate_prefix_trie_keys"], routed)
				}
			}
			if trieKeys == 0 && (trieRoutes != 0 || elsewhere == 0) {
				t.Errorf("trie off: %d prefix-trie routes, %d of 4 follow-ups elsewhere (want 0, > 0)", trieRoutes, elsewhere)
			}
			// A prompt that shares nothing is routed by load, and explaining one
			// records nothing: after an explain, the prompt is still new.
			other := complPrompt(strings.Repeat("Completely unrelated text about sailing boats. ", 12))
			if res, body := post(t, s.admURL("/debug/explain"), other); res.StatusCode != 200 || strings.Contains(body, "prefix-trie") {
				t.Errorf("explain: %d %s", res.StatusCode, body)
			}
			res, _ = post(t, s.url("/v1/completions"), other)
			if route := res.Header.Get("x-kvgate-route"); route != "kv-miss:no_worker" {
				t.Errorf("unrelated prompt: route %q", route)
			}
		})
	}
}
