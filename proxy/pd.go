package proxy

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"net"
	"strconv"
	"time"

	"github.com/cloudwego/hertz/pkg/app"
	"github.com/cloudwego/hertz/pkg/protocol"

	"github.com/kvgate/kvgate/proxy/openai"
	"github.com/kvgate/kvgate/shard"
)

// decidePD runs the mode-1 ladder, a chain of tiers where the first that picks decides:
// session affinity (prefill and decode of the session's last request) -> KV-Exact over
// the prefill endpoints -> the prefix trie of what kvgate sent where (trie.go) ->
// prefill by minimum in-flight load (round-robin on ties). Decode then goes by the
// engines' reported load (route.Decode). The prefill pick is recorded in the trie (not
// for /debug/explain, whose meter is nil); d.route names the tier that decided.
func (s *Server) decidePD(st *reqState, d *decision) {
	d.ep, d.slot, d.rank, d.decode, d.predicted, d.route = -1, -1, -1, -1, 0, RouteRR
	elP := s.baseEligible(st, st.eligible, s.roster().prefillMask)
	elD := s.baseEligible(st, st.scratch, s.roster().decodeMask)
	if s.pdAffinity(st, elP, elD, d) {
		return
	}
	_ = s.pdKV(st, elP, d) || s.pdTrie(st, elP, d) || s.pdLoad(elP, d)
	d.decode = s.decodeSel.Select(elD)
	s.ranks.settle(d)
	st.meter.sent(st, d.slot)
}

// pdAffinity: the session's last prefill and decode endpoints, while both are eligible
// and the entry lives (-pd-affinity-ttl).
func (s *Server) pdAffinity(st *reqState, elP, elD shard.Mask, d *decision) bool {
	p, dec, ok := s.aff.get(st.sessKey, time.Now())
	if !ok || !elP.Has(p) || !elD.Has(dec) {
		return false
	}
	d.ep, d.decode, d.route = p, dec, RouteAffinity
	st.meter.affinity()
	return true
}

// pdKV: KV-Exact's verdict over the prefill endpoints (a miss leaves its reason in
// d.route for the tiers below).
func (s *Server) pdKV(st *reqState, elP shard.Mask, d *decision) bool {
	if s.kv != nil {
		s.kv.route(st, elP, d)
	}
	return d.ep >= 0
}

// pdTrie: the prefill endpoint kvgate last sent the prompt's deepest prefix to.
func (s *Server) pdTrie(st *reqState, elP shard.Mask, d *decision) bool {
	if s.kv != nil && s.kv.trie != nil {
		s.kv.trieRoute(st, elP, d)
	}
	return d.ep >= 0
}

// pdLoad: the prefill endpoint with the fewest requests in flight.
func (s *Server) pdLoad(elP shard.Mask, d *decision) bool {
	d.ep = s.prefRR.MinLoad(elP, s.loads)
	if !d.route.IsMiss() {
		d.route = RoutePDLoad
	}
	return d.ep >= 0
}

// sessionKey is the OpenAI `user` field or the X-Conversation-Id header.
func sessionKey(c *app.RequestContext, st *reqState) []byte {
	if u := st.oa.Value[openai.FUser]; u.Present() {
		return u.Bytes(st.body)
	}
	if c != nil {
		if v := c.Request.Header.Peek("X-Conversation-Id"); len(v) > 0 {
			return v
		}
	}
	return nil
}

// servePD proxies one request through a prefill endpoint and a decode endpoint with
// the engine's two-step protocol, under the one retry policy (retry.go).
func (s *Server) servePD(ctx context.Context, c *app.RequestContext, st *reqState) {
	st.sessKey = append(st.sessKey[:0], sessionKey(c, st)...)
	requestID(c, nil) // fix the id before legs may run concurrently
	s.tries(ctx, c, st, disaggregatedPath)
}

// prepareLeg builds a leg's upstream request; it reads c, so it runs on the handler's
// goroutine even when the leg itself runs concurrently.
func (s *Server) prepareLeg(c *app.RequestContext, i int, body []byte) *protocol.Request {
	req := protocol.AcquireRequest()
	s.buildUpstream(c, req, s.roster().eps[i], body, nil)
	req.SetBody(body)        // a copy: the leg may run while the caller rewrites body's buffer
	req.Header.Del("Accept") // the prefill leg is never streamed
	return req
}

func (s *Server) doLeg(ctx context.Context, i int, req *protocol.Request, dst []byte) (status int, resp []byte, kind UpstreamError, err error) {
	ep := s.roster().eps[i]
	res := protocol.AcquireResponse()
	defer protocol.ReleaseResponse(res)
	s.loads.Inc(i)
	defer s.loads.Dec(i)
	if ep.retired.Load() { // removed since the decision (fleet.go): a connect failure, unbooked
		return 0, dst, ErrConnect, errRetired
	}
	if err = s.do(ctx, ep.spec.host, req, res); err != nil {
		kind, _ = s.failed(ctx, i, err)
		return 0, dst, kind, err
	}
	// A leg's answer is a small JSON document; past maxLegBody it is cut (the client
	// then gets what the engine's answer parses to, or the engine's error).
	dst, rerr := appendBody(dst[:0], res.BodyStream(), maxLegBody)
	if rerr != nil && rerr != errBodyTooLarge {
		res.CloseBodyStream() //nolint:errcheck
		s.brokeOff(i)
		ep.breaker.Failure()
		return 0, dst, ErrMidStream, rerr
	}
	res.CloseBodyStream() //nolint:errcheck
	status = res.StatusCode()
	s.answered(i, status)
	return status, dst, 0, nil
}

// legFailed turns a failed prefill exchange into the client's answer or a retry.
func (s *Server) legFailed(c *app.RequestContext, i int, kind UpstreamError, err error) (outcome, int) {
	if kind == ErrTimeout {
		writeError(c, 504, "upstream_timeout", "prefill endpoint "+s.roster().eps[i].spec.Name+" did not answer within -upstream-timeout")
		return outcome{kind: outDone}, i
	}
	return outcome{kind: outRetry, err: err}, i
}

// relayLegError sends a non-2xx prefill answer to the client as it came.
func (s *Server) relayLegError(c *app.RequestContext, d *decision, status int, body []byte) {
	if status < 200 { // an interim answer hertz took for the final one (see forward)
		writeError(c, 502, "upstream_error", "prefill endpoint "+s.roster().eps[d.ep].spec.Name+" sent an interim (1xx) answer kvgate cannot relay")
		return
	}
	c.Response.Reset()
	c.Response.SetStatusCode(status)
	c.Response.Header.SetContentType("application/json")
	setDecisionHeaders(c, s.roster().eps[d.ep], d)
	c.Response.SetBody(body)
}

// decodeLeg forwards the decode request, moving to another decode endpoint on a
// connect failure (the prefill's KV stays where it is).
func (s *Server) decodeLeg(ctx context.Context, c *app.RequestContext, st *reqState, d *decision, body []byte) (outcome, int) {
	for {
		dd := *d
		dd.ep = d.decode
		dd.prefill = d.ep + 1
		dd.prefillName = s.roster().eps[d.ep].spec.Name
		dd.uncached = 0 // the KV arrives from the prefill endpoint
		out := s.forward(ctx, c, st, &dd, body)
		if out.kind == outDone {
			return out, -1
		}
		st.excluded.Set(d.decode)
		el := s.baseEligible(st, st.scratch, s.roster().decodeMask)
		next := s.decodeSel.Select(el)
		if next < 0 || !s.roster().eps[next].breaker.Allow() {
			return out, d.decode
		}
		s.m.retries.Inc()
		d.decode = next
	}
}

// prefillLeg sends the prefill (context) request in st.legA to d.ep and returns its
// 200 answer. ok false: the leg failed or the engine refused it, and (out, failed) is
// what the P/D step returns (a retry, or the client already answered).
func (s *Server) prefillLeg(ctx context.Context, c *app.RequestContext, st *reqState, d *decision) (resp []byte, out outcome, failed int, ok bool) {
	s.sent(d)
	req := s.prepareLeg(c, d.ep, st.legA)
	hintRank(req, d)
	status, resp, kind, err := s.doLeg(ctx, d.ep, req, st.legResp)
	protocol.ReleaseRequest(req)
	st.legResp = resp
	if err == nil && status == 200 {
		s.firstToken(d) // the prefill leg answers once its one token exists
		s.noteStores(st, d)
	}
	s.finished(d)
	if err != nil {
		out, failed = s.legFailed(c, d.ep, kind, err)
		return nil, out, failed, false
	}
	if status != 200 {
		s.relayLegError(c, d, status, resp)
		return nil, outcome{kind: outDone}, -1, false
	}
	return resp, outcome{}, 0, true
}

// pdVLLM: the prefill request gets max_tokens=1, stream=false and
// kv_transfer_params{do_remote_decode:true}; the decode request carries the
// kv_transfer_params the prefill answered with and streams to the client.
func (s *Server) pdVLLM(ctx context.Context, c *app.RequestContext, st *reqState, d *decision) (outcome, int) {
	extra := append(st.legB[:0], `"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null},"stream":false,"max_tokens":1`...)
	if st.oa.Member[openai.FMaxCompletionTokens].Present() {
		extra = append(extra, `,"max_completion_tokens":1`...)
	}
	st.legB = extra
	st.legA = openai.AppendRewritten(st.legA[:0], st.body, &st.oa, extra,
		openai.FKVTransferParams, openai.FStream, openai.FStreamOptions, openai.FMaxTokens, openai.FMaxCompletionTokens)
	resp, out, failed, ok := s.prefillLeg(ctx, c, st, d)
	if !ok {
		return out, failed
	}
	ktp := openai.Path(resp, "kv_transfer_params")
	if len(ktp) == 0 {
		writeError(c, 502, "upstream_error", "prefill endpoint "+s.roster().eps[d.ep].spec.Name+" answered without kv_transfer_params (is it started with a KV connector and kv_role kv_producer/kv_both?)")
		return outcome{kind: outDone}, -1
	}
	st.legB = append(st.legB[:0], `"kv_transfer_params":`...)
	st.legB = append(st.legB, ktp...)
	st.legA = openai.AppendRewritten(st.legA[:0], st.body, &st.oa, st.legB, openai.FKVTransferParams)
	return s.decodeLeg(ctx, c, st, d, st.legA)
}

// pdSGLang sends the same request, tagged with the prefill server's bootstrap host,
// port and a fresh room, to prefill and decode at once; the decode answer is relayed.
func (s *Server) pdSGLang(ctx context.Context, c *app.RequestContext, st *reqState, d *decision) (outcome, int) {
	p := s.roster().eps[d.ep]
	host, _, err := net.SplitHostPort(p.spec.host)
	if err != nil {
		host = p.spec.host
	}
	port := p.spec.BootstrapPort
	if port == 0 {
		port = 8998 // SGLang's --disaggregation-bootstrap-port default
	}
	var rb [8]byte
	rand.Read(rb[:]) //nolint:errcheck
	room := binary.BigEndian.Uint64(rb[:]) >> 1
	extra := append(st.legB[:0], `"bootstrap_host":`...)
	extra = appendJSONString(extra, host)
	extra = append(extra, `,"bootstrap_port":`...)
	extra = strconv.AppendInt(extra, int64(port), 10)
	extra = append(extra, `,"bootstrap_room":`...)
	extra = strconv.AppendUint(extra, room, 10)
	st.legB = extra
	st.legA = openai.AppendRewritten(st.legA[:0], st.body, &st.oa, extra,
		openai.FBootstrapHost, openai.FBootstrapPort, openai.FBootstrapRoom)
	type result struct {
		kind UpstreamError
		err  error
	}
	done := make(chan result, 1)
	preq := s.prepareLeg(c, d.ep, st.legA) // prepareLeg copies: legA may be reused
	hintRank(preq, d)
	legCtx, cancelLeg := context.WithCancel(ctx)
	defer cancelLeg()
	go func() {
		defer protocol.ReleaseRequest(preq)
		_, _, kind, err := s.doLeg(legCtx, d.ep, preq, nil)
		done <- result{kind, err}
	}()
	out, failed := s.decodeLeg(ctx, c, st, d, st.legA)
	if out.kind == outRetry {
		// No decode engine took the request, so none will fetch the prefill's KV: the
		// prefill engine would hold its request (and kvgate the client) until its
		// bootstrap timeout, minutes. Cancelling closes its connection (a neutral
		// failure for its breaker, as a client's leaving is).
		cancelLeg()
	}
	r := <-done
	if r.err != nil && legCtx.Err() == nil {
		s.log.Warn("sglang prefill leg failed", "endpoint", p.spec.Name, "err", r.err)
	}
	return out, failed
}

// pdTRT: the context request carries disaggregated_params{request_type:context_only}
// and stream=false; when the context answer already finished (finish_reason other than
// length/not_finished) it is the answer; otherwise the generation request carries the
// returned disaggregated_params with request_type generation_only.
func (s *Server) pdTRT(ctx context.Context, c *app.RequestContext, st *reqState, d *decision) (outcome, int) {
	st.legA = openai.AppendRewritten(st.legA[:0], st.body, &st.oa,
		[]byte(`"disaggregated_params":{"request_type":"context_only"},"stream":false`),
		openai.FDisaggregatedParams, openai.FStream, openai.FStreamOptions)
	resp, out, failed, ok := s.prefillLeg(ctx, c, st, d)
	if !ok {
		return out, failed
	}
	choice := openai.FirstElement(openai.Path(resp, "choices"))
	fr := openai.Path(choice, "finish_reason")
	if !bytes.Equal(fr, []byte(`"length"`)) && !bytes.Equal(fr, []byte(`"not_finished"`)) && len(fr) > 0 && fr[0] == '"' {
		s.earlyExit(c, st, d, resp)
		return outcome{kind: outDone}, -1
	}
	dp := openai.Path(choice, "disaggregated_params")
	if len(dp) == 0 || dp[0] != '{' {
		writeError(c, 502, "upstream_error", "context endpoint "+s.roster().eps[d.ep].spec.Name+" answered without disaggregated_params")
		return outcome{kind: outDone}, -1
	}
	extra := append(st.legB[:0], `"disaggregated_params":`...)
	extra = openai.AppendObjectWith(extra, dp, "request_type", []byte(`"generation_only"`))
	drop := []openai.Field{openai.FDisaggregatedParams}
	if !st.chat {
		if ids := openai.Path(resp, "prompt_token_ids"); len(ids) > 0 && ids[0] == '[' {
			extra = append(extra, `,"prompt":`...)
			extra = append(extra, ids...)
			drop = append(drop, openai.FPrompt)
		}
	}
	st.legB = extra
	st.legA = openai.AppendRewritten(st.legA[:0], st.body, &st.oa, extra, drop...)
	return s.decodeLeg(ctx, c, st, d, st.legA)
}

// earlyExit answers with the context server's finished response; a streaming client
// gets it as one SSE event followed by [DONE].
func (s *Server) earlyExit(c *app.RequestContext, st *reqState, d *decision, resp []byte) {
	c.Response.Reset()
	c.Response.SetStatusCode(200)
	setDecisionHeaders(c, s.roster().eps[d.ep], d)
	if st.oa.Stream {
		c.Response.Header.SetContentType("text/event-stream")
		b := append([]byte("data: "), resp...)
		b = append(b, "\n\ndata: [DONE]\n\n"...)
		c.Response.SetBody(b)
	} else {
		c.Response.Header.SetContentType("application/json")
		c.Response.SetBody(resp)
	}
	ctxOnly := *d
	ctxOnly.decode = d.ep // the context server answered: its receipt is its own
	s.receipt(&ctxOnly, resp)
}
