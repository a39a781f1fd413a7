package proxy

import "time"

// decisionMeter is where a routing decision's counters and records go. Traffic decides
// with the server's meter; /debug/explain decides through the same code with a nil
// meter, so nothing is counted and nothing is remembered (no prefix-trie record), and its
// route.Observer records each endpoint's terms instead. Every method is a no-op on nil.
type decisionMeter struct {
	m    *proxyMetrics
	kv   *kvRouter
	trie *prefixTrie
}

func (dm *decisionMeter) miss(r Route) {
	if dm != nil {
		dm.m.misses[r].Inc()
	}
}

func (dm *decisionMeter) unknownModel() {
	if dm != nil {
		dm.m.unknownMdl.Inc()
	}
}

func (dm *decisionMeter) stage(s Stage, t0 time.Time) {
	if dm != nil {
		dm.m.stage[s].UpdateDuration(t0)
	}
}

func (dm *decisionMeter) hit(ep int) {
	if dm != nil {
		dm.m.hits[ep].Inc()
	}
}

func (dm *decisionMeter) nextBest() {
	if dm != nil {
		dm.m.nextBest.Inc()
	}
}

func (dm *decisionMeter) affinity() {
	if dm != nil {
		dm.m.affinity.Inc()
	}
}

// sent remembers that the request's prompt went to inventory slot sl (an endpoint, or
// one data-parallel rank of it) in the prefix trie or mode 3's pending entries, so
// requests sharing its prefix follow it before the engine reports it. sl < 0: no rank
// was chosen, nothing to remember.
func (dm *decisionMeter) sent(st *reqState, sl int) {
	if dm != nil && dm.trie != nil && sl >= 0 {
		dm.kv.trieRecord(st, sl)
	}
}

// prompt counts a decided prompt's blocks in the hot-prefix sketch, after the decision so
// a request never counts toward its own prefix's popularity.
func (dm *decisionMeter) prompt(blocks []uint64) {
	if dm != nil && dm.kv != nil && dm.kv.popular != nil {
		dm.kv.popular.Record(blocks, time.Now())
	}
}
