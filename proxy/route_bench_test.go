package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"

	"github.com/kvgate/kvgate/hashcore"
	"github.com/kvgate/kvgate/internal/testfix"
	"github.com/kvgate/kvgate/proxy/openai"
	"github.com/kvgate/kvgate/shard"
	"github.com/kvgate/kvgate/tokenize"
)

// chatBody4k is a chat request of about 4k tokens (Qwen3), with a system prompt, tools
// and several turns, like an agent's context.
func chatBody4k() []byte {
	var msgs []map[string]any
	msgs = append(msgs, map[string]any{"role": "system", "content": "You are a careful assistant. " + strings.Repeat("Follow the style guide: be concise, cite sources, and prefer simple words. ", 40)})
	for i := 0; i < 12; i++ {
		msgs = append(msgs, map[string]any{"role": "user", "content": fmt.Sprintf("Question %d: ", i) + strings.Repeat("How does the prefix cache decide which blocks to keep when memory is tight? ", 12)})
		msgs = append(msgs, map[string]any{"role": "assistant", "content": strings.Repeat("It evicts the least recently used blocks first, keeping shared prefixes. ", 10)})
	}
	msgs = append(msgs, map[string]any{"role": "user", "content": "Summarize."})
	b, _ := json.Marshal(map[string]any{
		"model": "qwen3", "messages": msgs, "stream": true, "max_tokens": 256, "user": "u-1",
		"chat_template_kwargs": map[string]any{"enable_thinking": false},
	})
	return b
}

// benchServer is a KV-Exact mode-3 rule with 8 endpoints (not started: routing only);
// endpoint 3 holds the prompt's first half, endpoint 5 a quarter, others noise.
func benchServer(tb testing.TB, body []byte) (*Server, *reqState) {
	return benchServerWith(tb, body, func(cfg *Config) {
		// The cold path: nothing memoized (BenchmarkRouteFollowup measures the memos).
		cfg.Models.TokenizeMemoBytes, cfg.KV.ChainMemoBytes, cfg.Models.RenderMemoBytes = 0, 0, 0
	})
}

func benchServerWith(tb testing.TB, body []byte, edit func(*Config)) (*Server, *reqState) {
	specs := make([]string, 8)
	for i := range specs {
		specs[i] = fmt.Sprintf("name=e%d,url=http://127.0.0.1:%d,engine=vllm,events=tcp://127.0.0.1:%d", i, 20000+i, 30000+i)
	}
	cfg := Defaults()
	cfg.KV.Mode = KVConverged
	cfg.KV.BlockSize = blockSize
	cfg.KV.HashAlgo = "sha256_cbor"
	cfg.Health.Interval = 0
	cfg.Models.Tokenizers = []TokenizerSpec{{Model: "qwen3", Dir: qwen3Dir(tb)}}
	for _, sp := range specs {
		e, err := ParseEndpoint(sp)
		if err != nil {
			tb.Fatal(err)
		}
		cfg.Fleet.Endpoints = append(cfg.Fleet.Endpoints, e)
	}
	edit(&cfg)
	s, err := New(cfg, Options{Logger: quietLog, Tokenizers: sharedPool(tb)})
	if err != nil {
		tb.Fatal(err)
	}
	st := s.getState()
	st.body = append(st.body[:0], body...)
	st.chat = true
	if err := openai.Scan(st.body, &st.oa); err != nil {
		tb.Fatal(err)
	}
	m := sharedPool(tb).Get("qwen3")
	toks, err := m.EncodeChat(nil, &tokenize.ChatInput{Messages: st.oa.Value[openai.FMessages].Bytes(st.body),
		TemplateKwargs: st.oa.Value[openai.FChatTemplateKwargs].Bytes(st.body), AddGenerationPrompt: true})
	if err != nil {
		tb.Fatal(err)
	}
	keys := hashcore.Keys(s.kv.chain, nil, toks, nil)
	s.kv.inv.Add(3, keys[:len(keys)/2])
	s.kv.inv.Add(5, keys[:len(keys)/4])
	noise := make([]uint64, 20000)
	for i := range noise {
		noise[i] = uint64(i)*0x9E3779B97F4A7C15 + 1
	}
	for ep := 0; ep < 8; ep++ {
		s.kv.inv.Add(ep, noise[ep*2000:(ep+1)*2000])
	}
	return s, st
}

// BenchmarkRouteStages reports each stage of the request path for a ~4k-token chat
// prompt against 8 endpoints.
func BenchmarkRouteStages(b *testing.B) {
	body := chatBody4k()
	s, st := benchServer(b, body)
	m := sharedPool(b).Get("qwen3")
	in := &tokenize.ChatInput{Messages: st.oa.Value[openai.FMessages].Bytes(st.body),
		TemplateKwargs: st.oa.Value[openai.FChatTemplateKwargs].Bytes(st.body), AddGenerationPrompt: true}
	var rendered []byte
	rendered, _ = m.RenderChat(rendered[:0], in)
	toks, _ := m.EncodeChat(nil, in)
	keys := hashcore.Keys(s.kv.chain, nil, toks, nil)
	el := shard.NewMask(8)
	el.SetAll(8)
	scores := make([]int32, 8)
	b.Run("parse", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(st.body)))
		clock := testfix.StartCPUClock()
		for b.Loop() {
			openai.Scan(st.body, &st.oa)
		}
		clock.Stop(b, b.N)
	})
	b.Run("template", func(b *testing.B) {
		b.ReportAllocs()
		clock := testfix.StartCPUClock()
		for b.Loop() {
			rendered, _ = m.RenderChat(rendered[:0], in)
		}
		clock.Stop(b, b.N)
	})
	b.Run("tokenize", func(b *testing.B) { // template + encode, as the request path runs it
		b.ReportAllocs()
		clock := testfix.StartCPUClock()
		for b.Loop() {
			toks, _ = m.EncodeChat(toks, in)
		}
		clock.Stop(b, b.N)
		b.ReportMetric(float64(len(toks)), "tokens")
	})
	b.Run("hash", func(b *testing.B) {
		b.ReportAllocs()
		clock := testfix.StartCPUClock()
		for b.Loop() {
			keys = hashcore.Keys(s.kv.chain, keys[:0], toks, nil)
		}
		clock.Stop(b, b.N)
		b.ReportMetric(float64(len(keys)), "blocks")
	})
	b.Run("score", func(b *testing.B) {
		b.ReportAllocs()
		clock := testfix.StartCPUClock()
		for b.Loop() {
			s.kv.inv.Score(keys, el, shard.Overlap, scores)
		}
		clock.Stop(b, b.N)
	})
	b.Run("select", func(b *testing.B) { // eligibility, ladder and load bound around a score
		b.ReportAllocs()
		var d decision
		clock := testfix.StartCPUClock()
		for b.Loop() {
			s.baseEligible(st, st.eligible, nil)
			s.loads.Bound(st.eligible, s.cfg.KV.LoadFactor)
			d.ep = s.rr.Pick(st.eligible)
		}
		clock.Stop(b, b.N)
	})
	b.Run("full", func(b *testing.B) {
		b.ReportAllocs()
		var d decision
		clock := testfix.StartCPUClock()
		for b.Loop() {
			openai.Scan(st.body, &st.oa)
			s.decide(st, &d, false)
		}
		clock.Stop(b, b.N)
	})
}

// followupBody is chatBody4k whose last user message ends in a 7-digit turn number, and
// the offset of those digits: rewriting them makes the same conversation's next turn
// (everything before it as routed before, the new message new text) without building a
// body per iteration.
func followupBody() ([]byte, int) {
	b := chatBody4k()
	const last = `"Summarize."`
	i := bytes.LastIndex(b, []byte(last))
	out := append([]byte{}, b[:i]...)
	out = append(out, `"Summarize the discussion so far for turn 0000000, in three bullet points."`...)
	out = append(out, b[i+len(last):]...)
	return out, i + len(`"Summarize the discussion so far for turn `)
}

// BenchmarkRouteFollowup routes turn n+1 of a ~4.7k-token Qwen3 chat whose turns up to
// n were routed before (8 endpoints, the memos on as by default): each iteration's last
// message is new text, so the tokenization memo answers every earlier segment and the
// chain memo every earlier stretch of blocks. BenchmarkRouteStages/full is the cold case.
func BenchmarkRouteFollowup(b *testing.B) {
	body, at := followupBody()
	s, st := benchServerWith(b, body, func(*Config) {})
	var d decision
	turn := func(n int) {
		for k := 6; k >= 0; k-- {
			st.body[at+k] = byte('0' + n%10)
			n /= 10
		}
		openai.Scan(st.body, &st.oa)
		clear(st.excluded)
		s.decide(st, &d, false)
	}
	turn(0) // the conversation so far, routed once
	b.ReportAllocs()
	n := 1
	clock := testfix.StartCPUClock()
	for b.Loop() {
		turn(n)
		n++
	}
	clock.Stop(b, b.N)
	b.ReportMetric(float64(len(st.tokens)), "tokens")
}

// FuzzRoute drives arbitrary bodies through parsing and the KV-Exact ladder: any body
// either is refused by the scanner or gets a decision; nothing panics.
func FuzzRoute(f *testing.F) {
	f.Add([]byte(complPrompt(sharedPrefix)))
	f.Add(chatBody4k())
	f.Add([]byte(`{"model":"qwen3","messages":[{"role":"user","content":[{"type":"text","text":"x"}]}],"tools":null}`))
	f.Add([]byte(`{"model":"qwen3","prompt":[[1,2,3]],"cache_salt":"\u00e9"}`))
	s, st := benchServer(f, chatBody4k())
	f.Fuzz(func(t *testing.T, body []byte) {
		st.body = append(st.body[:0], body...)
		if openai.Scan(st.body, &st.oa) != nil {
			return
		}
		for _, chat := range []bool{true, false} {
			st.chat = chat
			clear(st.excluded)
			var d decision
			s.decide(st, &d, false)
			if d.ep < 0 || d.ep >= len(s.roster().eps) {
				t.Fatalf("no endpoint for %q (route %v)", body, d.route)
			}
		}
	})
}

// BenchmarkProxyRoundTrip compares a non-streamed request sent directly to a local
// engine with the same request through kvgate (rr), reporting the added latency.
func BenchmarkProxyRoundTrip(b *testing.B) {
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"x","choices":[{"text":"hi"}],"usage":{"prompt_tokens":4,"prompt_tokens_details":{"cached_tokens":0}}}`)
	}))
	defer engine.Close()
	cfg := testConfig(engine.URL)
	s, err := New(cfg, Options{Logger: quietLog})
	if err != nil {
		b.Fatal(err)
	}
	pub, adm := listenBench(b), listenBench(b)
	if err := s.StartWith(context.Background(), pub, adm); err != nil {
		b.Fatal(err)
	}
	defer s.Shutdown(context.Background())
	cl := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	run := func(b *testing.B, url, body string) {
		b.ReportAllocs()
		cpu0 := processCPU()
		for b.Loop() {
			res, err := cl.Post(url, "application/json", strings.NewReader(body))
			if err != nil {
				b.Fatal(err)
			}
			io.Copy(io.Discard, res.Body)
			res.Body.Close()
		}
		// The process's CPU (client, kvgate and engine; kvgate's share is the kvgate
		// row's minus direct's): moves far less with the machine's load than ns/op.
		b.ReportMetric(float64(processCPU()-cpu0)/1e3/float64(b.N), "cpu-us/op")
	}
	// 16k: a 4k-token prompt's body, sent upstream as its own buffer by hertz.
	large := `{"model":"m","prompt":"` + strings.Repeat("cache ", 16<<10/6) + `"}`
	b.Run("direct", func(b *testing.B) { run(b, engine.URL+"/v1/completions", complBody) })
	b.Run("kvgate", func(b *testing.B) { run(b, s.url("/v1/completions"), complBody) })
	b.Run("direct-16k", func(b *testing.B) { run(b, engine.URL+"/v1/completions", large) })
	b.Run("kvgate-16k", func(b *testing.B) { run(b, s.url("/v1/completions"), large) })
}

// processCPU is this process's user and system time in nanoseconds.
func processCPU() int64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru) //nolint:errcheck
	return ru.Utime.Nano() + ru.Stime.Nano()
}

func listenBench(b *testing.B) net.Listener {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	return ln
}

// BenchmarkNoteStores is the stale check's share of every answered request
// (Server.noteStores): a 512-block prompt (8,192 tokens) held in part by the endpoint it
// went to, over 8 endpoints of which one has 4 data-parallel ranks and no rank named.
func BenchmarkNoteStores(b *testing.B) {
	s, st, d := noteStoresFixture()
	b.ReportAllocs()
	for b.Loop() {
		s.noteStores(st, d)
	}
	if s.states.eps[d.ep].sentNew.Load() == 0 {
		b.Fatal("nothing counted")
	}
}

// noteStoresFixture is a server with just what noteStores reads, a request state whose
// prompt has 512 blocks of which the ranks of endpoint 7 reported 100-400, and its
// decision (no rank named).
func noteStoresFixture() (*Server, *reqState, *decision) {
	specs := make([]EndpointSpec, 8)
	for i := range specs {
		specs[i].Name = fmt.Sprint("e", i)
	}
	specs[7].DP = 4
	l := newRankLayout(specs, false, false)
	s := &Server{kv: &kvRouter{ranks: l}, states: &stateWatcher{eps: make([]epState, len(specs))}}
	st := newReqState(l.slots())
	st.reset()
	for i := 0; i < 512; i++ {
		st.keys = append(st.keys, uint64(i)+1)
	}
	for r := 0; r < 4; r++ {
		st.scores[l.slot(7, r)] = int32(100 * (r + 1))
	}
	return s, st, &decision{ep: 7, slot: -1}
}
