package route

import "github.com/kvgate/kvgate/proxy/balance"

// RR is round-robin over the eligible endpoints (-select rr): what a request kvgate
// cannot key goes by, and every request when KV-Exact is off.
type RR struct{ RR *balance.RR }

func (r *RR) Name() string { return "rr" }

func (r *RR) Select(c *Candidates, _ Observer) int { return r.RR.Pick(c.Eligible) }

// CHWBL is consistent hashing with bounded loads over c.Key (-select chwbl): the key's
// endpoint on the ring unless one more request puts it over ceil((1+LoadFactor) x mean
// in-flight), then the next on the ring; round-robin when every endpoint is over its bound.
type CHWBL struct {
	Ring       *balance.Ring
	Loads      *balance.Loads
	LoadFactor float64
	RR         *balance.RR
}

func (h *CHWBL) Name() string { return "chwbl" }

func (h *CHWBL) Select(c *Candidates, _ Observer) int {
	if ep := h.Ring.Pick(c.Key, c.Eligible, h.Loads, h.LoadFactor); ep >= 0 {
		return ep
	}
	return h.RR.Pick(c.Eligible)
}
