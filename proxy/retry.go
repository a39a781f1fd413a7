package proxy

import (
	"context"
	"time"

	"github.com/cloudwego/hertz/pkg/app"
)

// tryPath is one way of serving a request (converged, pass-through, prefill/decode)
// under kvgate's one retry policy (Server.tries).
type tryPath interface {
	// decide picks the endpoints of the next try into d; false: none is left.
	decide(s *Server, c *app.RequestContext, st *reqState, d *decision, first bool) bool
	// admit asks the picked endpoints' breakers; a refusal returns the endpoint to
	// exclude (its try is not spent), else -1.
	admit(s *Server, d *decision) int
	// send runs the try; on outRetry nothing reached the client and failed is the
	// endpoint to exclude. last: no try would follow this one.
	send(ctx context.Context, s *Server, c *app.RequestContext, st *reqState, d *decision, last bool) (out outcome, failed int)
	// giveUp answers the client when no try succeeded (lastEp < 0: none was made).
	giveUp(s *Server, c *app.RequestContext, lastErr error, lastEp int)
}

// tries is kvgate's one retry policy, for every path: up to one try per endpoint, capped
// by -max-retries; an endpoint whose breaker refuses is excluded without spending a try;
// a try that failed before any byte reached the client excludes the endpoint it names,
// and the next try decides again (counted in kvgate_retries_total). When no endpoint is
// left the path gives its own answer.
func (s *Server) tries(ctx context.Context, c *app.RequestContext, st *reqState, p tryPath) {
	n := len(s.roster().eps)
	limit := n
	if s.cfg.Upstream.MaxRetries > 0 && s.cfg.Upstream.MaxRetries+1 < limit {
		limit = s.cfg.Upstream.MaxRetries + 1
	}
	var lastErr error
	lastEp := -1
	for try, decided := 0, 0; try < limit; decided++ {
		d := decision{ep: -1, slot: -1, rank: -1, decode: -1}
		if !p.decide(s, c, st, &d, decided == 0) {
			break
		}
		if ex := p.admit(s, &d); ex >= 0 {
			st.excluded.Set(ex)
			if st.excluded.Count() >= n {
				break
			}
			continue
		}
		if try > 0 {
			s.m.retries.Inc()
		}
		try++
		out, failed := p.send(ctx, s, c, st, &d, try == limit)
		if out.kind == outDone {
			return
		}
		lastErr, lastEp = out.err, failed
		st.excluded.Set(failed)
	}
	s.m.noHealthy.Inc()
	p.giveUp(s, c, lastErr, lastEp)
}

// convergedPath serves a request from one endpoint: an OpenAI request by the rule's
// decision, any other path by -select over the path (openAI false).
type convergedPath struct{ openAI bool }

var (
	openAIPath      tryPath = &convergedPath{openAI: true}
	passThroughPath tryPath = &convergedPath{}
)

func (p *convergedPath) decide(s *Server, c *app.RequestContext, st *reqState, d *decision, first bool) bool {
	if p.openAI {
		s.decide(st, d, false)
		if first {
			s.m.route.UpdateDuration(st.routeStart)
		}
	} else {
		s.decideFallback(st, d, s.baseEligible(st, st.eligible, nil), passThroughKey(c))
	}
	return d.ep >= 0
}

func (p *convergedPath) admit(s *Server, d *decision) int {
	if !s.roster().eps[d.ep].breaker.Allow() {
		return d.ep
	}
	return -1
}

func (p *convergedPath) send(ctx context.Context, s *Server, c *app.RequestContext, st *reqState, d *decision, last bool) (outcome, int) {
	st.canRetry = s.cfg.Upstream.Retry5xx && !last && s.hasAlternative(st, d.ep)
	return s.forward(ctx, c, st, d, st.body), d.ep
}

func (p *convergedPath) giveUp(s *Server, c *app.RequestContext, lastErr error, lastEp int) {
	if lastErr != nil {
		// lastErr names addresses (it is logged where it happened): the client is told
		// which endpoint failed, never where it lives.
		writeError(c, 502, "upstream_error", "no endpoint could be reached (last tried: "+s.roster().eps[lastEp].spec.Name+")")
		return
	}
	writeError(c, 503, "service_unavailable", "no healthy endpoint is available for this request")
}

// pdPath serves a request through a prefill and a decode endpoint with the prefill
// engine's two-step protocol (pd.go).
type pdPath struct{}

var disaggregatedPath tryPath = &pdPath{}

func (pdPath) decide(s *Server, c *app.RequestContext, st *reqState, d *decision, first bool) bool {
	t0 := time.Now()
	s.decidePD(st, d)
	s.m.stage[StageSelect].UpdateDuration(t0)
	if first {
		s.m.route.UpdateDuration(st.routeStart)
	}
	return d.ep >= 0 && d.decode >= 0
}

func (pdPath) admit(s *Server, d *decision) int {
	eps := s.roster().eps
	if !eps[d.ep].breaker.Allow() {
		return d.ep
	}
	if !eps[d.decode].breaker.Allow() {
		eps[d.ep].breaker.Neutral() // the prefill endpoint's permission goes unused
		return d.decode
	}
	return -1
}

func (pdPath) send(ctx context.Context, s *Server, c *app.RequestContext, st *reqState, d *decision, _ bool) (out outcome, failed int) {
	switch s.roster().eps[d.ep].spec.Engine {
	case EngineSGLang:
		out, failed = s.pdSGLang(ctx, c, st, d)
	case EngineTRTLLM:
		out, failed = s.pdTRT(ctx, c, st, d)
	default:
		out, failed = s.pdVLLM(ctx, c, st, d)
	}
	if out.kind == outDone {
		s.aff.put(st.sessKey, d.ep, d.decode, time.Now())
	}
	return out, failed
}

func (pdPath) giveUp(s *Server, c *app.RequestContext, _ error, _ int) {
	writeError(c, 503, "service_unavailable", "no healthy prefill and decode endpoints are available for this request")
}
