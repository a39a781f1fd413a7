package proxy

import (
	"context"
	"strconv"

	"github.com/cloudwego/hertz/pkg/app"
	"github.com/cloudwego/hertz/pkg/network"
	"github.com/cloudwego/hertz/pkg/protocol/consts"
)

// hertz answers some bad requests itself, before any handler or middleware runs: a
// request head over -max-header-bytes (431), one it cannot parse, such as a malformed
// Content-Length (400), a request not received within the read timeout (408). Its error
// handler is hard-coded (hertz v0.10.4) and writes plain text, where every kvgate error
// is an OpenAI-style JSON body.
//
// What hertz does offer: it runs each tracer's Start before it reads a request, and
// writes a response it built itself to the request context's connection. So headErrors,
// a tracer, wraps that connection once (headConn) and arms it before each request; the
// first middleware disarms it, so a request that reaches kvgate is written through
// untouched. A response of status >= 400 written while armed can only be hertz's own:
// headConn writes an OpenAI-style error of the same status in its place.
type headErrors struct{ s *Server }

// Start arms the connection of the request hertz is about to read, wrapping it first
// if this is the connection's first request.
func (h *headErrors) Start(ctx context.Context, c *app.RequestContext) context.Context {
	hc, ok := c.GetConn().(*headConn)
	if !ok {
		hc = &headConn{Conn: c.GetConn(), c: c, s: h.s}
		c.SetConn(hc)
	}
	hc.armed, hc.rewrote = true, false
	return ctx
}

func (h *headErrors) Finish(context.Context, *app.RequestContext) {}

// disarm: the request reached kvgate, which writes its own answers.
func disarmHeadErrors(c *app.RequestContext) {
	if hc, ok := c.GetConn().(*headConn); ok {
		hc.armed = false
	}
}

// headConn is a public-listener connection that rewrites hertz's own error answers.
type headConn struct {
	network.Conn
	c       *app.RequestContext
	s       *Server
	armed   bool // between the tracer's Start and the first middleware
	rewrote bool // this request's error answer is written; drop hertz's bytes
}

func (hc *headConn) hertzError() bool {
	return hc.armed && hc.c.Response.StatusCode() >= 400
}

func (hc *headConn) WriteBinary(b []byte) (int, error) {
	if !hc.hertzError() {
		return hc.Conn.WriteBinary(b)
	}
	if !hc.rewrote {
		hc.rewrote = true
		if _, err := hc.Conn.WriteBinary(hc.errorResponse()); err != nil {
			return 0, err
		}
	}
	return len(b), nil
}

func (hc *headConn) Malloc(n int) ([]byte, error) {
	if hc.hertzError() {
		return make([]byte, n), nil // hertz's own bytes: dropped
	}
	return hc.Conn.Malloc(n)
}

// errorResponse is the OpenAI-style answer for the status hertz chose, and counts it.
func (hc *headConn) errorResponse() []byte {
	status := hc.c.Response.StatusCode()
	bad, msg := BadHead, "malformed HTTP request head"
	switch status {
	case consts.StatusRequestHeaderFieldsTooLarge:
		bad, msg = BadHeaderTooLarge, "request header fields too large (over -max-header-bytes)"
	case consts.StatusRequestEntityTooLarge:
		bad, msg = BadTooLarge, "request body too large"
	case consts.StatusRequestTimeout:
		bad, msg = BadTimeout, "request not received within the read timeout"
	}
	hc.s.m.bad[bad].Inc()
	body := appendErrorBody(nil, status, "invalid_request_error", msg)
	b := make([]byte, 0, 160+len(body))
	b = append(b, "HTTP/1.1 "...)
	b = strconv.AppendInt(b, int64(status), 10)
	b = append(b, ' ')
	b = append(b, consts.StatusMessage(status)...)
	b = append(b, "\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: "...)
	b = strconv.AppendInt(b, int64(len(body)), 10)
	b = append(b, "\r\n\r\n"...)
	return append(b, body...)
}
