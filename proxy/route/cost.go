package route

import (
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/proxy/balance"
)

// Cost is the default KV-Exact policy (-kv-policy cost): each eligible endpoint is
// scored by the request's predicted time to first token there (Queues.Predict: the
// prefill queued ahead plus the request's uncached tokens at the endpoint's rate, after
// any wait for a batch slot) plus the delay its prefill adds to the requests still
// prefilling there, and the minimum wins. Cache overlap is a credit (fewer
// uncached tokens), not the whole decision: a short hot prefix no longer pulls every
// request onto one engine once its queue costs more than the prefill it saves.
// Blocks only a lower tier holds (host memory, storage) are not free: each token there
// costs its tier's weight of a prefill (Candidates.Uncached).
//
// Fair share: an endpoint may take no more than FairShare times the mean share of the
// recent prefill work (Queues.Work, the last ShareWindow or so) among the eligible
// endpoints, counting this request's prefill there: the bound of consistent hashing with
// bounded loads (Mirrokni, Thorup and Zadimoghaddam), over prefill seconds instead of
// requests. Within the bound the cheapest endpoint wins. An endpoint past it keeps the
// requests whose cached prefix there is private: one whose recent followers (Popularity)
// brought less prefill work, at this request's uncached length each, than a second copy
// of the prefix costs, such as a conversation's history that only its next turn reuses.
// Moving those would waste more work than it balances. It loses new prompts and those of
// a shared prefix whose followers outweigh its copy to the cheapest endpoint under the
// bound, which then holds the prefix too: a hot prefix gets a second holder instead of
// herding onto one engine. When no endpoint is within the bound the cheapest of all
// wins. FairShare 0 disables the bound.
//
// Ties: two predictions closer than one block's prefill at the faster endpoint's rate are
// within the model's resolution (it counts whole blocks), so they tie; ties go to the
// fewer requests in flight, then to a rotating start, never to endpoint order.
type Cost struct {
	Loads     *balance.Loads
	Queues    *Queues
	Popular   *Popularity // nil: every cached prefix counts as private
	FairShare float64
	rot       atomic.Uint64
}

// DefaultFairShare is the bounded-load factor kvgate's CHWBL uses too (1.25, the value
// the bounded-loads paper's deployments at Vimeo and in HAProxy's hash-balance-factor
// start from): an endpoint may run a quarter ahead of the fair share, no more.
const DefaultFairShare = 1.25

func (c *Cost) Name() string { return "cost" }

// pick is the running best of one class of candidates (within the bound, or all).
type pick struct {
	i         int
	ms, rate  float64
	load      int64
	blockSize int
	// reach is the highest cost that can still beat or tie the pick: ms plus the widest
	// band any candidate can have against it (the band narrows as the faster rate of the
	// two grows), so a candidate past it is turned away without computing its band.
	reach float64
}

// offer makes i the pick if it costs clearly less, or ties and has fewer in flight.
func (p *pick) offer(i int, t *Terms, load int64) {
	if p.i >= 0 {
		if t.Cost > p.reach { // most of a fleet: far costlier than the pick
			return
		}
		band := 1000 * float64(p.blockSize) / max(t.Rate, p.rate)
		switch {
		case t.Cost < p.ms-band:
		case t.Cost <= p.ms+band && load < p.load:
		default:
			return
		}
	}
	p.i, p.ms, p.load, p.rate = i, t.Cost, load, t.Rate
	p.reach = p.ms + 1000*float64(p.blockSize)/p.rate
}

func (c *Cost) Select(cd *Candidates, obs Observer) int {
	n := len(cd.Matched)
	if n == 0 {
		return -1
	}
	now := time.Now()
	var total float64
	eligible := 0
	for i := 0; i < n; i++ {
		if cd.Eligible.Has(i) {
			eligible++
			if c.FairShare > 0 {
				total += c.Queues.Work(i)
			}
		}
	}
	scale := 0.0
	if c.FairShare > 0 {
		scale = c.Queues.WorkScale(now)
	}
	start := rotatedStart(cd.Eligible, n, eligible, c.rot.Add(1))
	within, all := pick{i: -1, blockSize: cd.BlockSize}, pick{i: -1, blockSize: cd.BlockSize}
	var terms Terms
	for j := 0; j < n; j++ {
		i := start + j
		if i >= n {
			i -= n
		}
		if !cd.Eligible.Has(i) {
			continue
		}
		uncached := cd.Uncached(i)
		cached := 0 // tokens the endpoint holds on any tier, when deep enough to count
		if m := cd.Matched[i]; m >= cd.MinBlocks {
			cached = int(m) * cd.BlockSize
		}
		load := c.Loads.Get(i)
		t := &terms
		*t = Terms{}
		c.Queues.Predict(t, i, uncached, load, now)
		t.Matched = cd.Matched[i]
		if cd.CPU != nil {
			t.CPU, t.Storage = cd.CPU[i], cd.Storage[i]
		}
		t.GPUTokens = int(t.Matched-t.CPU-t.Storage) * cd.BlockSize
		t.CPUTokens, t.StorageTokens = int(t.CPU)*cd.BlockSize, int(t.Storage)*cd.BlockSize
		if scale > 0 {
			w := float64(uncached) / t.Rate * scale
			if after := total + w; after > 0 {
				t.Share = (c.Queues.Work(i) + w) / after
				t.OverShare = t.Share*float64(eligible) > c.FairShare
			}
			if c.Popular != nil && cached > 0 {
				t.Followers = c.Popular.Count(cd.Blocks, cached/cd.BlockSize)
			}
		}
		if obs != nil {
			obs.Endpoint(i, *t)
		}
		all.offer(i, t, load)
		// A cached prefix whose recent followers brought less work than copying it
		// elsewhere costs is private to this endpoint: it stays.
		private := cached > 0 && t.Followers*int64(uncached) < int64(cached)
		if !t.OverShare || private {
			within.offer(i, t, load)
		}
	}
	if within.i >= 0 {
		return within.i
	}
	return all.i
}
