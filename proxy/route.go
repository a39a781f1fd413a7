package proxy

import (
	"time"

	"github.com/zeebo/xxh3"

	"github.com/kvgate/kvgate/proxy/openai"
	"github.com/kvgate/kvgate/proxy/route"
	"github.com/kvgate/kvgate/shard"
)

// baseEligible fills m with the endpoints that may take a new request: not excluded
// for this request, not administratively down, passing health checks, breaker not
// open; restricted to role when role is non-nil.
func (s *Server) baseEligible(st *reqState, m shard.Mask, role shard.Mask) shard.Mask {
	clear(m)
	ros := s.roster()
	for _, i := range ros.slots {
		e := ros.eps[i]
		if st.excluded.Has(i) || e.retired.Load() || e.down.Load() || !e.healthy.Load() {
			continue
		}
		if role != nil && !role.Has(i) {
			continue
		}
		if !e.breaker.Ready() {
			continue
		}
		m.Set(i)
	}
	return m
}

// decide routes an OpenAI request in a converged pool (mode off or 3). Where it went is
// remembered as pending entries (-kv-pending-ttl), hit or miss: the first request of a new
// prefix goes by -select, and the burst behind it follows.
func (s *Server) decide(st *reqState, d *decision, _ bool) {
	d.ep, d.slot, d.rank, d.decode, d.predicted = -1, -1, -1, -1, 0
	el := s.baseEligible(st, st.eligible, nil)
	if s.kv != nil {
		s.kv.route(st, el, d)
	}
	if d.ep < 0 {
		t0 := time.Now()
		s.decideFallback(st, d, el, nil)
		st.meter.stage(StageSelect, t0)
	}
	s.ranks.settle(d)
	st.meter.sent(st, d.slot)
}

// decideFallback picks by the rule's selector (-select). key overrides the
// request-derived CHWBL key (pass-through paths hash their path).
func (s *Server) decideFallback(st *reqState, d *decision, el shard.Mask, key []byte) {
	c := &st.cand
	*c = route.Candidates{Eligible: el}
	if s.cfg.Select.Kind == SelectCHWBL {
		if key != nil {
			c.Key = xxh3.Hash(key)
		} else {
			c.Key = s.chwblKey(st)
		}
	}
	d.ep = s.fallback.Select(c, nil)
	if !d.route.IsMiss() {
		d.route = s.fallbackRoute
	}
}

// chwblKey is the content-affinity key: model (LoRA adapters are served under their own
// names) plus the first system message (chat) or the prompt's first bytes, falling
// back to the first user message.
func (s *Server) chwblKey(st *reqState) uint64 {
	b := st.body
	buf := st.text[:0]
	buf = append(buf, st.oa.Value[openai.FModel].Bytes(b)...)
	buf = append(buf, 0)
	var content []byte
	if st.oa.Value[openai.FMessages].Present() {
		msgs := st.oa.Value[openai.FMessages].Bytes(b)
		content = openai.MessageContent(msgs, "system")
		if content == nil {
			content = openai.MessageContent(msgs, "user")
		}
	} else {
		content = st.oa.Value[openai.FPrompt].Bytes(b)
	}
	if len(content) > s.cfg.Select.CHWBLPrefixBytes {
		content = content[:s.cfg.Select.CHWBLPrefixBytes]
	}
	buf = append(buf, content...)
	st.text = buf
	return xxh3.Hash(buf)
}
