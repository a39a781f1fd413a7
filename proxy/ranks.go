package proxy

import (
	"strconv"
	"time"

	"github.com/kvgate/kvgate/proxy/route"

	"github.com/kvgate/kvgate/shard"
)

// hdrDPRank is the data-parallel rank hint vLLM and SGLang read from a request: vLLM's
// OpenAI server passes X-data-parallel-rank to its DP load balancer, which sends the
// request to that engine core instead of choosing one; SGLang's OpenAI server reads
// X-Data-Parallel-Rank (over the body's routed_dp_rank) and its DP controller sends it to
// that rank's scheduler. HTTP header names are case-insensitive. docs/CONTRACTS.md,
// "Data-parallel ranks".
const hdrDPRank = "X-Data-Parallel-Rank"

// rankLayout places every (endpoint, data-parallel rank) in its own inventory slot: a
// rank is an engine core with its own KV cache, so KV-Exact scores, queues and routes
// each rank apart. Rank 0 of endpoint i is slot i, so a rule without data parallelism has
// slot == endpoint everywhere; ranks 1.. of all endpoints follow, in endpoint order.
type rankLayout struct {
	n      int      // endpoints
	ep     []int32  // slot -> endpoint
	rank   []int32  // slot -> rank
	dp     []int32  // endpoint -> ranks
	extra  []int32  // endpoint -> the slot of its rank 1 (ranks r >= 1 are extra[i]+r-1)
	labels []string // slot -> its name on /debug/explain: the endpoint's, "name#r" for a rank
	ranked bool     // some endpoint has more than one rank
}

func newRankLayout(eps []EndpointSpec) *rankLayout {
	n := len(eps)
	l := &rankLayout{n: n, dp: make([]int32, n), extra: make([]int32, n)}
	total := n
	for i, e := range eps {
		l.dp[i] = int32(max(e.DP, 1))
		l.extra[i] = int32(total)
		total += int(l.dp[i]) - 1
	}
	l.ep, l.rank, l.labels = make([]int32, total), make([]int32, total), make([]string, total)
	for i, e := range eps {
		for r := int32(0); r < l.dp[i]; r++ {
			s := l.slot(i, int(r))
			l.ep[s], l.rank[s] = int32(i), r
			l.labels[s] = e.Name
			if l.dp[i] > 1 {
				l.ranked = true
				l.labels[s] = e.Name + "#" + strconv.Itoa(int(r))
			}
		}
	}
	return l
}

// slots is the number of inventory slots.
func (l *rankLayout) slots() int { return len(l.ep) }

// slot is the inventory slot of endpoint i's rank r.
func (l *rankLayout) slot(i, r int) int {
	if r == 0 {
		return i
	}
	return int(l.extra[i]) + r - 1
}

// rankSlots are the slots of endpoint i's ranks 1.. (ingest.EndpointConfig.RankSlots).
func (l *rankLayout) rankSlots(i int) []int {
	if l.dp[i] <= 1 {
		return nil
	}
	out := make([]int, l.dp[i]-1)
	for r := range out {
		out[r] = l.slot(i, r+1)
	}
	return out
}

// expand fills dst with the slots of the endpoints set in el and returns it; without data
// parallelism it returns el itself.
func (l *rankLayout) expand(el, dst shard.Mask) shard.Mask {
	if !l.ranked {
		return el
	}
	clear(dst)
	for s, i := range l.ep {
		if el.Has(int(i)) {
			dst.Set(s)
		}
	}
	return dst
}

// rankOf is the rank to hint for slot s: -1 for an endpoint without data parallelism.
func (l *rankLayout) rankOf(s int) int {
	if l.dp[l.ep[s]] <= 1 {
		return -1
	}
	return int(l.rank[s])
}

// settle gives a decision made without a rank (a selector's, affinity's) the slot of its
// endpoint when that endpoint has one rank; a data-parallel endpoint's slot stays -1 (its
// own balancer picks the rank, so kvgate cannot say which queue the request joins).
func (l *rankLayout) settle(d *decision) {
	if d.slot < 0 && d.ep >= 0 && l.dp[d.ep] <= 1 {
		d.slot = d.ep
	}
}

// observeRanks feeds endpoint i's engine report to the per-slot queues the policy reads
// when ranks are routed apart: an endpoint of one rank is its slot; a data-parallel one
// needs a report per rank (vLLM's engine label), else its ranks keep kvgate's own
// accounting (load_source "kvgate" on /debug/explain). Without data parallelism the
// policy reads the server's queues, which the scrape fed already.
func (k *kvRouter) observeRanks(i int, whole route.Report, ranks []route.Report) {
	l := k.ranks
	if !l.ranked {
		return
	}
	now := time.Now()
	if l.dp[i] <= 1 {
		k.slotQueues.Observe(i, whole, k.slotLoads.Get(i), now)
		return
	}
	if len(ranks) != int(l.dp[i]) {
		return
	}
	for r := range ranks {
		sl := l.slot(i, r)
		k.slotQueues.Observe(sl, ranks[r], k.slotLoads.Get(sl), now)
	}
}

// rankInventory is endpoint i's ranks for /debug/inventory (nil with one rank).
func (k *kvRouter) rankInventory(i int) []rankInventory {
	l := k.ranks
	if l.dp[i] <= 1 {
		return nil
	}
	now := time.Now()
	out := make([]rankInventory, l.dp[i])
	for r := range out {
		sl := l.slot(i, r)
		v := k.slotQueues.View(sl, now)
		out[r] = rankInventory{Rank: r, Keys: k.inv.Count(sl), InFlight: k.slotLoads.Get(sl), Load: &v}
	}
	return out
}
