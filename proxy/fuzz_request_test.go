package proxy

import (
	"bytes"
	"encoding/json"
	"flag"
	"sync/atomic"
	"testing"

	"github.com/cloudwego/hertz/pkg/app"
	"github.com/cloudwego/hertz/pkg/common/test/mock"
	"github.com/cloudwego/hertz/pkg/protocol"
	"github.com/cloudwego/hertz/pkg/protocol/http1/req"

	"github.com/kvgate/kvgate/proxy/openai"
)

// FuzzHTTPRequest drives raw request bytes through hertz's HTTP/1 parser and kvgate's
// request path up to the upstream request: framing checks, the body limit, the JSON
// scanner and routing. Whatever the bytes, nothing panics, every refusal is a valid
// OpenAI error body, and the upstream request goes to the configured endpoint's host
// (a request cannot choose its target).
func FuzzHTTPRequest(f *testing.F) {
	f.Add([]byte("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 26\r\n\r\n{\"model\":\"m\",\"prompt\":\"x\"}"))
	f.Add([]byte("POST http://evil:1/v1/chat/completions HTTP/1.1\r\nHost: evil:2\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{\"a\":\r\n0\r\n\r\n"))
	f.Add([]byte("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"))
	f.Add([]byte("GET @evil:1/x HTTP/1.1\r\nHost: x\r\nConnection: X-Kvgate-Exchange, Host\r\n\r\n"))
	f.Add([]byte("CONNECT evil:443 HTTP/1.1\r\nHost: evil:443\r\n\r\n"))
	f.Add([]byte("POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n"))
	cfg := testConfig("http://127.0.0.1:9")
	cfg.Limits.MaxBodyBytes = 4096
	s, err := New(cfg, Options{Logger: quietLog})
	if err != nil {
		f.Fatal(err)
	}
	st := s.getState()
	f.Cleanup(func() {
		// Seed runs only: fuzzing workers are other processes.
		if fl := flag.Lookup("test.fuzz"); (fl == nil || fl.Value.String() == "") && parsed.Load() < 5 {
			f.Error("no input parsed as an HTTP request: the target tests nothing")
		}
	})
	f.Fuzz(func(t *testing.T, raw []byte) {
		c := app.NewContext(0)
		conn := mock.NewZeroCopyReader(string(raw)) // EOF at the end (mock.Conn would block)
		// As the server reads: the header, then the body as a stream.
		if err := req.ReadHeader(&c.Request.Header, conn); err != nil {
			return // hertz answers 400 itself
		}
		if err := req.ReadBodyStream(&c.Request, conn, hertzMaxBody, false, false); err != nil {
			return
		}
		if !uriParses(c) {
			return // the server's PanicHandler answers 400 (TestMalformedTarget)
		}
		parsed.Add(1)
		st.reset()
		if !s.readBody(c, st) {
			checkFuzzErrorBody(t, c)
			return
		}
		path := string(c.Request.URI().Path())
		if path == "/v1/completions" || path == "/v1/chat/completions" {
			if err := openai.Scan(st.body, &st.oa); err != nil {
				return
			}
			st.chat = path == "/v1/chat/completions"
			var d decision
			s.decide(st, &d, false)
			if d.ep != 0 {
				t.Fatalf("decision %d", d.ep)
			}
		}
		up := protocol.AcquireRequest()
		defer protocol.ReleaseRequest(up)
		s.buildUpstream(c, up, s.roster().eps[0], st.body, nil)
		if h := string(up.URI().Host()); h != s.roster().eps[0].spec.host {
			t.Fatalf("upstream URI host %q, want %q (request %q)", h, s.roster().eps[0].spec.host, raw)
		}
		if h := string(up.Header.Host()); h != s.roster().eps[0].spec.host {
			t.Fatalf("upstream Host %q (request %q)", h, raw)
		}
		if len(up.Header.Peek("Transfer-Encoding")) > 0 && up.Header.ContentLength() >= 0 && !bytes.Equal(up.Header.Peek("Transfer-Encoding"), []byte("chunked")) {
			t.Fatalf("upstream framing: TE %q CL %d", up.Header.Peek("Transfer-Encoding"), up.Header.ContentLength())
		}
	})
}

// hertzMaxBody is hertz's server default (kvgate's limit applies in readBody).
const hertzMaxBody = 4 << 20

var parsed atomic.Int64

func checkFuzzErrorBody(t *testing.T, c *app.RequestContext) {
	var e struct {
		Error struct {
			Message string `json:"message"`
			Code    int    `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(c.Response.Body(), &e); err != nil || e.Error.Code != c.Response.StatusCode() || e.Error.Message == "" {
		t.Fatalf("refusal %d is not an OpenAI error body: %q (%v)", c.Response.StatusCode(), c.Response.Body(), err)
	}
}

// uriParses reports whether hertz can parse c's request target without panicking.
func uriParses(c *app.RequestContext) (ok bool) {
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	c.Request.URI()
	return true
}
