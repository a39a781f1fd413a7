package route

import (
	"math"
	"math/bits"
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
	return c.selectAt(cd, obs, c.rot.Add(1), time.Now(), false)
}

// costRound is one Select's fleet-wide inputs: the time, the eligible count and the fair
// share's scale and total work. The total is summed when a candidate first needs it
// (summed): a candidate whose cached prefix is private competes whatever its share, so
// a decision a private holder wins clearly needs no pass over the fleet's work.
type costRound struct {
	now      time.Time
	eligible int
	scale    float64
	total    float64
	summed   bool
	observed bool // an Observer records every term, the share too
}

// sumWork sets r.total, the eligible candidates' recent work, once per round.
func (c *Cost) sumWork(cd *Candidates, r *costRound) {
	if r.summed {
		return
	}
	r.summed = true
	r.total = c.Queues.TotalWork(cd.Eligible, len(cd.Matched))
}

// terms fills t with candidate i's cost terms and returns its in-flight count and
// whether it may compete within the fair share (under it, or its cached prefix private).
func (c *Cost) terms(cd *Candidates, r *costRound, i int, t *Terms) (load int64, within bool) {
	uncached := cd.Uncached(i)
	cached := 0 // tokens the endpoint holds on any tier, when deep enough to count
	if m := cd.Matched[i]; m >= cd.MinBlocks {
		cached = int(m) * cd.BlockSize
	}
	load = c.Loads.Get(i)
	*t = Terms{}
	c.Queues.Predict(t, i, uncached, load, r.now)
	t.Matched = cd.Matched[i]
	if cd.CPU != nil {
		t.CPU, t.Storage = cd.CPU[i], cd.Storage[i]
	}
	t.GPUTokens = int(t.Matched-t.CPU-t.Storage) * cd.BlockSize
	t.CPUTokens, t.StorageTokens = int(t.CPU)*cd.BlockSize, int(t.Storage)*cd.BlockSize
	if r.scale > 0 && c.Popular != nil && cached > 0 {
		t.Followers = c.Popular.Count(cd.Blocks, cached/cd.BlockSize)
	}
	// A cached prefix whose recent followers brought less work than copying it
	// elsewhere costs is private to this endpoint: it stays.
	private := cached > 0 && t.Followers*int64(uncached) < int64(cached)
	if r.scale > 0 && (!private || r.observed) {
		c.sumWork(cd, r)
		w := float64(uncached) / t.Rate * r.scale
		if after := r.total + w; after > 0 {
			t.Share = (c.Queues.Work(i) + w) / after
			t.OverShare = t.Share*float64(r.eligible) > c.FairShare
		}
	}
	return load, !t.OverShare || private
}

// floor is a lower bound on candidate i's cost: its own prefill at its rate, queue and
// slot wait aside (Queues.Floor). Most of a fleet holds too little of the prompt to count:
// the whole prompt, without Uncached's arithmetic.
func (c *Cost) floor(cd *Candidates, i int) float64 {
	u := cd.Tokens
	if cd.Matched[i] >= cd.MinBlocks {
		u = cd.Uncached(i)
	}
	return c.Queues.Floor(i, u)
}

// pruneFrom is the fewest candidates selectAt bounds by their floors: at 8 the floor pass
// and the least-floor candidate's evaluation cost ~10% of a full scan that is needed
// anyway when a queue makes that candidate lose.
const pruneFrom = 32

// selectAt is Select on rotation turn at now; full forces the scan that evaluates every
// candidate (an Observer gets it too: it records every endpoint's terms).
//
// Why not always the full scan: over a fleet most candidates hold nothing of the prompt
// and cost a full prefill, far more than a holder; evaluating each (a dozen loads, three
// divisions) was most of a 1,024-endpoint decision. A candidate's floor (Queues.Floor: its
// prefill alone) is a lower bound on its cost that takes two loads and a division. When
// the candidate of the least floor competes within the fair share and its reach (its cost
// plus the widest band a candidate can tie it within) is below every other floor, no other
// candidate can beat or tie it: the scan would offer every one to a pick that is, or
// becomes, that candidate and turn it away, so it wins whatever the rotation (clearWinner).
// Otherwise the scan runs, passing over each candidate whose floor is past both picks'
// reach. Under pruneFrom candidates the full scan costs less than the floors.
func (c *Cost) selectAt(cd *Candidates, obs Observer, turn uint64, now time.Time, full bool) int {
	n := len(cd.Matched)
	if n == 0 {
		return -1
	}
	r := costRound{now: now, observed: obs != nil}
	for w, word := range cd.Eligible {
		if w<<6 >= n {
			break
		}
		if left := n - w<<6; left < 64 {
			word &= 1<<left - 1
		}
		r.eligible += bits.OnesCount64(word)
	}
	if c.FairShare > 0 {
		r.scale = c.Queues.WorkScale(now)
	}
	prune := obs == nil && !full && n >= pruneFrom
	var terms Terms
	if prune {
		if i := c.clearWinner(cd, &r, &terms); i >= 0 {
			return i
		}
	}
	start := rotatedStart(cd.Eligible, n, r.eligible, turn)
	within, all := pick{i: -1, blockSize: cd.BlockSize}, pick{i: -1, blockSize: cd.BlockSize}
	for j := 0; j < n; j++ {
		i := start + j
		if i >= n {
			i -= n
		}
		if !cd.Eligible.Has(i) {
			continue
		}
		// A candidate whose floor is past both picks' reach costs more than either can
		// be beaten by (Cost >= floor: the same arithmetic, every other term >= 0).
		if prune && within.i >= 0 && all.i >= 0 {
			if f := c.floor(cd, i); f > within.reach && f > all.reach {
				continue
			}
		}
		t := &terms
		load, in := c.terms(cd, &r, i, t)
		if obs != nil {
			obs.Endpoint(i, *t)
		}
		all.offer(i, t, load)
		if in {
			within.offer(i, t, load)
		}
	}
	if within.i >= 0 {
		return within.i
	}
	return all.i
}

// clearWinner returns the candidate that wins whatever the rotation when the floors show
// one: the candidate of the least floor, competing within the fair share, whose reach is
// below every other candidate's floor. -1 when they do not.
//
// Why holders first: a candidate that holds less than MinBlocks of the prompt has the
// whole prompt's floor, and Queues.FloorAll bounds all of those at once, so when the
// least holder's floor is below that bound only the holders' floors are needed (a few
// over a fleet, found in one pass over Matched) instead of every candidate's. When the
// bound does not settle it (no holder, a shallow one, a fleet whose least line is far
// below most endpoints'), every candidate's floor is taken, as the scan would.
func (c *Cost) clearWinner(cd *Candidates, r *costRound, t *Terms) int {
	if cd.MinBlocks > 0 {
		low, low2, lowAt := math.Inf(1), math.Inf(1), -1
		for i := cd.nextHolder(0); i >= 0; i = cd.nextHolder(i + 1) {
			switch f := c.Queues.Floor(i, cd.Uncached(i)); {
			case f < low:
				low2, low, lowAt = low, f, i
			case f < low2:
				low2 = f
			}
		}
		if rest := c.Queues.FloorAll(cd.Tokens); lowAt >= 0 && low < rest {
			// lowAt is the least floor of all; every other floor is >= min(low2, rest).
			reach, in := c.reach(cd, r, t, lowAt)
			switch {
			case in && reach < min(low2, rest):
				return lowAt
			case !in || reach >= low2:
				return -1 // every candidate's floors would not clear it either
			}
			// Only the bound on the non-holders was in the way: take their floors.
		}
	}
	low, low2, lowAt := math.Inf(1), math.Inf(1), -1
	for w, word := range cd.Eligible {
		for ; word != 0; word &= word - 1 {
			i := w<<6 | bits.TrailingZeros64(word)
			if i >= len(cd.Matched) {
				break
			}
			switch f := c.floor(cd, i); {
			case f < low:
				low2, low, lowAt = low, f, i
			case f < low2:
				low2 = f
			}
		}
	}
	if lowAt >= 0 {
		if reach, in := c.reach(cd, r, t, lowAt); in && reach < low2 {
			return lowAt
		}
	}
	return -1
}

// nextHolder is the first eligible candidate from i on that holds at least MinBlocks
// (>= 1) of the prompt, or -1. Over a fleet nearly every candidate holds nothing: the
// loop passes eight zero counts at a time.
func (c *Candidates) nextHolder(i int) int {
	m, least := c.Matched, c.MinBlocks
	for ; i < len(m); i++ {
		if i&7 == 0 && i+8 <= len(m) {
			if g := m[i : i+8 : i+8]; g[0]|g[1]|g[2]|g[3]|g[4]|g[5]|g[6]|g[7] == 0 {
				i += 7
				continue
			}
		}
		if m[i] >= least && c.Eligible.Has(i) {
			return i
		}
	}
	return -1
}

// reach fills t with candidate i's terms and returns its reach, the highest cost that
// can still beat or tie it (its cost plus the widest band a tie can have against it),
// raised by a margin of 1e-12 that keeps float rounding of the comparisons with floors
// on the safe side, and whether it competes within the fair share.
func (c *Cost) reach(cd *Candidates, r *costRound, t *Terms, i int) (float64, bool) {
	_, in := c.terms(cd, r, i, t)
	return (t.Cost + 1000*float64(cd.BlockSize)/t.Rate) * (1 + 1e-12), in
}
