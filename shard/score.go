package shard

import (
	"math/bits"
	"sync/atomic"
)

// Score scores a prompt's key chain against every eligible endpoint.
//
// It zeroes scores[:Endpoints()] and writes, for each endpoint set in eligible, the
// number of keys it holds (Overlap) or the length of the leading run of keys it holds
// (Prefix; any other mode counts as Overlap). best and second are the eligible endpoints
// with the highest and next-highest score, ties to the lowest index, -1 when there is
// none; an eligible endpoint with score 0 still ranks, so callers test scores[best] > 0
// for a hit. Endpoints at or beyond len(scores), and bits of eligible beyond
// Endpoints(), count as not eligible. Lock-free and allocation-free.
func (inv *Inventory) Score(keys []uint64, eligible Mask, mode Mode, scores []int32) (best, second int) {
	n := min(inv.endpoints, len(scores))
	scores = scores[:n]
	clear(scores)
	if n == 0 {
		return -1, -1
	}
	var e [maxWords]uint64
	words := min(len(eligible), (n+63)/64)
	anyElig := uint64(0)
	for w := 0; w < words; w++ {
		e[w] = eligible[w] & lowBits(n-w*64)
		anyElig |= e[w]
	}
	if anyElig == 0 {
		return -1, -1
	}
	switch {
	case len(keys) == 0:
	case inv.words == 1 && mode == Prefix:
		inv.prefix1(keys, e[0], scores)
	case inv.words == 1:
		inv.overlap1(keys, e[0], scores)
	case mode == Prefix:
		inv.prefixWide(keys, &e, words, scores)
	default:
		inv.overlapWide(keys, &e, words, scores)
	}
	return rank(&e, words, scores)
}

// rank returns the eligible endpoints with the highest and next-highest score; walking
// indexes upward with strict comparisons gives ties to the lowest index.
func rank(e *[maxWords]uint64, words int, scores []int32) (best, second int) {
	best, second = -1, -1
	bs, ss := int32(-1), int32(-1)
	for w := 0; w < words; w++ {
		for m := e[w]; m != 0; m &= m - 1 {
			i := w*64 + bits.TrailingZeros64(m)
			switch sc := scores[i]; {
			case sc > bs:
				second, ss = best, bs
				best, bs = i, sc
			case sc > ss:
				second, ss = i, sc
			}
		}
	}
	return best, second
}

// overlap1 is the <= 64-endpoint overlap loop: one probe per key, then a popcount walk
// over the eligible bits the key's mask holds.
func (inv *Inventory) overlap1(keys []uint64, e uint64, scores []int32) {
	var tabs [scoreBatch]*table
	var homes [scoreBatch]uint64
	for len(keys) > 0 {
		n := inv.locate(keys, &tabs, &homes)
		for i, k := range keys[:n] {
			for m := tabs[i].lookup(k, homes[i]) & e; m != 0; m &= m - 1 {
				scores[bits.TrailingZeros64(m)]++
			}
		}
		keys = keys[n:]
	}
}

// scoreBatch is how many keys Score locates before probing any of them.
const scoreBatch = 8

// locate finds the table and home bucket of up to scoreBatch keys and touches each home
// bucket. The touches do not depend on one another, so the CPU has all their cache
// misses in flight at once instead of one per probe (memory-level parallelism; Go has no
// prefetch intrinsic, and a load whose result is folded into a sink is the portable
// equivalent).
func (inv *Inventory) locate(keys []uint64, tabs *[scoreBatch]*table, homes *[scoreBatch]uint64) int {
	n := min(len(keys), scoreBatch)
	sink := uint64(0)
	for i, k := range keys[:n] {
		h := mix(k)
		t := inv.tabs[h>>inv.shift].Load()
		b := t.home(h, inv.shardBits)
		tabs[i], homes[i] = t, b
		sink |= atomic.LoadUint64(&t.buckets[b].keys[0])
	}
	locateSink.Store(sink)
	return n
}

// prefix1 is the <= 64-endpoint prefix loop: a running AND of masks; an endpoint's score
// is the index of the first key it lacks, and the walk stops once no endpoint is left.
func (inv *Inventory) prefix1(keys []uint64, run uint64, scores []int32) {
	var tabs [scoreBatch]*table
	var homes [scoreBatch]uint64
	for base := 0; base < len(keys); {
		n := inv.locate(keys[base:], &tabs, &homes)
		for i, k := range keys[base : base+n] {
			m := tabs[i].lookup(k, homes[i]) & run
			for gone := run &^ m; gone != 0; gone &= gone - 1 {
				scores[bits.TrailingZeros64(gone)] = int32(base + i)
			}
			if run = m; run == 0 {
				return
			}
		}
		base += n
	}
	for ; run != 0; run &= run - 1 {
		scores[bits.TrailingZeros64(run)] = int32(len(keys))
	}
}

func (inv *Inventory) overlapWide(keys []uint64, e *[maxWords]uint64, words int, scores []int32) {
	for _, k := range keys {
		h := mix(k)
		t := inv.tabs[h>>inv.shift].Load()
		slot, ok := t.find(k, t.home(h, inv.shardBits))
		if !ok {
			continue
		}
		for w := 0; w < words; w++ {
			for m := atomic.LoadUint64(t.word(slot, w)) & e[w]; m != 0; m &= m - 1 {
				scores[w*64+bits.TrailingZeros64(m)]++
			}
		}
	}
}

func (inv *Inventory) prefixWide(keys []uint64, e *[maxWords]uint64, words int, scores []int32) {
	run := *e
	for j, k := range keys {
		h := mix(k)
		t := inv.tabs[h>>inv.shift].Load()
		slot, ok := t.find(k, t.home(h, inv.shardBits))
		left := uint64(0)
		for w := 0; w < words; w++ {
			m := uint64(0)
			if ok {
				m = atomic.LoadUint64(t.word(slot, w)) & run[w]
			}
			for gone := run[w] &^ m; gone != 0; gone &= gone - 1 {
				scores[w*64+bits.TrailingZeros64(gone)] = int32(j)
			}
			run[w] = m
			left |= m
		}
		if left == 0 {
			return
		}
	}
	for w := 0; w < words; w++ {
		for m := run[w]; m != 0; m &= m - 1 {
			scores[w*64+bits.TrailingZeros64(m)] = int32(len(keys))
		}
	}
}

// locateSink keeps the compiler from dropping locate's touches.
var locateSink atomic.Uint64
