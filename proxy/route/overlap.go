package route

import "github.com/kvgate/kvgate/proxy/balance"

// Overlap is the argmax policy (-kv-policy overlap): the endpoint holding the most of the
// prompt wins, unless one more request puts it over the bounded-load cap
// ceil((1+LoadFactor) x mean in-flight); then the next-best holder of a deep enough
// prefix under the cap wins. Ties go to the lower endpoint index, as shard.Score ranks.
type Overlap struct {
	Loads      *balance.Loads
	LoadFactor float64
}

func (o *Overlap) Name() string { return "overlap" }

func (o *Overlap) Select(c *Candidates, obs Observer) int {
	if obs != nil {
		for i := range c.Matched {
			if c.Eligible.Has(i) {
				obs.Endpoint(i, Terms{Matched: c.Matched[i], InFlight: o.Loads.Get(i), Source: "kvgate"})
			}
		}
	}
	bound := o.Loads.Bound(c.Eligible, o.LoadFactor)
	if o.Loads.Under(c.Best, bound) {
		return c.Best
	}
	winner := -1
	for i, m := range c.Matched {
		if i == c.Best || !c.Eligible.Has(i) || m == 0 || m < c.MinBlocks || !o.Loads.Under(i, bound) {
			continue
		}
		if winner < 0 || m > c.Matched[winner] {
			winner = i
		}
	}
	return winner
}
