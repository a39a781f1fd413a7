package proxy

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cloudwego/hertz/pkg/common/hlog"
)

func TestMain(m *testing.M) {
	hlog.SetOutput(io.Discard)
	hlog.SetSilentMode(true)
	os.Exit(m.Run())
}

var quietLog = slog.New(slog.NewTextHandler(io.Discard, nil))

type recorded struct {
	path   string
	body   string
	header http.Header
}

// fakeEngine is a real HTTP server on 127.0.0.1 speaking enough of the OpenAI API
// (and /health) to be proxied to. handle overrides the default answers.
type fakeEngine struct {
	name   string
	srv    *httptest.Server
	mu     sync.Mutex
	reqs   []recorded
	health atomic.Int32
	handle func(w http.ResponseWriter, r *http.Request, body []byte) bool
}

func newFakeEngine(t *testing.T, name string) *fakeEngine {
	e := &fakeEngine{name: name}
	e.health.Store(200)
	e.srv = httptest.NewServer(http.HandlerFunc(e.serve))
	t.Cleanup(e.srv.Close)
	return e
}

func (e *fakeEngine) url() string { return e.srv.URL }

func (e *fakeEngine) requests() []recorded {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]recorded(nil), e.reqs...)
}

func (e *fakeEngine) count(path string) int {
	n := 0
	for _, r := range e.requests() {
		if r.path == path {
			n++
		}
	}
	return n
}

func (e *fakeEngine) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/health" {
		w.WriteHeader(int(e.health.Load()))
		return
	}
	body, _ := io.ReadAll(r.Body)
	e.mu.Lock()
	e.reqs = append(e.reqs, recorded{path: r.URL.Path, body: string(body), header: r.Header.Clone()})
	e.mu.Unlock()
	if e.handle != nil && e.handle(w, r, body) {
		return
	}
	switch r.URL.Path {
	case "/v1/models":
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"object":"list","data":[{"id":"m","object":"model","owned_by":%q}]}`, e.name)
	case "/v1/completions", "/v1/chat/completions":
		var req struct {
			Stream bool `json:"stream"`
		}
		json.Unmarshal(body, &req)
		if req.Stream {
			w.Header().Set("Content-Type", "text/event-stream")
			fl := w.(http.Flusher)
			for _, ev := range sseEvents(e.name) {
				io.WriteString(w, ev)
				fl.Flush()
			}
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"cmpl-%s","object":"text_completion","choices":[{"index":0,"text":"hi","finish_reason":"length"}],"usage":{"prompt_tokens":40,"completion_tokens":1,"total_tokens":41,"prompt_tokens_details":{"cached_tokens":32}}}`, e.name)
	default:
		w.Header().Set("X-Path", r.URL.Path)
		w.WriteHeader(404)
		io.WriteString(w, "no such path "+r.URL.Path)
	}
}

func sseEvents(name string) []string {
	return []string{
		`data: {"id":"c-` + name + `","choices":[{"index":0,"text":"a"}]}` + "\n\n",
		`data: {"id":"c-` + name + `","choices":[{"index":0,"text":"b"}]}` + "\n\n",
		`data: {"id":"c-` + name + `","choices":[],"usage":{"prompt_tokens":48,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":16}}}` + "\n\n",
		"data: [DONE]\n\n",
	}
}

func listenLocal(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// deadAddr is a 127.0.0.1 port nothing listens on (bound, then closed).
func deadAddr(t *testing.T) string {
	ln := listenLocal(t)
	a := ln.Addr().String()
	ln.Close()
	return a
}

func testConfig(urls ...string) Config {
	cfg := Defaults()
	cfg.Health.Interval = 0
	cfg.Shutdown.Grace = 5 * time.Second
	cfg.Upstream.Timeout = 10 * time.Second
	cfg.Upstream.ConnectTimeout = time.Second
	for i, u := range urls {
		sp, err := ParseEndpoint(fmt.Sprintf("name=e%d,url=%s", i, u))
		if err != nil {
			panic(err)
		}
		cfg.Fleet.Endpoints = append(cfg.Fleet.Endpoints, sp)
	}
	return cfg
}

func startProxy(t *testing.T, cfg Config) *Server {
	t.Helper()
	return startWith(t, cfg, Options{})
}

// startWith starts a proxy with explicit options.
func startWith(t *testing.T, cfg Config, opt Options) *Server {
	t.Helper()
	if opt.Logger == nil {
		opt.Logger = quietLog
	}
	if cfg.KV.Mode != KVOff && opt.Tokenizers == nil {
		opt.Tokenizers = sharedPool(t)
	}
	s, err := New(cfg, opt)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.StartWith(context.Background(), listenLocal(t), listenLocal(t)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		s.Shutdown(ctx)
	})
	return s
}

var httpc = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableCompression: true}}

func post(t *testing.T, url, body string, hdr ...string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := httpc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	return res, string(b)
}

func (s *Server) url(path string) string    { return "http://" + s.PublicAddr() + path }
func (s *Server) admURL(path string) string { return "http://" + s.AdminAddr() + path }

// checkErrorBody asserts an OpenAI-style error body.
func checkErrorBody(t *testing.T, body string, code int) {
	t.Helper()
	var e struct {
		Error struct {
			Message string `json:"message"`
			Type    string `json:"type"`
			Code    int    `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error.Message == "" || e.Error.Code != code {
		t.Errorf("not an OpenAI error body with code %d: %q (%v)", code, body, err)
	}
}

func readSSE(t *testing.T, r *bufio.Reader) string {
	t.Helper()
	var b strings.Builder
	for {
		line, err := r.ReadString('\n')
		b.WriteString(line)
		if line == "\n" || err != nil {
			return b.String()
		}
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// getStatus GETs url and returns the status code, the body discarded.
func getStatus(t *testing.T, url string) int {
	t.Helper()
	res, err := httpc.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	return res.StatusCode
}

// rawEngine serves every connection accepted on 127.0.0.1 with handle, each in its own
// goroutine, until the test ends: an engine that speaks HTTP/1.1 byte by byte, for
// answers net/http would not send. It returns the engine's base URL.
func rawEngine(t *testing.T, handle func(net.Conn)) string {
	ln := listenLocal(t)
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go handle(conn)
		}
	}()
	return "http://" + ln.Addr().String()
}

// truncatingEngine reads one request and answers 200 with a body that stops 94 bytes
// short of its Content-Length, then closes.
func truncatingEngine(conn net.Conn) {
	defer conn.Close()
	req, err := http.ReadRequest(bufio.NewReader(conn))
	if err != nil {
		return
	}
	io.Copy(io.Discard, req.Body)
	io.WriteString(conn, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"id\":")
}
