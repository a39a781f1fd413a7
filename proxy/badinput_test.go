package proxy

import (
	"bufio"
	"encoding/json"
	"fmt"
	"github.com/kvgate/kvgate/bench/enginepub"
	"github.com/kvgate/kvgate/proxy/openai"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// rawExchange writes req as-is on a fresh connection to addr and reads one response.
// The deadline turns a hang into a test failure.
func rawExchange(t *testing.T, addr, req string) (*http.Response, string) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(conn, req); err != nil {
		t.Fatalf("write: %v", err)
	}
	br := bufio.NewReader(conn)
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("no response to %.80q: %v", req, err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	return res, string(b)
}

func rawPost(path, body string, extra ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "POST %s HTTP/1.1\r\nHost: kvgate\r\nContent-Type: application/json\r\nContent-Length: %d\r\n", path, len(body))
	for _, h := range extra {
		b.WriteString(h + "\r\n")
	}
	b.WriteString("Connection: close\r\n\r\n")
	b.WriteString(body)
	return b.String()
}

// TestBadInputEndToEnd: each malformed, hostile or odd request gets its documented
// answer (bench/RELIABILITY.md), nothing reaches an engine that should not, and the
// proxy keeps serving afterwards.
func TestBadInputEndToEnd(t *testing.T) {
	a := newFakeEngine(t, "a")
	cfg := testConfig(a.url())
	cfg.Limits.MaxBodyBytes = 64 << 10
	cfg.Limits.MaxHeaderBytes = 4096
	s := startProxy(t, cfg)
	addr := s.PublicAddr()

	deep := `{"model":"m","prompt":"x","extra":` + strings.Repeat("[", 5000) + strings.Repeat("]", 5000) + `}`
	cases := []struct {
		name, path, body string
		status           int
	}{
		{"truncated JSON", "/v1/completions", `{"model":"m","prompt":"ab`, 400},
		{"truncated after key", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}`, 400},
		{"not JSON", "/v1/completions", `model=m&prompt=x`, 400},
		{"empty body", "/v1/completions", ``, 400},
		{"array body", "/v1/completions", `[{"model":"m"}]`, 400},
		{"trailing garbage", "/v1/completions", `{"model":"m","prompt":"x"} {"a":1}`, 400},
		{"model is a number", "/v1/completions", `{"model":7,"prompt":"x"}`, 400},
		{"stream is a string", "/v1/completions", `{"model":"m","prompt":"x","stream":"yes"}`, 400},
		{"messages is an object", "/v1/chat/completions", `{"model":"m","messages":{"role":"user"}}`, 400},
		{"prompt is an object", "/v1/completions", `{"model":"m","prompt":{"a":1}}`, 400},
		{"deeply nested", "/v1/completions", deep, 400},
		{"invalid UTF-8 in string", "/v1/completions", "{\"model\":\"m\",\"prompt\":\"a\xc3\x28b\"}", 400},
		{"invalid UTF-8 in key", "/v1/completions", "{\"mo\xffdel\":\"m\",\"prompt\":\"x\"}", 400},
		{"lone surrogate escape", "/v1/completions", `{"model":"m","prompt":"\ud800"}`, 200}, // valid JSON; engines decide
		{"bad escape", "/v1/completions", `{"model":"m","prompt":"\q"}`, 400},
		{"NUL byte raw in string", "/v1/completions", "{\"model\":\"m\",\"prompt\":\"a\x00b\"}", 400},
		{"over the body limit", "/v1/completions", `{"model":"m","prompt":"` + strings.Repeat("x", 70<<10) + `"}`, 413},
		{"empty messages", "/v1/chat/completions", `{"model":"m","messages":[]}`, 200},      // forwarded: the engine answers
		{"empty prompt", "/v1/completions", `{"model":"m","prompt":""}`, 200},               // forwarded
		{"unknown model", "/v1/completions", `{"model":"no-such-model","prompt":"x"}`, 200}, // routed by the selector
		{"unknown path", "/v2/unknown", `{}`, 404},                                          // passed through; the engine's 404
	}
	for _, c := range cases {
		res, body := rawExchange(t, addr, rawPost(c.path, c.body))
		if res.StatusCode != c.status {
			t.Errorf("%s: status %d, want %d (%.200s)", c.name, res.StatusCode, c.status, body)
			continue
		}
		if c.status >= 400 && c.path != "/v2/unknown" {
			checkErrorBody(t, body, c.status)
		}
	}
	for _, r := range a.requests() {
		t.Logf("engine got %s %q", r.path, r.body)
	}
	if got := a.count("/v1/completions") + a.count("/v1/chat/completions"); got != 4 {
		t.Errorf("engine saw %d OpenAI requests, want 4 (only the valid ones)", got)
	}
	if got := a.count("/v2/unknown"); got != 1 {
		t.Errorf("unknown path forwarded %d times, want 1", got)
	}
	if n := s.m.bad[BadJSON].Get(); n != 15 {
		t.Errorf("kvgate_bad_requests_total{reason=malformed_json} = %d, want 15", n)
	}
	if n := s.m.bad[BadTooLarge].Get(); n != 1 {
		t.Errorf("kvgate_bad_requests_total{reason=too_large} = %d, want 1", n)
	}
	// Still serving.
	if res, body := post(t, s.url("/v1/completions"), complBody); res.StatusCode != 200 {
		t.Fatalf("after bad input: %d %s", res.StatusCode, body)
	}
}

// TestHugeBodyStreamedNoContentLength: a chunked body far over the limit is cut off at
// the limit with 413 and the connection closed; kvgate does not read it all.
func TestHugeBodyStreamedNoContentLength(t *testing.T) {
	a := newFakeEngine(t, "a")
	cfg := testConfig(a.url())
	cfg.Limits.MaxBodyBytes = 64 << 10
	s := startProxy(t, cfg)
	var sent atomic.Int64
	pr, pw := io.Pipe()
	go func() {
		chunk := []byte(strings.Repeat("x", 32<<10))
		pw.Write([]byte(`{"model":"m","prompt":"`))
		for i := 0; i < 32<<10; i++ { // up to 1 GiB if kvgate kept reading
			if _, err := pw.Write(chunk); err != nil {
				return
			}
			sent.Add(int64(len(chunk)))
		}
		pw.Close()
	}()
	req, _ := http.NewRequest("POST", s.url("/v1/completions"), pr)
	req.ContentLength = -1
	res, err := httpc.Do(req)
	pr.CloseWithError(io.ErrClosedPipe)
	if err != nil {
		t.Fatalf("no answer: %v", err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 413 {
		t.Fatalf("status %d %s", res.StatusCode, body)
	}
	checkErrorBody(t, string(body), 413)
	if n := sent.Load(); n > 64<<20 {
		t.Errorf("kvgate read %d bytes of a body limited to 64 KiB", n)
	}
	if a.count("/v1/completions") != 0 {
		t.Error("engine touched")
	}
}

// TestDeclaredHugeContentLength: a Content-Length over the limit is refused from the
// header alone, before any body byte is read.
func TestDeclaredHugeContentLength(t *testing.T) {
	a := newFakeEngine(t, "a")
	cfg := testConfig(a.url())
	cfg.Limits.MaxBodyBytes = 64 << 10
	s := startProxy(t, cfg)
	// hertz prefetches up to 8 KiB of a streamed body before the handler runs; the
	// client sends that much of its claimed 100 GB, then waits for the answer.
	req := "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 107374182400\r\n\r\n{\"model\":" + strings.Repeat(" ", 16<<10)
	res, body := rawExchange(t, s.PublicAddr(), req)
	if res.StatusCode != 413 {
		t.Fatalf("status %d %s", res.StatusCode, body)
	}
	if a.count("/v1/completions") != 0 {
		t.Error("engine touched")
	}
}

// TestRequestSmuggling: conflicting Content-Length and Transfer-Encoding, duplicate
// Content-Length values and unknown transfer codings never let a second request hide
// in a body: the engine sees exactly the requests kvgate answered for.
func TestRequestSmuggling(t *testing.T) {
	a := newFakeEngine(t, "a")
	s := startProxy(t, testConfig(a.url()))
	smuggled := "GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
	body := `{"model":"m","prompt":"x"}`
	chunked := fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(body), body)
	cases := []struct {
		name, req string
		ok        []int // accepted statuses
	}{
		{"CL and TE: chunked", "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked + smuggled, []int{400}},
		{"TE and CL: chunked", "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 200\r\n\r\n" + chunked + smuggled, []int{400}},
		{"two Content-Lengths", "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + fmt.Sprint(len(body)) + "\r\nContent-Length: 0\r\n\r\n" + body + smuggled, []int{400}},
		{"TE not ending in chunked", "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n" + body + smuggled, []int{501}},
		{"TE gzip, chunked", "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n" + chunked + smuggled, []int{501}},
		{"TE repeated", "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked + smuggled, []int{501}},
		{"TE obfuscated", "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: xchunked\r\nContent-Length: " + fmt.Sprint(len(body)) + "\r\n\r\n" + body + smuggled, []int{400}},
		{"negative CL", "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n" + body, []int{400}},
		{"CL with junk", "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1x\r\n\r\n" + body, []int{400}},
	}
	for _, c := range cases {
		conn, err := net.Dial("tcp", s.PublicAddr())
		if err != nil {
			t.Fatal(err)
		}
		conn.SetDeadline(time.Now().Add(5 * time.Second))
		io.WriteString(conn, c.req)
		br := bufio.NewReader(conn)
		res, err := http.ReadResponse(br, nil)
		if err != nil {
			// A closed connection without an answer is a refusal too, but we document
			// a status: say which.
			t.Errorf("%s: no response: %v", c.name, err)
			conn.Close()
			continue
		}
		io.ReadAll(res.Body)
		res.Body.Close()
		okStatus := false
		for _, st := range c.ok {
			okStatus = okStatus || res.StatusCode == st
		}
		if !okStatus {
			t.Errorf("%s: status %d, want one of %v", c.name, res.StatusCode, c.ok)
		}
		t.Logf("%s: %d", c.name, res.StatusCode)
		// Whatever else the connection carries, it must not become a second request
		// to the engine.
		conn.SetDeadline(time.Now().Add(300 * time.Millisecond))
		if res2, err := http.ReadResponse(br, nil); err == nil {
			t.Logf("%s: second response %d", c.name, res2.StatusCode)
		}
		conn.Close()
	}
	time.Sleep(100 * time.Millisecond)
	if n := a.count("/smuggled"); n != 0 {
		t.Errorf("a smuggled request reached the engine %d times", n)
	}
	for _, r := range a.requests() {
		if r.path == "/v1/completions" && r.body != body {
			t.Errorf("engine got an altered body %q", r.body)
		}
		if len(r.header.Values("Transfer-Encoding")) > 0 {
			t.Errorf("Transfer-Encoding forwarded: %v", r.header)
		}
	}
}

// TestOversizedHeaders: headers over -max-header-bytes get 431 with an OpenAI-style JSON
// error body (hertz answers these itself, before any handler; headConn rewrites its
// plain text), as does a request head hertz cannot parse (400), and none reaches an
// engine; a header block under the limit passes, on a fresh connection and on one that
// already served a request.
func TestOversizedHeaders(t *testing.T) {
	a := newFakeEngine(t, "a")
	cfg := testConfig(a.url())
	cfg.Limits.MaxHeaderBytes = 4096
	s := startProxy(t, cfg)
	body := `{"model":"m","prompt":"x"}`
	res, got := rawExchange(t, s.PublicAddr(), rawPost("/v1/completions", body, "X-Big: "+strings.Repeat("x", 8000)))
	if res.StatusCode != 431 {
		t.Errorf("one big header: %d, want 431", res.StatusCode)
	}
	checkErrorBody(t, got, 431)
	if ct := res.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("one big header: Content-Type %q", ct)
	}
	var many []string
	for i := 0; i < 400; i++ {
		many = append(many, fmt.Sprintf("X-H%d: %s", i, strings.Repeat("v", 20)))
	}
	res, got = rawExchange(t, s.PublicAddr(), rawPost("/v1/completions", body, many...))
	if res.StatusCode != 431 {
		t.Errorf("many headers: %d, want 431", res.StatusCode)
	}
	checkErrorBody(t, got, 431)
	res, got = rawExchange(t, s.PublicAddr(), "GET /"+strings.Repeat("a", 8000)+" HTTP/1.1\r\nHost: x\r\n\r\n")
	if res.StatusCode != 431 && res.StatusCode != 414 {
		t.Errorf("long request line: %d, want 431 or 414", res.StatusCode)
	}
	checkErrorBody(t, got, res.StatusCode)
	for _, cl := range []string{"abc", "-5", "1 2", "99999999999999999999999"} {
		res, got = rawExchange(t, s.PublicAddr(), "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: "+cl+"\r\n\r\n"+body)
		if res.StatusCode != 400 {
			t.Errorf("Content-Length %q: %d, want 400", cl, res.StatusCode)
		}
		checkErrorBody(t, got, 400)
	}
	// The second request of a keep-alive connection is refused the same way, and the
	// first one's answer (an engine's) passes through untouched.
	conn, err := net.Dial("tcp", s.PublicAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	keepAlive := strings.Replace(rawPost("/v1/completions", body), "Connection: close\r\n", "", 1)
	io.WriteString(conn, keepAlive+rawPost("/v1/completions", body, "X-Big: "+strings.Repeat("x", 8000)))
	br := bufio.NewReader(conn)
	for i, want := range []int{200, 431} {
		res, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("keep-alive response %d: %v", i, err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != want {
			t.Errorf("keep-alive response %d: %d, want %d", i, res.StatusCode, want)
		}
		if want == 431 {
			checkErrorBody(t, string(b), 431)
		} else if !strings.Contains(string(b), `"a"`) && len(b) == 0 {
			t.Errorf("keep-alive response %d: empty engine answer", i)
		}
	}
	if n := len(a.requests()); n != 1 {
		t.Errorf("%d requests reached the engine, want the 1 well-formed one", n)
	}
	m := scrapeMetrics(t, s)
	if m[`kvgate_bad_requests_total{reason="header_too_large"}`] < 3 || m[`kvgate_bad_requests_total{reason="malformed_head"}`] < 4 {
		t.Errorf("bad request counters: header_too_large %v, malformed_head %v",
			m[`kvgate_bad_requests_total{reason="header_too_large"}`], m[`kvgate_bad_requests_total{reason="malformed_head"}`])
	}
	res, _ = rawExchange(t, s.PublicAddr(), rawPost("/v1/completions", body, "X-Fits: "+strings.Repeat("x", 2000)))
	if res.StatusCode != 200 {
		t.Errorf("header under the limit: %d", res.StatusCode)
	}
}

// TestKVBadInput: in KV-Exact mode, a 1M-token prompt is not tokenized (over
// -kv-max-prompt-bytes: kv-miss:too_long, routed by the selector, counted); a prompt under
// the bound is; unknown models and empty messages are routed by the selector and counted.
func TestKVBadInput(t *testing.T) {
	c := vllmChain(t)
	a, b := newKVEngine(t, "a", enginepub.VLLM), newKVEngine(t, "b", enginepub.VLLM)
	cfg := kvConfig(t, KVConverged, a.spec(0, "vllm", ""), b.spec(1, "vllm", ""))
	s := startProxy(t, cfg)
	toks := engineTokens(t, sharedPrefix)
	b.store(t, c, toks, 8)
	waitFor(t, "events applied", func() bool { return s.kv.inv.Count(1) == 8 })

	// ~1M tokens (4.25 MB of text): well under -max-body-bytes, over the 1 MiB bound.
	huge := sharedPrefix + strings.Repeat("hello world, the quick brown fox. ", 1<<20/8)
	res, body := post(t, s.url("/v1/completions"), complPrompt(huge))
	if res.StatusCode != 200 || res.Header.Get("x-kvgate-route") != "kv-miss:too_long" {
		t.Fatalf("1M-token prompt: %d route=%q %.200s", res.StatusCode, res.Header.Get("x-kvgate-route"), body)
	}
	// Routing it costs no tokenizing: measured on the decision itself (tokenizing and
	// hashing 1M tokens allocates ~70 MB: BenchmarkHugePrompt).
	st := s.getState()
	st.body = append(st.body[:0], complPrompt(huge)...)
	if err := openai.Scan(st.body, &st.oa); err != nil {
		t.Fatal(err)
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	before := ms.TotalAlloc
	var d decision
	s.decide(st, &d, false)
	runtime.ReadMemStats(&ms)
	if grown := ms.TotalAlloc - before; grown > 64<<10 || d.route != RouteMissTooLong || len(st.tokens) != 0 {
		t.Errorf("deciding a 1M-token prompt: %d bytes allocated, route %v, %d tokens", grown, d.route, len(st.tokens))
	}
	s.putState(st)
	if n := s.m.misses[RouteMissTooLong].Get(); n != 2 {
		t.Errorf("kvgate_kv_misses_total{reason=too_long} = %d, want 2", n)
	}
	// Chat messages are bounded the same way.
	msgs, _ := json.Marshal(map[string]any{"model": "qwen3", "messages": []map[string]string{{"role": "user", "content": huge}}})
	res, _ = post(t, s.url("/v1/chat/completions"), string(msgs))
	if res.StatusCode != 200 || res.Header.Get("x-kvgate-route") != "kv-miss:too_long" {
		t.Errorf("1M-token chat: %d route=%q", res.StatusCode, res.Header.Get("x-kvgate-route"))
	}
	// Under the bound, the shared prefix still finds its blocks.
	res, _ = post(t, s.url("/v1/completions"), complPrompt(sharedPrefix+strings.Repeat("more words here. ", 20000)))
	if res.StatusCode != 200 || res.Header.Get("x-kvgate-route") != "kv-hit" || res.Header.Get("x-kvgate-endpoint") != "b" {
		t.Errorf("long prompt under the bound: %d %s %s", res.StatusCode, res.Header.Get("x-kvgate-route"), res.Header.Get("x-kvgate-endpoint"))
	}
	for _, tc := range []struct{ path, body, route string }{
		{"/v1/completions", `{"model":"no-such-model","prompt":"` + sharedPrefix + `"}`, "kv-miss:model_unknown"},
		{"/v1/chat/completions", `{"model":"qwen3","messages":[]}`, "kv-miss:text_empty"},
		{"/v1/chat/completions", `{"model":"qwen3"}`, "kv-miss:text_empty"},
		{"/v1/completions", `{"prompt":"` + sharedPrefix + `"}`, "kv-miss:model_unknown"},
		{"/v1/chat/completions", `{"model":"qwen3","messages":[{"role":"user"}]}`, ""}, // engine decides; kvgate routes somewhere
		{"/v1/chat/completions", `{"model":"qwen3","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:,"}}]}]}`, ""},
	} {
		res, body := post(t, s.url(tc.path), tc.body)
		if res.StatusCode != 200 || (tc.route != "" && res.Header.Get("x-kvgate-route") != tc.route) {
			t.Errorf("%.60s: %d route=%q want %q (%.200s)", tc.body, res.StatusCode, res.Header.Get("x-kvgate-route"), tc.route, body)
		}
	}
	if n := s.m.unknownMdl.Get(); n != 1 {
		t.Errorf("kvgate_unknown_model_total = %d, want 1", n)
	}
}

// TestMalformedTarget: request targets hertz's router cannot parse get 400, not a
// dropped connection; the proxy keeps serving.
func TestMalformedTarget(t *testing.T) {
	a := newFakeEngine(t, "a")
	s := startProxy(t, testConfig(a.url()))
	for _, r := range []string{"GET A:0 HTTP/1.0\r\n\r\n", "GET A:0 HTTP/1.1\r\nHost:\r\n\r\n", "POST x:1 HTTP/1.0\r\nContent-Length: 2\r\n\r\n{}"} {
		res, body := rawExchange(t, s.PublicAddr(), r)
		if res.StatusCode != 400 {
			t.Errorf("%q: %d %s", r, res.StatusCode, body)
			continue
		}
		checkErrorBody(t, body, 400)
	}
	if n := s.m.bad[BadTarget].Get(); n == 0 {
		t.Error("not counted")
	}
	if res, body := post(t, s.url("/v1/completions"), complBody); res.StatusCode != 200 {
		t.Fatalf("after: %d %s", res.StatusCode, body)
	}
	if len(a.requests()) != 1 {
		t.Errorf("engine got %d requests", len(a.requests()))
	}
}
