package proxy

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/bench/enginepub"
)

// rawRoundTrip writes req on a fresh connection to the proxy and reads one response.
func rawRoundTrip(t *testing.T, addr, req string) (*http.Response, string) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(conn, req)
	res, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	return res, string(b)
}

// TestConnectionListedHeadersNotForwarded: every header a client's Connection
// header names is per-hop (RFC 9110 7.6.1), whichever Connection line names it: one
// after another, or beside "Connection: close" (hertz keeps close as a flag and Peek
// then answers only "close").
func TestConnectionListedHeadersNotForwarded(t *testing.T) {
	a := newFakeEngine(t, "a")
	s := startProxy(t, testConfig(a.url()))
	cases := map[string]string{
		"two lines":       "Connection: keep-alive\r\nConnection: X-Secret\r\n",
		"close after":     "Connection: X-Secret\r\nConnection: close\r\n",
		"close before":    "Connection: close\r\nConnection: X-Secret\r\n",
		"one list":        "Connection: keep-alive, X-Secret\r\n",
		"one list, close": "Connection: close, X-Secret\r\n",
	}
	for name, conn := range cases {
		n := len(a.requests())
		res, body := rawRoundTrip(t, s.PublicAddr(), "POST /v1/completions HTTP/1.1\r\nHost: x\r\n"+conn+
			"X-Secret: s3cret\r\nX-Kept: k\r\nContent-Type: application/json\r\nContent-Length: "+itoa(len(complBody))+"\r\n\r\n"+complBody)
		if res.StatusCode != 200 {
			t.Fatalf("%s: %d %s", name, res.StatusCode, body)
		}
		reqs := a.requests()
		if len(reqs) != n+1 {
			t.Fatalf("%s: engine saw %d requests", name, len(reqs)-n)
		}
		h := reqs[n].header
		if v := h.Get("X-Secret"); v != "" {
			t.Errorf("%s: header named by Connection forwarded: X-Secret: %q", name, v)
		}
		if h.Get("X-Kept") != "k" {
			t.Errorf("%s: end-to-end header lost: %v", name, h)
		}
		if len(h.Values("Connection")) > 0 && !strings.EqualFold(h.Get("Connection"), "keep-alive") {
			t.Errorf("%s: Connection forwarded: %v", name, h.Values("Connection"))
		}
	}
}

// TestResponseConnectionListedHeaders: the same on the way back, for an engine
// whose answer hertz marks close (a body delimited by the connection's close, or an
// explicit close beside another Connection line).
func TestResponseConnectionListedHeaders(t *testing.T) {
	answers := []string{
		"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: x-private\r\nX-Private: 1\r\nX-Engine: e\r\n\r\n{}",
		"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: x-private\r\nConnection: close\r\nX-Private: 1\r\nX-Engine: e\r\n\r\n{}",
	}
	for i, answer := range answers {
		engine := rawEngine(t, func(conn net.Conn) {
			defer conn.Close()
			req, err := http.ReadRequest(bufio.NewReader(conn))
			if err != nil {
				return
			}
			io.Copy(io.Discard, req.Body)
			io.WriteString(conn, answer)
		})
		s := startProxy(t, testConfig(engine))
		res, body := post(t, s.url("/v1/completions"), complBody)
		if res.StatusCode != 200 || body != "{}" {
			t.Fatalf("answer %d: %d %q", i, res.StatusCode, body)
		}
		if res.Header.Get("X-Private") != "" {
			t.Errorf("answer %d: header named by the engine's Connection forwarded: %v", i, res.Header)
		}
		if res.Header.Get("X-Engine") != "e" {
			t.Errorf("answer %d: end-to-end header lost: %v", i, res.Header)
		}
	}
}

// TestBodylessAnswersKeepFraming: an answer that has no body by definition (a
// 204 or 304, any answer to HEAD: RFC 9112 6.3) is relayed without one. A chunked
// terminator after it would be read as the start of the next answer on the client's
// connection.
func TestBodylessAnswersKeepFraming(t *testing.T) {
	engine := rawEngine(t, func(conn net.Conn) {
		defer conn.Close()
		br := bufio.NewReader(conn)
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			io.Copy(io.Discard, req.Body)
			switch {
			case req.Method == "HEAD":
				io.WriteString(conn, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
			case req.URL.Path == "/nocontent":
				io.WriteString(conn, "HTTP/1.1 204 No Content\r\nX-Engine: e\r\n\r\n")
			case req.URL.Path == "/notmodified":
				io.WriteString(conn, "HTTP/1.1 304 Not Modified\r\nEtag: \"x\"\r\n\r\n")
			default:
				io.WriteString(conn, "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok")
			}
		}
	})
	s := startProxy(t, testConfig(engine))
	for _, first := range []string{
		"DELETE /nocontent HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET /notmodified HTTP/1.1\r\nHost: x\r\nIf-None-Match: \"x\"\r\n\r\n",
		"HEAD /v1/models HTTP/1.1\r\nHost: x\r\n\r\n",
	} {
		conn, err := net.Dial("tcp", s.PublicAddr())
		if err != nil {
			t.Fatal(err)
		}
		conn.SetDeadline(time.Now().Add(5 * time.Second))
		br := bufio.NewReader(conn)
		method := first[:strings.IndexByte(first, ' ')]
		io.WriteString(conn, first)
		res, err := http.ReadResponse(br, &http.Request{Method: method})
		if err != nil {
			t.Fatalf("%q: %v", first, err)
		}
		io.ReadAll(res.Body)
		res.Body.Close()
		// The next answer on the same connection must be the next request's.
		io.WriteString(conn, "GET /next HTTP/1.1\r\nHost: x\r\n\r\n")
		res, err = http.ReadResponse(br, nil)
		if err != nil {
			t.Errorf("%q: the answer after it is unreadable (stray body bytes on the connection): %v", first, err)
		} else {
			b, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if res.StatusCode != 200 || string(b) != "ok" {
				t.Errorf("%q: next answer %d %q", first, res.StatusCode, b)
			}
		}
		conn.Close()
	}
}

// TestPDAffinityKeysBounded: a session key is the client's `user` field (or
// X-Conversation-Id) and mode 1 remembers each for -pd-affinity-ttl, up to
// -pd-affinity-max sessions (100000 by default). What one remembered session costs
// must not be the client's to choose: 24 requests with a distinct 1 MB `user` each
// must not leave 24 MB behind.
func TestPDAffinityKeysBounded(t *testing.T) {
	p, dec := newKVEngine(t, "p1", enginepub.VLLM), newKVEngine(t, "d1", enginepub.VLLM)
	forget := func(e *fakeEngine) { // the fake engines' request log would hold the bodies
		e.mu.Lock()
		e.reqs = nil
		e.mu.Unlock()
	}
	p.handle = func(w http.ResponseWriter, r *http.Request, body []byte) bool {
		forget(p.fakeEngine)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"p","choices":[{"index":0,"text":"x","finish_reason":"length"}],"kv_transfer_params":`+vllmKTP+`}`)
		return true
	}
	dec.handle = func(w http.ResponseWriter, r *http.Request, body []byte) bool {
		forget(dec.fakeEngine)
		return false
	}
	s := startProxy(t, kvConfig(t, KVDisaggregated, p.spec(0, "vllm", ",role=prefill"), dec.spec(1, "vllm", ",role=decode")))
	user := strings.Repeat("u", 1<<20)
	send := func(i int) {
		body := `{"model":"qwen3","prompt":"hello","max_tokens":2,"user":"` + itoa(i) + user + `"}`
		if res, out := post(t, s.url("/v1/completions"), body); res.StatusCode != 200 {
			t.Fatalf("%d %s", res.StatusCode, out)
		}
	}
	send(-1) // warm the pools
	heap := func() uint64 {
		var ms runtime.MemStats
		runtime.GC()
		runtime.GC()
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	before := heap()
	const n = 24
	for i := range n {
		send(i)
	}
	if s.aff.len() != n+1 {
		t.Fatalf("%d sessions remembered, want %d", s.aff.len(), n+1)
	}
	if grew := int64(heap()) - int64(before); grew > 8<<20 {
		t.Errorf("%d sessions of 1 MB keys left %d MB on the heap", n, grew>>20)
	}
}

// TestSGLangPrefillReleasedWhenNoDecode: SGLang's prefill engine holds its request
// until a decode engine fetches the KV (or its bootstrap timeout, minutes). When no
// decode endpoint took the request (all refused), the prefill request is cancelled and
// the client answered at once, not when the prefill engine gives up.
func TestSGLangPrefillReleasedWhenNoDecode(t *testing.T) {
	p, dec := newKVEngine(t, "p1", enginepub.SGLang), newKVEngine(t, "d1", enginepub.SGLang)
	released := make(chan struct{}, 4)
	p.handle = func(w http.ResponseWriter, r *http.Request, body []byte) bool {
		if r.URL.Path != "/v1/completions" {
			return false
		}
		select {
		case <-r.Context().Done(): // kvgate closed the connection
			released <- struct{}{}
		case <-time.After(8 * time.Second): // the engine's bootstrap timeout
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"prefill"}`)
		return true
	}
	cfg := kvConfig(t, KVDisaggregated, p.spec(0, "sglang", ",role=prefill"), dec.spec(1, "sglang", ",role=decode"))
	cfg.KV.HashAlgo = ""
	s := startProxy(t, cfg)
	dec.srv.Close() // the decode engine refuses connections
	t0 := time.Now()
	res, out := post(t, s.url("/v1/completions"), `{"model":"qwen3","prompt":"hello world","max_tokens":5}`)
	took := time.Since(t0)
	if res.StatusCode < 500 {
		t.Fatalf("%d %s", res.StatusCode, out)
	}
	checkErrorBody(t, out, res.StatusCode)
	if took > 3*time.Second {
		t.Errorf("answered %d after %v: kvgate waited for a prefill leg no decode engine could ever complete", res.StatusCode, took.Round(time.Millisecond))
	}
	select {
	case <-released:
	case <-time.After(5 * time.Second):
		t.Error("the prefill request was never cancelled")
	}
}

// TestInterimAnswerNotFinal: an engine may send an interim answer before its
// final one (RFC 9110 15.2; 103 Early Hints). hertz's client takes any but a 100 for
// the final answer and drops what follows; relayed as final, it left the client
// waiting for an answer that never came. The client gets a JSON 502 at once instead.
func TestInterimAnswerNotFinal(t *testing.T) {
	engine := rawEngine(t, func(conn net.Conn) {
		defer conn.Close()
		req, err := http.ReadRequest(bufio.NewReader(conn))
		if err != nil {
			return
		}
		io.Copy(io.Discard, req.Body)
		io.WriteString(conn, "HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n"+
			"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
		time.Sleep(5 * time.Second) // an engine keeps its connection open
	})
	s := startProxy(t, testConfig(engine))
	c := &http.Client{Timeout: 3 * time.Second}
	res, err := c.Post(s.url("/v1/completions"), "application/json", strings.NewReader(complBody))
	if err != nil {
		t.Fatalf("no final answer: %v", err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 502 {
		t.Fatalf("%d %q", res.StatusCode, b)
	}
	checkErrorBody(t, string(b), 502)
}

// TestInterimPrefillAnswer: the same for a mode-1 prefill leg, whose non-200
// answers are relayed as they came.
func TestInterimPrefillAnswer(t *testing.T) {
	p, dec := newKVEngine(t, "p1", enginepub.VLLM), newKVEngine(t, "d1", enginepub.VLLM)
	p.handle = func(w http.ResponseWriter, r *http.Request, body []byte) bool {
		if r.URL.Path != "/v1/completions" {
			return false
		}
		w.Header().Set("Link", "</style.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"p","choices":[{"index":0,"text":"x","finish_reason":"length"}],"kv_transfer_params":`+vllmKTP+`}`)
		return true
	}
	s := startProxy(t, kvConfig(t, KVDisaggregated, p.spec(0, "vllm", ",role=prefill"), dec.spec(1, "vllm", ",role=decode")))
	c := &http.Client{Timeout: 3 * time.Second}
	res, err := c.Post(s.url("/v1/completions"), "application/json", strings.NewReader(`{"model":"qwen3","prompt":"hello","max_tokens":2}`))
	if err != nil {
		t.Fatalf("no final answer: %v", err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 502 {
		t.Fatalf("%d %q", res.StatusCode, b)
	}
	checkErrorBody(t, string(b), 502)
}

// TestFramingDuplicateContentLength: framing that a front proxy may read otherwise than hertz does
// is refused and the connection closed (RFC 9112 6.1, 6.3): two Content-Length lines
// (hertz frames by the last, a front proxy may by the first) and Transfer-Encoding
// "identity" (hertz drops the line and frames by Content-Length or as empty, where the
// RFC says the length cannot be determined). Either way the bytes after the body the
// client meant must never reach an engine as a request of their own.
func TestFramingDuplicateContentLength(t *testing.T) {
	a := newFakeEngine(t, "a")
	s := startProxy(t, testConfig(a.url()))
	smuggled := "GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
	cl := func(n int) string { return "Content-Length: " + itoa(n) + "\r\n" }
	cases := []struct {
		name, req string
		status    int
	}{
		{"CL big, CL 0", "POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + cl(len(smuggled)) + cl(0) + "\r\n" + smuggled, 400},
		{"CL, CL same", "POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + cl(len(complBody)) + cl(len(complBody)) + "\r\n" + complBody + smuggled, 400},
		{"TE identity, CL", "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: identity\r\n" + cl(len(complBody)) + "\r\n" + complBody + smuggled, 400},
		{"CL, TE identity", "POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + cl(len(complBody)) + "Transfer-Encoding: identity\r\n\r\n" + complBody + smuggled, 400},
		{"TE identity alone", "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: identity\r\n\r\n" + smuggled, 501},
	}
	for _, c := range cases {
		conn, err := net.Dial("tcp", s.PublicAddr())
		if err != nil {
			t.Fatal(err)
		}
		conn.SetDeadline(time.Now().Add(3 * time.Second))
		io.WriteString(conn, c.req)
		br := bufio.NewReader(conn)
		res, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Errorf("%s: no answer: %v", c.name, err)
			conn.Close()
			continue
		}
		b, _ := io.ReadAll(res.Body)
		if res.StatusCode != c.status {
			t.Errorf("%s: %d %s, want %d", c.name, res.StatusCode, b, c.status)
		} else {
			checkErrorBody(t, string(b), c.status)
		}
		// Whatever follows on the connection is never a request.
		if res2, err := http.ReadResponse(br, nil); err == nil {
			t.Errorf("%s: a second answer on the connection: %d", c.name, res2.StatusCode)
		}
		conn.Close()
	}
	if n := a.count("/smuggled"); n != 0 {
		t.Errorf("a smuggled request reached the engine %d times", n)
	}
}

// typicalRawHeader is a chat request's header as a client library sends it.
const typicalRawHeader = "POST /v1/chat/completions HTTP/1.1\r\nHost: kvgate:8000\r\nUser-Agent: OpenAI/Python 1.54.0\r\n" +
	"Accept: application/json\r\nContent-Type: application/json\r\nAuthorization: Bearer sk-xxxxxxxxxxxxxxxx\r\n" +
	"X-Stainless-Lang: python\r\nX-Stainless-Retry-Count: 0\r\nContent-Length: 28731\r\n\r\n"

// framingLines runs on every request: it reads the raw lines without allocating.
func TestFramingLinesZeroAlloc(t *testing.T) {
	raw := []byte(typicalRawHeader)
	var te, cl int
	if n := testing.AllocsPerRun(200, func() { te, cl, _ = framingLines(raw) }); n != 0 {
		t.Fatalf("%v allocations per request header", n)
	}
	if te != 0 || cl != 1 {
		t.Fatalf("te %d cl %d, want 0 and 1", te, cl)
	}
}

func BenchmarkFramingLines(b *testing.B) {
	raw := []byte(typicalRawHeader)
	b.ReportAllocs()
	for b.Loop() {
		framingLines(raw)
	}
}
