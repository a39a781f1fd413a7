package proxy

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

const complBody = `{"model":"m","prompt":"hello there","max_tokens":4}`

func TestProxyNonStreamRRHeaders(t *testing.T) {
	a, b := newFakeEngine(t, "a"), newFakeEngine(t, "b")
	s := startProxy(t, testConfig(a.url(), b.url()))
	seen := map[string]int{}
	for i := 0; i < 4; i++ {
		res, body := post(t, s.url("/v1/completions"), complBody,
			"Connection", "keep-alive, X-Secret", "X-Secret", "1", "Proxy-Authorization", "x", "X-Keep", "yes")
		if res.StatusCode != 200 {
			t.Fatalf("status %d: %s", res.StatusCode, body)
		}
		ep := res.Header.Get("x-kvgate-endpoint")
		seen[ep]++
		if r := res.Header.Get("x-kvgate-route"); r != "rr" {
			t.Errorf("route %q", r)
		}
		if res.Header.Get("X-Request-Id") == "" {
			t.Error("no X-Request-Id on response")
		}
		want := map[string]string{"e0": "cmpl-a", "e1": "cmpl-b"}[ep]
		if !strings.Contains(body, want) {
			t.Errorf("endpoint %s but body %s", ep, body)
		}
	}
	if seen["e0"] != 2 || seen["e1"] != 2 {
		t.Errorf("rr spread %v", seen)
	}
	for _, r := range append(a.requests(), b.requests()...) {
		if r.body != complBody {
			t.Errorf("body changed: %q", r.body)
		}
		if r.header.Get("X-Secret") != "" || r.header.Get("Proxy-Authorization") != "" {
			t.Errorf("hop-by-hop header forwarded: %v", r.header)
		}
		if r.header.Get("X-Keep") != "yes" {
			t.Errorf("end-to-end header dropped: %v", r.header)
		}
		if r.header.Get("X-Forwarded-For") != "127.0.0.1" {
			t.Errorf("X-Forwarded-For = %q", r.header.Get("X-Forwarded-For"))
		}
		if len(r.header.Get("X-Request-Id")) != 32 {
			t.Errorf("X-Request-Id = %q", r.header.Get("X-Request-Id"))
		}
	}
	// A client's X-Request-Id is kept, and prior X-Forwarded-For extended.
	res, _ := post(t, s.url("/v1/completions"), complBody, "X-Request-Id", "req-42", "X-Forwarded-For", "10.0.0.1")
	if res.Header.Get("X-Request-Id") != "req-42" {
		t.Errorf("response id %q", res.Header.Get("X-Request-Id"))
	}
	all := append(a.requests(), b.requests()...)
	last := all[len(all)-1]
	for _, r := range all {
		if r.header.Get("X-Request-Id") == "req-42" {
			last = r
		}
	}
	if last.header.Get("X-Request-Id") != "req-42" || last.header.Get("X-Forwarded-For") != "10.0.0.1, 127.0.0.1" {
		t.Errorf("forwarded headers %v", last.header)
	}
}

func TestPassThroughAndModels(t *testing.T) {
	a := newFakeEngine(t, "a")
	s := startProxy(t, testConfig(a.url()))
	res, err := httpc.Get(s.url("/v1/models"))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 200 || !strings.Contains(string(b), `"owned_by":"a"`) {
		t.Fatalf("models: %d %s", res.StatusCode, b)
	}
	res, err = httpc.Get(s.url("/some/other?x=1"))
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 404 || res.Header.Get("X-Path") != "/some/other" || string(b) != "no such path /some/other" {
		t.Errorf("pass-through: %d %v %q", res.StatusCode, res.Header, b)
	}
}

// SSE is relayed event by event: the engine sends its second event only after the
// client received the first through kvgate, so any buffering would hang the test.
func TestSSERelayUnbuffered(t *testing.T) {
	a := newFakeEngine(t, "a")
	got1 := make(chan struct{})
	a.handle = func(w http.ResponseWriter, r *http.Request, body []byte) bool {
		w.Header().Set("Content-Type", "text/event-stream")
		evs := sseEvents("a")
		io.WriteString(w, evs[0])
		w.(http.Flusher).Flush()
		select {
		case <-got1:
		case <-time.After(10 * time.Second):
			return true
		}
		for _, ev := range evs[1:] {
			io.WriteString(w, ev)
			w.(http.Flusher).Flush()
		}
		return true
	}
	s := startProxy(t, testConfig(a.url()))
	req, _ := http.NewRequest("POST", s.url("/v1/completions"), strings.NewReader(`{"model":"m","prompt":"x","stream":true}`))
	res, err := httpc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if ct := res.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Errorf("content-type %q", ct)
	}
	br := bufio.NewReader(res.Body)
	first := readSSE(t, br)
	if first != sseEvents("a")[0] {
		t.Fatalf("first event %q", first)
	}
	close(got1)
	rest, _ := io.ReadAll(br)
	if want := strings.Join(sseEvents("a")[1:], ""); string(rest) != want {
		t.Errorf("rest %q want %q", rest, want)
	}
	// The final usage chunk is a delivery receipt.
	waitFor(t, "receipt", func() bool { return s.m.delivered[0].Get() == 16 && s.m.receipts[0].Get() == 1 })
}

// A streaming request through kvgate gives the same bytes as the engine directly.
func TestStreamSameBytesAsDirect(t *testing.T) {
	a := newFakeEngine(t, "a")
	s := startProxy(t, testConfig(a.url()))
	body := `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}`
	_, direct := post(t, a.url()+"/v1/chat/completions", body)
	res, via := post(t, s.url("/v1/chat/completions"), body)
	if res.StatusCode != 200 || via != direct || direct == "" {
		t.Errorf("via kvgate %q\ndirect %q", via, direct)
	}
}

func TestMalformedJSON400(t *testing.T) {
	a := newFakeEngine(t, "a")
	s := startProxy(t, testConfig(a.url()))
	for _, b := range []string{`{"model":`, `not json`, `{"model":"m"}}`, `[1,2]`, `{"messages":{}}`, "{\"prompt\":\"\xff\"}", strings.Repeat("[", 1000)} {
		res, body := post(t, s.url("/v1/chat/completions"), b)
		if res.StatusCode != 400 {
			t.Errorf("%q: status %d", b, res.StatusCode)
		}
		checkErrorBody(t, body, 400)
	}
	if n := len(a.requests()); n != 0 {
		t.Errorf("engine touched %d times by bad input", n)
	}
}

func TestBodyLimit413(t *testing.T) {
	a := newFakeEngine(t, "a")
	cfg := testConfig(a.url())
	cfg.Limits.MaxBodyBytes = 4096
	s := startProxy(t, cfg)
	big := `{"model":"m","prompt":"` + strings.Repeat("x", 5000) + `"}`
	res, body := post(t, s.url("/v1/completions"), big)
	if res.StatusCode != 413 {
		t.Errorf("status %d", res.StatusCode)
	}
	checkErrorBody(t, body, 413)
	// Chunked (no Content-Length) too.
	req, _ := http.NewRequest("POST", s.url("/v1/completions"), io.MultiReader(strings.NewReader(big)))
	req.ContentLength = -1
	res2, err := httpc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res2.Body.Close()
	if res2.StatusCode != 413 {
		t.Errorf("chunked status %d", res2.StatusCode)
	}
	if len(a.requests()) != 0 {
		t.Error("engine touched")
	}
}

// A connect failure excludes the endpoint and the next one serves; the breaker opens
// after -breaker-failures and later recovers through a half-open trial.
func TestRetryAndBreaker(t *testing.T) {
	b := newFakeEngine(t, "b")
	dead := deadAddr(t)
	cfg := testConfig("http://"+dead, b.url())
	cfg.Breaker.Failures = 2
	cfg.Breaker.OpenFor = 200 * time.Millisecond
	s := startProxy(t, cfg)
	for i := 0; i < 6; i++ {
		res, body := post(t, s.url("/v1/completions"), complBody)
		if res.StatusCode != 200 || res.Header.Get("x-kvgate-endpoint") != "e1" {
			t.Fatalf("request %d: %d %s %s", i, res.StatusCode, res.Header.Get("x-kvgate-endpoint"), body)
		}
	}
	if st := s.roster().eps[0].breaker.State(); st != BreakerOpen {
		t.Errorf("breaker %v, want open", st)
	}
	if n := s.m.upstream[ErrConnect][0].Get(); n != 2 {
		t.Errorf("connect failures counted %d, want 2 (then the breaker keeps it out)", n)
	}
	// Bring the dead endpoint back on the same port; after the open period a trial
	// succeeds and the breaker closes.
	ln, err := net.Listen("tcp", dead)
	if err != nil {
		t.Fatalf("port reuse: %v", err)
	}
	back := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"id":"back"}`)
	})}
	go back.Serve(ln)
	defer back.Close()
	waitFor(t, "breaker recovery", func() bool {
		post(t, s.url("/v1/completions"), complBody)
		return s.roster().eps[0].breaker.State() == BreakerClosed
	})
}

func TestAllDead502(t *testing.T) {
	cfg := testConfig("http://"+deadAddr(t), "http://"+deadAddr(t))
	s := startProxy(t, cfg)
	res, body := post(t, s.url("/v1/completions"), complBody)
	if res.StatusCode != 502 {
		t.Errorf("status %d", res.StatusCode)
	}
	checkErrorBody(t, body, 502)
}

func TestHealthCheckExcludes(t *testing.T) {
	a, b := newFakeEngine(t, "a"), newFakeEngine(t, "b")
	a.health.Store(503)
	cfg := testConfig(a.url(), b.url())
	cfg.Health.Interval = 50 * time.Millisecond
	cfg.Health.Timeout = time.Second
	s := startProxy(t, cfg)
	waitFor(t, "health check", func() bool { return s.roster().eps[0].checked.Load() && !s.roster().eps[0].healthy.Load() })
	for i := 0; i < 4; i++ {
		res, _ := post(t, s.url("/v1/completions"), complBody)
		if res.Header.Get("x-kvgate-endpoint") != "e1" {
			t.Errorf("went to %s", res.Header.Get("x-kvgate-endpoint"))
		}
	}
	if a.count("/v1/completions") != 0 {
		t.Error("unhealthy endpoint got a request")
	}
	if code := getStatus(t, s.admURL("/readyz")); code != 200 {
		t.Errorf("readyz %d with one healthy endpoint", code)
	}
	b.health.Store(500)
	waitFor(t, "both unhealthy", func() bool { return !s.roster().eps[1].healthy.Load() })
	res, body := post(t, s.url("/v1/completions"), complBody)
	if res.StatusCode != 503 {
		t.Errorf("no healthy endpoint: status %d", res.StatusCode)
	}
	checkErrorBody(t, body, 503)
	res, _ = httpc.Get(s.admURL("/readyz"))
	res.Body.Close()
	if res.StatusCode != 503 {
		t.Errorf("readyz %d with no healthy endpoint", res.StatusCode)
	}
}

func TestAdminDownUp(t *testing.T) {
	a, b := newFakeEngine(t, "a"), newFakeEngine(t, "b")
	cfg := testConfig(a.url(), b.url())
	cfg.Fleet.Endpoints[1].Down = true // starts drained
	s := startProxy(t, cfg)
	for i := 0; i < 3; i++ {
		post(t, s.url("/v1/completions"), complBody)
	}
	if b.count("/v1/completions") != 0 {
		t.Fatal("drained endpoint got requests")
	}
	res, _ := post(t, s.admURL("/admin/endpoints/e1/up"), "")
	if res.StatusCode != 200 {
		t.Fatalf("up: %d", res.StatusCode)
	}
	res, _ = post(t, s.admURL("/admin/endpoints/e0/down"), "")
	if res.StatusCode != 200 {
		t.Fatalf("down: %d", res.StatusCode)
	}
	for i := 0; i < 3; i++ {
		post(t, s.url("/v1/completions"), complBody)
	}
	if b.count("/v1/completions") != 3 || a.count("/v1/completions") != 3 {
		t.Errorf("a=%d b=%d", a.count("/v1/completions"), b.count("/v1/completions"))
	}
	if res, _ := post(t, s.admURL("/admin/endpoints/nope/down"), ""); res.StatusCode != 404 {
		t.Errorf("unknown endpoint: %d", res.StatusCode)
	}
	// /debug/inventory reports the state.
	r, err := httpc.Get(s.admURL("/debug/inventory"))
	if err != nil {
		t.Fatal(err)
	}
	var inv struct {
		Endpoints []struct {
			Name, URL, Parity, Breaker string
			Down                       bool
			Keys                       int
			Connected                  bool
			LastSeq                    int64 `json:"last_seq"`
		}
	}
	json.NewDecoder(r.Body).Decode(&inv)
	r.Body.Close()
	if len(inv.Endpoints) != 2 || !inv.Endpoints[0].Down || inv.Endpoints[1].Down || inv.Endpoints[0].Breaker != "closed" || inv.Endpoints[0].Parity != "unknown" || inv.Endpoints[0].URL != a.url() {
		t.Errorf("inventory %+v", inv)
	}
}

func TestUpstreamTimeout504(t *testing.T) {
	a := newFakeEngine(t, "a")
	release := make(chan struct{})
	defer close(release)
	a.handle = func(w http.ResponseWriter, r *http.Request, body []byte) bool {
		select {
		case <-release:
		case <-r.Context().Done():
		}
		return true
	}
	cfg := testConfig(a.url())
	cfg.Upstream.Timeout = 300 * time.Millisecond
	s := startProxy(t, cfg)
	res, body := post(t, s.url("/v1/completions"), complBody)
	if res.StatusCode != 504 {
		t.Errorf("status %d %s", res.StatusCode, body)
	}
	checkErrorBody(t, body, 504)
}

// A client leaving mid-stream cancels the engine's request (its connection closes).
func TestClientDisconnectCancelsUpstream(t *testing.T) {
	a := newFakeEngine(t, "a")
	cancelled := make(chan struct{})
	a.handle = func(w http.ResponseWriter, r *http.Request, body []byte) bool {
		w.Header().Set("Content-Type", "text/event-stream")
		for {
			if _, err := io.WriteString(w, "data: {\"x\":1}\n\n"); err != nil {
				close(cancelled)
				return true
			}
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				close(cancelled)
				return true
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	s := startProxy(t, testConfig(a.url()))
	conn, err := net.Dial("tcp", s.PublicAddr())
	if err != nil {
		t.Fatal(err)
	}
	body := `{"model":"m","prompt":"x","stream":true}`
	io.WriteString(conn, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "+itoa(len(body))+"\r\n\r\n"+body)
	br := bufio.NewReader(conn)
	line, _ := br.ReadString('\n')
	if !strings.Contains(line, "200") {
		t.Fatalf("status line %q", line)
	}
	waitFor(t, "in flight", func() bool { return s.loads.Get(0) == 1 })
	conn.Close()
	select {
	case <-cancelled:
	case <-time.After(15 * time.Second):
		t.Fatal("engine request not cancelled after the client left")
	}
	waitFor(t, "in-flight released", func() bool { return s.loads.Get(0) == 0 })
}

func TestCHWBLAffinity(t *testing.T) {
	engines := []*fakeEngine{newFakeEngine(t, "a"), newFakeEngine(t, "b"), newFakeEngine(t, "c")}
	cfg := testConfig(engines[0].url(), engines[1].url(), engines[2].url())
	cfg.Select.Kind = SelectCHWBL
	s := startProxy(t, cfg)
	for _, sys := range []string{"You are a pirate.", "You are a lawyer.", "You are a poet.", "You are a chef."} {
		var first string
		for i := 0; i < 3; i++ {
			body := `{"model":"m","messages":[{"role":"system","content":"` + sys + `"},{"role":"user","content":"q` + itoa(i) + `"}]}`
			res, _ := post(t, s.url("/v1/chat/completions"), body)
			ep := res.Header.Get("x-kvgate-endpoint")
			if res.Header.Get("x-kvgate-route") != "chwbl" {
				t.Errorf("route %q", res.Header.Get("x-kvgate-route"))
			}
			if first == "" {
				first = ep
			} else if ep != first {
				t.Errorf("system %q moved %s -> %s", sys, first, ep)
			}
		}
	}
}

func TestExplainNoUpstream(t *testing.T) {
	a := newFakeEngine(t, "a")
	s := startProxy(t, testConfig(a.url()))
	res, body := post(t, s.admURL("/debug/explain"), complBody)
	var ex Explanation
	if err := json.Unmarshal([]byte(body), &ex); err != nil || res.StatusCode != 200 {
		t.Fatalf("%d %s", res.StatusCode, body)
	}
	if ex.Endpoint != "e0" || ex.Route != "rr" || !ex.Eligible["e0"] {
		t.Errorf("%+v", ex)
	}
	if len(a.requests()) != 0 {
		t.Error("explain sent a request upstream")
	}
	res, body = post(t, s.admURL("/debug/explain"), `{bad`)
	if res.StatusCode != 400 {
		t.Errorf("bad explain: %d", res.StatusCode)
	}
	checkErrorBody(t, body, 400)
}

func TestMetricsEndpoint(t *testing.T) {
	a := newFakeEngine(t, "a")
	s := startProxy(t, testConfig(a.url()))
	post(t, s.url("/v1/completions"), complBody)
	post(t, s.url("/v1/completions"), `{`)
	res, err := httpc.Get(s.admURL("/metrics"))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	for _, want := range []string{
		`kvgate_requests_total{endpoint="e0",route="rr"} 1`,
		`kvgate_bad_requests_total{reason="malformed_json"} 1`,
		`kvgate_delivered_cached_tokens_total{endpoint="e0"} 32`,
		`kvgate_inflight_requests{endpoint="e0"} 0`,
		"kvgate_route_seconds_count 1", // the bad body never reached a decision
	} {
		if !strings.Contains(string(b), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	if code := getStatus(t, s.admURL("/debug/pprof/")); code != 200 {
		t.Errorf("pprof %d", code)
	}
	// pprof is never on the public listener: that path passes through to the engine.
	if code := getStatus(t, s.url("/debug/pprof/")); code != 404 {
		t.Errorf("public pprof %d", code)
	}
}

// Shutdown lets an in-flight stream finish.
func TestShutdownDrains(t *testing.T) {
	a := newFakeEngine(t, "a")
	release := make(chan struct{})
	a.handle = func(w http.ResponseWriter, r *http.Request, body []byte) bool {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: 1\n\n")
		w.(http.Flusher).Flush()
		<-release
		io.WriteString(w, "data: [DONE]\n\n")
		return true
	}
	s, err := New(testConfig(a.url()), Options{Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.StartWith(context.Background(), listenLocal(t), listenLocal(t)); err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest("POST", s.url("/v1/completions"), strings.NewReader(`{"model":"m","prompt":"x","stream":true}`))
	res, err := httpc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(res.Body)
	readSSE(t, br)
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		done <- s.Shutdown(ctx)
	}()
	time.Sleep(100 * time.Millisecond)
	close(release)
	rest, _ := io.ReadAll(br)
	res.Body.Close()
	if string(rest) != "data: [DONE]\n\n" {
		t.Errorf("stream cut by shutdown: %q", rest)
	}
	if err := <-done; err != nil {
		t.Errorf("shutdown: %v", err)
	}
}

// Response headers reach the client before the first event (a long prefill must not
// look like a hung connection).
func TestSSEHeadersBeforeFirstEvent(t *testing.T) {
	a := newFakeEngine(t, "a")
	release := make(chan struct{})
	a.handle = func(w http.ResponseWriter, r *http.Request, body []byte) bool {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-time.After(10 * time.Second):
		}
		io.WriteString(w, "data: [DONE]\n\n")
		return true
	}
	s := startProxy(t, testConfig(a.url()))
	req, _ := http.NewRequest("POST", s.url("/v1/completions"), strings.NewReader(`{"model":"m","prompt":"x","stream":true}`))
	res, err := httpc.Do(req) // returns once headers arrive
	close(release)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.Header.Get("x-kvgate-endpoint") != "e0" || string(b) != "data: [DONE]\n\n" {
		t.Errorf("%v %q", res.Header, b)
	}
}

// A client leaving while a non-streamed generation runs (no response headers yet)
// cancels the engine's request too.
func TestClientDisconnectCancelsNonStream(t *testing.T) {
	a := newFakeEngine(t, "a")
	cancelled := make(chan struct{})
	a.handle = func(w http.ResponseWriter, r *http.Request, body []byte) bool {
		select {
		case <-r.Context().Done():
			close(cancelled)
		case <-time.After(20 * time.Second):
		}
		return true
	}
	cfg := testConfig(a.url())
	cfg.Upstream.Timeout = time.Minute // the cancel is the client's leaving, not the timeout
	s := startProxy(t, cfg)
	conn, err := net.Dial("tcp", s.PublicAddr())
	if err != nil {
		t.Fatal(err)
	}
	body := `{"model":"m","prompt":"x"}`
	io.WriteString(conn, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: "+itoa(len(body))+"\r\n\r\n"+body)
	waitFor(t, "in flight", func() bool { return s.loads.Get(0) == 1 })
	conn.Close()
	// The client may leave before kvgate's request reached the engine: then it is never
	// sent. Either way nothing may keep the engine working.
	waitFor(t, "in-flight released", func() bool { return s.loads.Get(0) == 0 })
	time.Sleep(50 * time.Millisecond) // a request already on the wire arrives
	if a.count("/v1/completions") > 0 {
		select {
		case <-cancelled:
		case <-time.After(5 * time.Second):
			t.Fatal("engine request not cancelled after the client left")
		}
	}
	if n := s.conns.m.Size(); n != 0 {
		t.Errorf("%d connections left registered", n)
	}
}

func TestAdminTokenAndHeaderLimit(t *testing.T) {
	a := newFakeEngine(t, "a")
	cfg := testConfig(a.url())
	cfg.Listener.AdminToken = "s3cret"
	cfg.Limits.MaxHeaderBytes = 2048
	s := startProxy(t, cfg)
	if code := getStatus(t, s.admURL("/debug/inventory")); code != 401 {
		t.Errorf("no token: %d", code)
	}
	req, _ := http.NewRequest("GET", s.admURL("/debug/inventory"), nil)
	req.Header.Set("Authorization", "Bearer s3cret")
	res, err := httpc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 200 {
		t.Errorf("with token: %d", res.StatusCode)
	}
	if code := getStatus(t, s.admURL("/healthz")); code != 200 {
		t.Errorf("healthz needs no token: %d", code)
	}
	res, _ = post(t, s.url("/v1/completions"), complBody, "X-Big", strings.Repeat("x", 4096))
	if res.StatusCode < 400 || res.StatusCode >= 500 {
		t.Errorf("oversized header: %d", res.StatusCode)
	}
	if a.count("/v1/completions") != 0 {
		t.Error("oversized header reached the engine")
	}
}

// Bodies above hertz's own 4 MiB default but under -max-body-bytes pass whole.
func TestLargeBodyUnderLimit(t *testing.T) {
	a := newFakeEngine(t, "a")
	cfg := testConfig(a.url())
	cfg.Limits.MaxBodyBytes = 8 << 20
	s := startProxy(t, cfg)
	big := `{"model":"m","prompt":"` + strings.Repeat("y", 6<<20) + `"}`
	res, body := post(t, s.url("/v1/completions"), big)
	if res.StatusCode != 200 {
		t.Fatalf("status %d %.200s", res.StatusCode, body)
	}
	if r := a.requests(); len(r) != 1 || r[0].body != big {
		t.Errorf("engine got %d requests / altered body", len(r))
	}
}

// Many concurrent streams all complete intact, and nothing is left running after.
func TestConcurrentStreamsNoLeak(t *testing.T) {
	a, b := newFakeEngine(t, "a"), newFakeEngine(t, "b")
	s := startProxy(t, testConfig(a.url(), b.url()))
	before := runtime.NumGoroutine()
	var wg sync.WaitGroup
	errs := make(chan string, 100)
	for i := 0; i < 100; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := httpc.Post(s.url("/v1/completions"), "application/json", strings.NewReader(`{"model":"m","prompt":"x","stream":true}`))
			if err != nil {
				errs <- err.Error()
				return
			}
			body, _ := io.ReadAll(res.Body)
			res.Body.Close()
			ep := map[string]string{"e0": "a", "e1": "b"}[res.Header.Get("x-kvgate-endpoint")]
			if string(body) != strings.Join(sseEvents(ep), "") {
				errs <- fmt.Sprintf("stream from %q: %q", ep, body)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	// Idle keep-alive connections (client -> kvgate -> engines) are pooling, not leaks.
	httpc.CloseIdleConnections()
	s.client.CloseIdleConnections()
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > before+10 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before+10 {
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		t.Fatalf("goroutines %d -> %d\n%s", before, n, buf)
	}
}

// Header names are case-insensitive: a lower-case x-request-id is kept, a lower-case
// x-forwarded-for extended, and hop-by-hop headers dropped whatever their case.
func TestHeaderCaseInsensitive(t *testing.T) {
	a := newFakeEngine(t, "a")
	s := startProxy(t, testConfig(a.url()))
	conn, err := net.Dial("tcp", s.PublicAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	io.WriteString(conn, "POST /v1/completions HTTP/1.1\r\nhost: x\r\nx-request-id: low-1\r\nx-forwarded-for: 10.1.1.1\r\nproxy-authorization: z\r\ncontent-length: "+itoa(len(complBody))+"\r\n\r\n"+complBody)
	res, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.Header.Get("X-Request-Id") != "low-1" || len(res.Header.Values("X-Request-Id")) != 1 {
		t.Errorf("response ids %v", res.Header.Values("X-Request-Id"))
	}
	r := a.requests()[0]
	if ids := r.header.Values("X-Request-Id"); len(ids) != 1 || ids[0] != "low-1" {
		t.Errorf("engine ids %v", ids)
	}
	if xff := r.header.Values("X-Forwarded-For"); len(xff) != 1 || xff[0] != "10.1.1.1, 127.0.0.1" {
		t.Errorf("engine xff %v", xff)
	}
	if r.header.Get("Proxy-Authorization") != "" {
		t.Error("hop-by-hop header forwarded")
	}
}

func TestExpectContinue(t *testing.T) {
	a := newFakeEngine(t, "a")
	s := startProxy(t, testConfig(a.url()))
	req, _ := http.NewRequest("POST", s.url("/v1/completions"), strings.NewReader(complBody))
	req.Header.Set("Expect", "100-continue")
	res, err := httpc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 200 || !strings.Contains(string(b), "cmpl-a") {
		t.Errorf("%d %s", res.StatusCode, b)
	}
	if r := a.requests(); len(r) != 1 || r[0].header.Get("Expect") != "" || r[0].body != complBody {
		t.Errorf("engine saw %+v", r)
	}
}
