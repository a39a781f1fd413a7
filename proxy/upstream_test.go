package proxy

import (
	"encoding/hex"
	"net"
	"strings"
	"testing"

	"github.com/cloudwego/hertz/pkg/app"
	"github.com/cloudwego/hertz/pkg/common/test/mock"
	"github.com/cloudwego/hertz/pkg/protocol"
)

// addrConn is a hertz mock connection with a chosen remote address.
type addrConn struct {
	*mock.Conn
	remote net.Addr
}

func (c addrConn) RemoteAddr() net.Addr { return c.remote }

type pipeAddr string

func (a pipeAddr) Network() string { return "pipe" }
func (a pipeAddr) String() string  { return string(a) }

// The client address in X-Forwarded-For is what net.IP.String writes (the standard
// library is the oracle): dotted IPv4 also for an IPv4-mapped IPv6 address, no zone,
// compressed IPv6; a non-TCP address's host part; a prior value is extended.
func TestBuildUpstreamClientAddress(t *testing.T) {
	s, err := New(testConfig("http://127.0.0.1:1"), Options{Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	tcp := func(ip string, zone string) net.Addr {
		return &net.TCPAddr{IP: net.ParseIP(ip), Port: 4242, Zone: zone}
	}
	cases := []struct {
		remote net.Addr
		want   string
	}{
		{tcp("10.1.2.3", ""), net.ParseIP("10.1.2.3").String()},
		{&net.TCPAddr{IP: net.IPv4(192, 168, 0, 7).To4(), Port: 1}, "192.168.0.7"},
		{tcp("::ffff:10.9.8.7", ""), net.ParseIP("::ffff:10.9.8.7").String()},
		{tcp("2001:db8:0:0:1:0:0:1", ""), net.ParseIP("2001:db8::1:0:0:1").String()},
		{tcp("fe80::1", "eth0"), net.ParseIP("fe80::1").String()},
		{tcp("::1", ""), "::1"},
		{pipeAddr("10.0.0.9:77"), "10.0.0.9"},
		{pipeAddr("no-port"), ""},
		{&net.TCPAddr{IP: net.IP{1, 2, 3}}, ""}, // a malformed IP: no address
	}
	for _, tc := range cases {
		for _, prior := range []string{"", "198.51.100.1"} {
			c := app.NewContext(0)
			c.SetConn(addrConn{mock.NewConn(""), tc.remote})
			c.Request.Header.SetMethod("POST")
			c.Request.SetRequestURI("/v1/completions")
			if prior != "" {
				c.Request.Header.Set("X-Forwarded-For", prior)
			}
			up := protocol.AcquireRequest()
			s.buildUpstream(c, up, s.roster().eps[0], []byte(complBody), nil)
			want := tc.want
			if prior != "" && want != "" {
				want = prior + ", " + want
			} else if prior != "" {
				want = prior
			}
			if got := string(up.Header.Peek("X-Forwarded-For")); got != want {
				t.Errorf("remote %v, prior %q: X-Forwarded-For %q, want %q", tc.remote, prior, got, want)
			}
			if got := string(up.Header.RequestURI()); got != "/v1/completions" && !strings.HasSuffix(got, "/v1/completions") {
				t.Errorf("request URI %q", got)
			}
			id := up.Header.Peek(hdrRequestID)
			if _, err := hex.DecodeString(string(id)); len(id) != 32 || err != nil {
				t.Errorf("X-Request-Id %q", id)
			}
			if string(c.Request.Header.Peek(hdrRequestID)) != string(id) {
				t.Errorf("the client request keeps id %q, upstream got %q", c.Request.Header.Peek(hdrRequestID), id)
			}
			protocol.ReleaseRequest(up)
		}
	}
}

// Building an upstream request allocates nothing once the pooled request's buffers have
// grown: it runs on every request.
func TestBuildUpstreamZeroAlloc(t *testing.T) {
	s, err := New(testConfig("http://127.0.0.1:1"), Options{Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	c := app.NewContext(0)
	c.SetConn(addrConn{mock.NewConn(""), &net.TCPAddr{IP: net.ParseIP("10.1.2.3"), Port: 1}})
	c.Request.Header.SetMethod("POST")
	c.Request.SetRequestURI("/v1/chat/completions")
	c.Request.Header.Set("X-Forwarded-For", "198.51.100.1")
	c.Request.Header.Set("Content-Type", "application/json")
	body := []byte(complBody)
	up := protocol.AcquireRequest()
	defer protocol.ReleaseRequest(up)
	build := func() {
		up.Reset()
		c.Request.Header.Del(hdrRequestID) // a fresh id every time
		s.buildUpstream(c, up, s.roster().eps[0], body, nil)
	}
	build()
	if n := testing.AllocsPerRun(100, build); n != 0 {
		t.Errorf("buildUpstream: %v allocs per request, want 0", n)
	}
}

// Through the proxy: every request without an X-Request-Id gets its own (32 hex digits),
// the same one upstream and on the response.
func TestRequestIDsDistinct(t *testing.T) {
	a := newFakeEngine(t, "a")
	s := startProxy(t, testConfig(a.url()))
	const n = 200
	seen := map[string]bool{}
	for i := 0; i < n; i++ {
		res, body := post(t, s.url("/v1/completions"), complBody)
		if res.StatusCode != 200 {
			t.Fatalf("status %d: %s", res.StatusCode, body)
		}
		id := res.Header.Get("X-Request-Id")
		if _, err := hex.DecodeString(id); len(id) != 32 || err != nil || seen[id] {
			t.Fatalf("request %d: id %q (seen before: %v)", i, id, seen[id])
		}
		seen[id] = true
	}
	reqs := a.requests()
	if len(reqs) != n {
		t.Fatalf("%d upstream requests, want %d", len(reqs), n)
	}
	for _, r := range reqs {
		if !seen[r.header.Get("X-Request-Id")] {
			t.Fatalf("upstream id %q is no response's", r.header.Get("X-Request-Id"))
		}
	}
}
