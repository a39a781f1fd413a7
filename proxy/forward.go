package proxy

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/cloudwego/hertz/pkg/app"
	errs "github.com/cloudwego/hertz/pkg/common/errors"
	"github.com/cloudwego/hertz/pkg/network"
	"github.com/cloudwego/hertz/pkg/protocol"
	"github.com/cloudwego/hertz/pkg/protocol/http1/resp"

	"github.com/kvgate/kvgate/proxy/balance"
	"github.com/kvgate/kvgate/proxy/openai"
	"github.com/kvgate/kvgate/proxy/route"
)

// decision is where one request goes and why.
type decision struct {
	ep int
	// slot is the inventory slot (endpoint and data-parallel rank) the request goes to,
	// -1 when no rank was chosen (the engine's own DP balancer picks one); rank is the
	// rank hinted to the engine (X-Data-Parallel-Rank), -1 for none (ranks.go).
	slot, rank int
	route      Route
	predicted  int // predicted cached prompt tokens (hit blocks x block size)
	decode     int // mode 1: the decode endpoint
	prefill    int // mode 1 decode leg: the prefill endpoint + 1 (0: none)

	prefillName string

	// The cost policy's accounting of this attempt (route.Queues): the prompt tokens the
	// endpoint must prefill, when and how it was sent, and whether its first byte is due.
	uncached int
	sentAt   time.Time
	firstAt  time.Time
	ticket   route.Ticket
	rticket  route.Ticket // the slot's, when the policy queues per rank
	firstDue bool
}

func prefillName(d *decision) string { return d.prefillName }

type outcomeKind uint8

const (
	outDone  outcomeKind = iota // a response (or an error response) went to the client
	outRetry                    // connect failure before any byte reached the client
)

type outcome struct {
	kind outcomeKind
	err  error
}

const (
	hdrEndpoint  = "x-kvgate-endpoint"
	hdrRoute     = "x-kvgate-route"
	hdrRequestID = "X-Request-Id"
	hdrPrefill   = "x-kvgate-prefill"
)

var (
	hdrXFF        = []byte("X-Forwarded-For")
	hdrRequestIDb = []byte(hdrRequestID)
)

// buildUpstream fills req (fresh from AcquireRequest) from the client's request for
// endpoint ep with body. It runs on every request, so the URI, X-Forwarded-For and the
// request id are built in a pooled buffer and handed to setters that copy them (hertz's
// setters keep their value arguments from the compiler's view, so a stack buffer would
// move to the heap), and headers are set by their canonical names (SetBytesKV
// allocates a copy of the name to normalize it).
func (s *Server) buildUpstream(c *app.RequestContext, req *protocol.Request, ep *endpoint, body []byte, path []byte) {
	c.Request.Header.CopyTo(&req.Header)
	stripHop(&req.Header)
	req.Header.Del("Expect") // kvgate already holds the whole body
	if !s.cfg.Listener.ForwardAuthorization {
		req.Header.Del("Authorization") // kvgate checked it; the engine wants none
	}
	scratch := hdrScratch.Get().(*[]byte)
	defer hdrScratch.Put(scratch)
	uri := append((*scratch)[:0], ep.spec.scheme...)
	uri = append(uri, "://"...)
	uri = append(uri, ep.spec.host...)
	if path == nil {
		path = c.Request.URI().RequestURI()
	}
	uri = append(uri, path...)
	req.SetRequestURI(bstr(uri)) // copies
	req.Header.SetHost(ep.spec.host)
	req.Header.SetMethodBytes(c.Request.Header.Method())
	xff := uri[:0]
	if prior := c.Request.Header.Peek("X-Forwarded-For"); len(prior) > 0 {
		xff = append(append(xff, prior...), ", "...)
	}
	if appendClientIP(c, &xff) { // without an address, the copied prior value stays
		req.Header.SetCanonical(hdrXFF, xff) // copies
	}
	*scratch = xff[:0] // keep what it grew to
	if len(req.Header.Peek("X-Forwarded-Proto")) == 0 {
		if s.certs != nil {
			req.Header.Set("X-Forwarded-Proto", "https")
		} else {
			req.Header.Set("X-Forwarded-Proto", "http")
		}
	}
	req.Header.SetCanonical(hdrRequestIDb, requestID(c, scratch))
	// Borrowed, not copied (a 4k-token body is ~16 KB): body must stay unchanged until req
	// is sent. forward sends synchronously; a P/D leg that runs beside a rewrite copies.
	req.SetBodyRaw(body)
}

// appendClientIP appends the client's IP address to *dst, as net.IP.String writes it
// (an IPv4-mapped address in dotted form, no zone), and reports whether there was one.
func appendClientIP(c *app.RequestContext, dst *[]byte) bool {
	ra := c.RemoteAddr()
	if ra == nil {
		return false
	}
	if ta, ok := ra.(*net.TCPAddr); ok {
		a, ok := netip.AddrFromSlice(ta.IP)
		if !ok {
			return false
		}
		*dst = a.Unmap().AppendTo(*dst)
		return true
	}
	if h, _, err := net.SplitHostPort(ra.String()); err == nil && h != "" {
		*dst = append(*dst, h...)
		return true
	}
	return false
}

// requestID returns the client's X-Request-Id or makes one (128 random bits in hex), and
// keeps it on the request so both legs of a P/D flow and the response carry the same
// value. The bits come from math/rand/v2's runtime generator (ChaCha8 per thread, seeded
// by the OS), not crypto/rand, whose call cost 3 us of every request: the id only
// correlates logs and headers, and a client may send its own, so nothing may trust it
// and uniqueness is all it needs.
// scratch: a pooled buffer for the new id (nil: one is taken from the pool).
func requestID(c *app.RequestContext, scratch *[]byte) []byte {
	if id := c.Request.Header.Peek(hdrRequestID); len(id) > 0 && len(id) <= 256 {
		return id
	}
	if scratch == nil {
		scratch = hdrScratch.Get().(*[]byte)
		defer hdrScratch.Put(scratch)
	}
	b := binary.LittleEndian.AppendUint64((*scratch)[:0], rand.Uint64())
	b = binary.LittleEndian.AppendUint64(b, rand.Uint64())
	b = hex.AppendEncode(b, b[:16])
	c.Request.Header.SetCanonical(hdrRequestIDb, b[16:]) // copies
	*scratch = b[:0]
	return c.Request.Header.Peek(hdrRequestID)
}

// hdrScratch holds the buffers buildUpstream and requestID build header values in.
var hdrScratch = sync.Pool{New: func() any { b := make([]byte, 0, 256); return &b }}

// classify turns a client.Do error into the upstream error kind.
func classify(ctx context.Context, err error) UpstreamError {
	var de *dialError
	switch {
	case errors.As(err, &de):
		return ErrConnect
	case errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, errs.ErrTimeout),
		errors.Is(err, context.DeadlineExceeded):
		return ErrTimeout
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return ErrTimeout
	}
	if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, io.EOF) || errors.Is(err, errs.ErrConnectionClosed) ||
		errors.Is(err, errs.ErrBadPoolConn) {
		return ErrConnect
	}
	if isTimeoutText(err) {
		return ErrTimeout
	}
	return ErrConnect
}

func isTimeoutText(err error) bool {
	return bytes.Contains([]byte(err.Error()), []byte("timeout"))
}

// forward sends body to d.ep and relays the answer. It never writes to the client when
// it returns outRetry.
func (s *Server) forward(ctx context.Context, c *app.RequestContext, st *reqState, d *decision, body []byte) outcome {
	ep := s.roster().eps[d.ep]
	req := protocol.AcquireRequest()
	res := protocol.AcquireResponse()
	defer protocol.ReleaseRequest(req)
	defer protocol.ReleaseResponse(res)
	s.buildUpstream(c, req, ep, body, nil)
	hintRank(req, d)
	s.loads.Inc(d.ep)
	defer s.loads.Dec(d.ep)
	if ep.retired.Load() { // removed since the decision: see fleet.go's drain
		return outcome{kind: outRetry, err: errRetired}
	}
	if q := s.rankLoads(d); q != nil {
		q.Inc(d.slot)
		defer q.Dec(d.slot)
	}
	s.sent(d)
	defer s.finished(d)
	err := s.do(ctx, ep.spec.host, req, res)
	if err != nil {
		kind, gone := s.failed(ctx, d.ep, err)
		if gone {
			s.m.clientGone.Inc()
			return outcome{kind: outDone}
		}
		if kind == ErrTimeout {
			writeError(c, 504, "upstream_timeout", "endpoint "+ep.spec.Name+" did not answer within -upstream-timeout")
			return outcome{kind: outDone}
		}
		s.log.Warn("upstream connect failure", "endpoint", ep.spec.Name, "err", err)
		return outcome{kind: outRetry, err: err}
	}
	if res.StatusCode() < 200 {
		// An interim answer (a 103 Early Hints): hertz's client takes any but a 100 for
		// the final one and drops what follows, so the engine's answer is lost. Relayed,
		// it would leave the client waiting for a final answer that never comes.
		res.CloseBodyStream() //nolint:errcheck
		s.brokeOff(d.ep)
		ep.breaker.Neutral() // the engine answered; whether it is sick this does not say
		s.log.Warn("upstream sent an interim answer kvgate cannot relay", "endpoint", ep.spec.Name, "status", res.StatusCode())
		writeError(c, 502, "upstream_error", "endpoint "+ep.spec.Name+" sent an interim (1xx) answer kvgate cannot relay")
		return outcome{kind: outDone}
	}
	if code := res.StatusCode(); s.answered(d.ep, code) && st.canRetry {
		// Nothing reached the client: another endpoint answers instead (a sick engine's
		// 5xx streak costs no request while a healthy one exists).
		res.CloseBodyStream() //nolint:errcheck
		return outcome{kind: outRetry, err: errors.New("endpoint " + ep.spec.Name + " answered " + itoa(code))}
	}
	s.m.routed[d.route][d.ep].Inc()
	s.noteStores(st, d)
	if !bytes.HasPrefix(res.Header.ContentType(), []byte("text/event-stream")) {
		// A whole answer comes after the last token: it ends the prefill's queue time but
		// is no sample of its speed.
		d.ticket.NoSample()
		s.firstToken(d)
	}
	if !s.relayResponse(ctx, c, st, d, ep, res) {
		return outcome{kind: outRetry, err: errors.New("endpoint " + ep.spec.Name + " broke off its response")}
	}
	return outcome{kind: outDone}
}

// errRetired: the endpoint left the fleet between the decision and the send; the
// request is decided again (the in-flight count before the check is what lets a drain
// finish without racing it).
var errRetired = errors.New("endpoint removed from the fleet")

// failed books an exchange with endpoint i that got no answer: a client that left is
// neutral for the breaker (gone); otherwise the error's kind is counted and the breaker
// told. Both the converged path and the P/D legs account through it and answered.
func (s *Server) failed(ctx context.Context, i int, err error) (kind UpstreamError, gone bool) {
	ep := s.roster().eps[i]
	if ctx.Err() != nil {
		ep.breaker.Neutral()
		return ErrConnect, true
	}
	kind = classify(ctx, err)
	s.m.upstream[kind][i].Inc()
	ep.breaker.Failure()
	return kind, false
}

// answered books an answer's status from endpoint i and says whether it was a 5xx.
func (s *Server) answered(i, status int) (fiveXX bool) {
	if status >= 500 {
		s.m.upstream[Err5xx][i].Inc()
		s.roster().eps[i].breaker.FiveXX()
		return true
	}
	s.roster().eps[i].breaker.Success()
	return false
}

// brokeOff books an answer cut short while kvgate read it.
func (s *Server) brokeOff(i int) { s.m.upstream[ErrMidStream][i].Inc() }

// sent counts d's prompt as queued prefill at its endpoint (route.Queues).
func (s *Server) sent(d *decision) {
	d.sentAt, d.firstAt, d.firstDue = time.Now(), time.Time{}, true
	d.ticket = s.queues.Sent(d.ep, d.uncached)
	if q := s.rankQueues(d); q != nil {
		d.rticket = q.Sent(d.slot, d.uncached)
	}
}

// noteStores counts an answered request toward its endpoint's stale check when the
// engine should publish stored blocks for it (kvRouter.sendsNewBlocks). A mode-1 decode
// leg (d.prefill set) never counts: the prefill endpoint computes the blocks, and its leg
// counts them (prefillLeg).
func (s *Server) noteStores(st *reqState, d *decision) {
	if s.kv != nil && d.prefill == 0 && s.kv.sendsNewBlocks(st, d) {
		s.states.eps[d.ep].sentNew.Add(1)
	}
}

// rankQueues is where the cost policy queues d per data-parallel rank (nil: without data
// parallelism the server's own queues are the policy's).
func (s *Server) rankQueues(d *decision) *route.Queues {
	if s.kv == nil || !s.ranks.ranked || d.slot < 0 {
		return nil
	}
	return s.kv.slotQueues
}

// rankLoads is rankQueues' counterpart for in-flight counts.
func (s *Server) rankLoads(d *decision) *balance.Loads {
	if s.kv == nil || !s.ranks.ranked || d.slot < 0 {
		return nil
	}
	return s.kv.slotLoads
}

// firstToken records the first byte of d's answer: its prefill is done.
func (s *Server) firstToken(d *decision) {
	if d.firstDue {
		d.firstDue = false
		d.firstAt = time.Now()
		s.queues.FirstToken(d.ep, d.uncached, d.firstAt.Sub(d.sentAt), d.ticket)
		if q := s.rankQueues(d); q != nil {
			q.FirstToken(d.slot, d.uncached, d.firstAt.Sub(d.sentAt), d.rticket)
		}
	}
}

// finished takes d off its endpoint's queue if no byte came, and records how long it
// held the endpoint.
func (s *Server) finished(d *decision) {
	if d.firstDue {
		d.firstDue = false
		s.queues.Unsent(d.ep, d.uncached)
		if q := s.rankQueues(d); q != nil {
			q.Unsent(d.slot, d.uncached)
		}
	}
	now := time.Now()
	s.queues.Finished(d.ep, d.ticket, now.Sub(d.sentAt), now.Sub(d.firstAt), !d.firstAt.IsZero())
	if q := s.rankQueues(d); q != nil {
		q.Finished(d.slot, d.rticket, now.Sub(d.sentAt), now.Sub(d.firstAt), !d.firstAt.IsZero())
	}
}

// setDecisionHeaders adds the evidence headers a user reads to see each decision.
func setDecisionHeaders(c *app.RequestContext, ep *endpoint, d *decision) {
	c.Response.Header.Set(hdrEndpoint, ep.spec.Name)
	c.Response.Header.Set(hdrRoute, d.route.String())
	c.Response.Header.SetBytesV(hdrRequestID, requestID(c, nil))
	if d.prefill > 0 {
		c.Response.Header.Set(hdrPrefill, prefillName(d))
	}
}

// copyResponseHeader copies res's status and headers minus hop-by-hop ones.
func copyResponseHeader(c *app.RequestContext, res *protocol.Response) {
	res.Header.CopyTo(&c.Response.Header)
	stripHop(&c.Response.Header)
}

// relayResponse copies status, headers and body from res to the client. Event streams
// and bodies of unknown length are relayed read by read, each flushed at once; small
// bodies are read whole so their usage receipt can be parsed. It returns false, having
// written nothing, when a whole-read body broke off and st.canRetry allows another
// endpoint to answer.
func (s *Server) relayResponse(ctx context.Context, c *app.RequestContext, st *reqState, d *decision, ep *endpoint, res *protocol.Response) bool {
	copyResponseHeader(c, res)
	if s.draining.Load() {
		c.SetConnectionClose() // shutting down: the client reconnects through its balancer
	}
	setDecisionHeaders(c, ep, d)
	body := res.BodyStream()
	sse := bytes.HasPrefix(res.Header.ContentType(), []byte("text/event-stream"))
	cl := res.Header.ContentLength()
	status := res.StatusCode()
	var first time.Time // first body byte to the client
	// An answer that has no body by definition (to HEAD, or a 204 or 304: hertz's client
	// reads none) goes the whole way, empty: streamed, it would get a chunked terminator
	// that its client reads as the start of the next answer on the connection.
	if res.MustSkipBody() || !sse && cl >= 0 && cl <= 1<<20 {
		broke := false
		st.out = st.out[:0]
		for {
			if len(st.out) == cap(st.out) {
				st.out = append(st.out, 0)[:len(st.out)]
			}
			n, err := body.Read(st.out[len(st.out):cap(st.out)])
			st.out = st.out[:len(st.out)+n]
			if err != nil {
				if err != io.EOF {
					// Nothing reached the client yet: say what happened instead of
					// passing on a truncated body.
					s.brokeOff(d.ep)
					res.CloseBodyStream() //nolint:errcheck
					if st.canRetry {
						c.Response.Reset()
						return false
					}
					// The error text names addresses: it goes to the log, not the client.
					s.log.Warn("upstream broke off its response", "endpoint", ep.spec.Name, "err", err)
					writeError(c, 502, "upstream_error", "endpoint "+ep.spec.Name+" broke off its response")
					setDecisionHeaders(c, ep, d)
					status, broke = 502, true
				}
				break
			}
		}
		if !broke {
			res.CloseBodyStream() //nolint:errcheck
			c.Response.SetBody(st.out)
			st.cached = s.receipt(d, st.out)
		}
		first = time.Now() // hertz writes the whole answer as the handler returns
	} else {
		first = s.streamBody(ctx, c, st, d, res, sse)
	}
	// The one place answers are recorded (duration, TTFT, status code).
	end := time.Now()
	var ttft time.Duration
	if !first.IsZero() {
		ttft = first.Sub(st.arrived)
	}
	s.m.observeRequest(d.ep, d.route, status, end.Sub(st.arrived), ttft)
	if s.accessLogOn.Load() {
		s.accessLog(c, st, d, status, end.Sub(st.arrived), ttft)
	}
	return true
}

// abortableWriter is hertz's chunked writer that, once aborted, does not write the
// terminating chunk: the client sees a broken stream instead of a clean end.
type abortableWriter struct {
	network.ExtWriter
	aborted bool
}

var errAborted = errors.New("upstream stream broke; connection aborted")

func (w *abortableWriter) Finalize() error {
	if w.aborted {
		return errAborted
	}
	return w.ExtWriter.Finalize()
}

// streamBody relays res's body as it arrives. A client disconnect (sensed by hertz)
// or a failed write force-closes the upstream connection, cancelling the engine's work.
// It returns when the first body byte was written to the client (zero: none was).
func (s *Server) streamBody(ctx context.Context, c *app.RequestContext, st *reqState, d *decision, res *protocol.Response, sse bool) (first time.Time) {
	c.Response.Header.Del("Content-Length")
	w := &abortableWriter{ExtWriter: resp.NewChunkedBodyWriter(&c.Response, c.GetWriter())}
	c.Response.HijackWriter(w)
	// Send the headers now: a long prefill may precede the first event.
	w.Write(nil) //nolint:errcheck // writes the header only
	w.Flush()    //nolint:errcheck
	body := res.BodyStream()
	fc, _ := body.(interface{ ForceClose() error })
	done := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		if fc != nil {
			fc.ForceClose() //nolint:errcheck
		}
		close(done)
	})
	var rs receiptScanner
	clientGone := false
	for {
		n, err := body.Read(st.relay)
		if n > 0 {
			if first.IsZero() {
				first = time.Now()
			}
			s.firstToken(d)
			if _, werr := w.Write(st.relay[:n]); werr != nil {
				clientGone = true
			} else if ferr := w.Flush(); ferr != nil {
				clientGone = true
			}
			if sse && !clientGone {
				rs.feed(st, st.relay[:n])
			}
		}
		if clientGone {
			break
		}
		if err != nil {
			if err != io.EOF {
				if ctx.Err() != nil {
					clientGone = true
				} else {
					s.brokeOff(d.ep)
					w.aborted = true
				}
			}
			break
		}
	}
	if !stop() && ctx.Err() != nil {
		<-done
	}
	if clientGone {
		s.m.clientGone.Inc()
		if fc != nil {
			fc.ForceClose() //nolint:errcheck
		}
		w.aborted = true
	}
	res.CloseBodyStream() //nolint:errcheck
	if rs.found {
		st.cached = rs.cached
		s.recordReceipt(d, rs.cached, rs.prompt)
	}
	return first
}

// receiptScanner finds usage.prompt_tokens_details.cached_tokens in SSE data lines as
// they pass, without holding any of them back.
type receiptScanner struct {
	found    bool
	skipLine bool
	cached   int64
	prompt   int64
}

const maxReceiptLine = 64 << 10

func (r *receiptScanner) feed(st *reqState, p []byte) {
	for len(p) > 0 {
		nl := bytes.IndexByte(p, '\n')
		if nl < 0 {
			if !r.skipLine {
				if len(st.tail)+len(p) > maxReceiptLine {
					r.skipLine = true
					st.tail = st.tail[:0]
				} else {
					st.tail = append(st.tail, p...)
				}
			}
			return
		}
		if !r.skipLine {
			var line []byte
			if len(st.tail) > 0 {
				st.tail = append(st.tail, p[:nl]...)
				line = st.tail
			} else {
				line = p[:nl]
			}
			r.line(line)
		}
		st.tail = st.tail[:0]
		r.skipLine = false
		p = p[nl+1:]
	}
}

var dataPrefix = []byte("data:")

func (r *receiptScanner) line(l []byte) {
	if !bytes.HasPrefix(l, dataPrefix) || !bytes.Contains(l, []byte(`"cached_tokens"`)) {
		return
	}
	l = bytes.TrimSpace(l[len(dataPrefix):])
	if n, ok := openai.Int(openai.Path(l, "usage", "prompt_tokens_details", "cached_tokens")); ok {
		r.found, r.cached = true, n
		r.prompt, _ = openai.Int(openai.Path(l, "usage", "prompt_tokens"))
	}
}

// receipt reads the delivery receipt from a whole JSON body.
// It returns the cached tokens, -1 when the body carries no receipt.
func (s *Server) receipt(d *decision, body []byte) int64 {
	usage := openai.Path(body, "usage")
	if usage == nil {
		return -1
	}
	if n, ok := openai.Int(openai.Path(usage, "prompt_tokens_details", "cached_tokens")); ok {
		p, _ := openai.Int(openai.Path(usage, "prompt_tokens"))
		s.recordReceipt(d, n, p)
		return n
	}
	return -1
}

func (s *Server) recordReceipt(d *decision, cached, prompt int64) {
	ep := d.ep
	if d.decode >= 0 && s.cfg.KV.Mode == KVDisaggregated {
		ep = d.decode
	}
	s.m.receipts[ep].Inc()
	s.m.delivered[ep].Add(int(cached))
	s.m.predicted[ep].Add(d.predicted)
	s.m.promptToks[ep].Add(int(prompt))
	s.checkGap(ep)
}

// checkGap warns (at most once a minute per endpoint) when the engine delivers far fewer
// cached tokens than kvgate predicted: the usual cause is a tokenizer or chat template
// that differs from the engine's.
func (s *Server) checkGap(ep int) {
	r := s.m.receipts[ep].Get()
	if r < 20 || r%20 != 0 {
		return
	}
	pred, del := s.m.predicted[ep].Get(), s.m.delivered[ep].Get()
	if pred < 1000 || float64(del) >= 0.5*float64(pred) {
		return
	}
	now := time.Now().Unix()
	last := s.gapWarned[ep].Load()
	if now-last < 60 || !s.gapWarned[ep].CompareAndSwap(last, now) {
		return
	}
	s.log.Warn("engine delivered far fewer cached tokens than predicted: tokenizer, chat template or hash settings likely differ from the engine's",
		"endpoint", s.roster().eps[ep].spec.Name, "predicted", pred, "delivered", del, "receipts", r)
}

func itoa(n int) string { return strconv.Itoa(n) }
