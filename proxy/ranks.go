package proxy

import (
	"strconv"
	"time"

	"github.com/cloudwego/hertz/pkg/protocol"

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
// These cands slots are the routing candidates. When lower tiers are weighed (-kv-tier-weight-*),
// each candidate s also has a CPU slot cpu+s and a storage slot sto+s, after them.
type rankLayout struct {
	cands    int     // candidate slots: (endpoint, rank)
	cpu, sto int     // first CPU / storage tier slot; -1: the tier is not indexed
	ep       []int32 // slot -> endpoint (tier slots too)
	rank     []int32 // slot -> rank (tier slots too)
	dp       []int32 // endpoint -> ranks
	extra    []int32 // endpoint -> the slot of its rank 1 (ranks r >= 1 are extra[i]+r-1)
	ranked   bool    // some endpoint has more than one rank
	tiered   bool    // a lower tier is indexed
}

// newRankLayout lays out eps; cpuTier and storageTier index those tiers in slots of
// their own.
func newRankLayout(eps []EndpointSpec, cpuTier, storageTier bool) *rankLayout {
	n := len(eps)
	l := &rankLayout{dp: make([]int32, n), extra: make([]int32, n), cpu: -1, sto: -1}
	cands := n
	for i, e := range eps {
		l.dp[i] = int32(max(e.DP, 1))
		l.extra[i] = int32(cands)
		cands += int(l.dp[i]) - 1
	}
	l.cands = cands
	total := cands
	if cpuTier {
		l.cpu, total = total, total+cands
	}
	if storageTier {
		l.sto, total = total, total+cands
	}
	l.tiered = cpuTier || storageTier
	l.ep, l.rank = make([]int32, total), make([]int32, total)
	for i := range eps {
		for r := int32(0); r < l.dp[i]; r++ {
			s := l.slot(i, int(r))
			l.ep[s], l.rank[s] = int32(i), r
			for _, base := range [...]int{l.cpu, l.sto} {
				if base >= 0 {
					l.ep[base+s], l.rank[base+s] = int32(i), r
				}
			}
			if l.dp[i] > 1 {
				l.ranked = true
			}
		}
	}
	return l
}

// labels are the candidates' names on /debug/explain for the endpoints eps (one per
// slot of the fleet's table): the endpoint's name, "name#r" for rank r of a dp > 1 one.
func (l *rankLayout) labels(eps []*endpoint) []string {
	out := make([]string, l.cands)
	for s := range out {
		i := l.ep[s]
		out[s] = eps[i].spec.Name
		if l.dp[i] > 1 {
			out[s] += "#" + strconv.Itoa(int(l.rank[s]))
		}
	}
	return out
}

// slots is the number of inventory slots (candidates and tier slots).
func (l *rankLayout) slots() int { return len(l.ep) }

// tierSlots are the CPU and storage slots of endpoint i's ranks, in rank order (nil for
// a tier not indexed): ingest.EndpointConfig.CPUSlots, StorageSlots.
func (l *rankLayout) tierSlots(i int) (cpu, sto []int) {
	for r := 0; r < int(l.dp[i]); r++ {
		s := l.slot(i, r)
		if l.cpu >= 0 {
			cpu = append(cpu, l.cpu+s)
		}
		if l.sto >= 0 {
			sto = append(sto, l.sto+s)
		}
	}
	return cpu, sto
}

// foldTiers turns per-slot scores into each candidate's match over every tier
// (matched: the deepest tier's, as an engine loads lower-tier blocks past its GPU ones)
// and how many of those blocks only the CPU (cpu) or only storage (sto) holds. Engines
// hold prefixes, so the GPU's blocks come first, then the CPU's beyond them, then
// storage's.
func (l *rankLayout) foldTiers(scores, matched, cpu, sto []int32) {
	for s := 0; s < l.cands; s++ {
		g, c, d := scores[s], int32(0), int32(0)
		if l.cpu >= 0 {
			c = scores[l.cpu+s]
		}
		if l.sto >= 0 {
			d = scores[l.sto+s]
		}
		top := max(g, c)
		cpu[s], sto[s] = top-g, max(d, top)-top
		matched[s] = max(top, d)
	}
}

// reported is candidate s's match on any tier, from the engines' reports alone.
func (l *rankLayout) reported(scores []int32, s int) int32 {
	m := scores[s]
	if l.cpu >= 0 {
		m = max(m, scores[l.cpu+s])
	}
	if l.sto >= 0 {
		m = max(m, scores[l.sto+s])
	}
	return m
}

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

// allSlots are every inventory slot of endpoint i: its ranks' and their lower tiers'.
func (l *rankLayout) allSlots(i int) []int {
	out := append([]int{i}, l.rankSlots(i)...)
	cpu, sto := l.tierSlots(i)
	return append(append(out, cpu...), sto...)
}

// expand fills dst with the slots of the endpoints set in el and returns it; without data
// parallelism it returns el itself.
func (l *rankLayout) expand(el, dst shard.Mask) shard.Mask {
	if !l.ranked && !l.tiered {
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

// hintRank names d's data-parallel rank to the engine (X-Data-Parallel-Rank), when KV
// routing chose one; otherwise the request goes as the client sent it.
func hintRank(req *protocol.Request, d *decision) {
	if d.rank >= 0 {
		req.Header.Set(hdrDPRank, strconv.Itoa(d.rank))
	}
}
