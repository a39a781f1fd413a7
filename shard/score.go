package shard

import (
	"math/bits"
	"unsafe"
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
		inv.prefixSparse(keys, &e, words, scores)
	default:
		inv.overlapSparse(keys, &e, words, scores)
	}
	return rank(&e, words, scores)
}

// rank returns the eligible endpoints with the highest and next-highest score, ties to
// the lowest index. Only eligible endpoints score above 0 (the loops count nothing else
// and Score zeroed the rest), so the walk looks at nonzero scores alone, passing eight
// zeros at a time (over a fleet nearly every endpoint scores 0), and when fewer than two
// scored, the lowest eligible endpoints of score 0 follow, as an upward walk over every
// eligible endpoint with strict comparisons would rank them.
func rank(e *[maxWords]uint64, words int, scores []int32) (best, second int) {
	best, second = -1, -1
	bs, ss := int32(-1), int32(-1)
	for i := 0; i < len(scores); i++ {
		if i&7 == 0 && i+8 <= len(scores) {
			if g := scores[i : i+8 : i+8]; g[0]|g[1]|g[2]|g[3]|g[4]|g[5]|g[6]|g[7] == 0 {
				i += 7
				continue
			}
		}
		switch sc := scores[i]; {
		case sc == 0:
		case sc > bs:
			second, ss = best, bs
			best, bs = i, sc
		case sc > ss:
			second, ss = i, sc
		}
	}
	for w := 0; w < words && second < 0; w++ {
		for m := e[w]; m != 0 && second < 0; m &= m - 1 {
			switch i := w*64 + bits.TrailingZeros64(m); {
			case scores[i] != 0:
			case best < 0:
				best = i
			default:
				second = i
			}
		}
	}
	return best, second
}

// overlap1 is the <= 64-endpoint overlap loop: one probe per key, then a popcount walk
// over the eligible bits the key's mask holds.
func (inv *Inventory) overlap1(keys []uint64, e uint64, scores []int32) {
	var w probeWindow
	w.prime(inv, keys)
	for i, k := range keys {
		t, b := w.next(inv, keys, i)
		for m := t.lookup(k, b) & e; m != 0; m &= m - 1 {
			scores[bits.TrailingZeros64(m)]++
		}
	}
}

// prefix1 is the <= 64-endpoint prefix loop: a running AND of masks; an endpoint's score
// is the index of the first key it lacks, and the walk stops once no endpoint is left.
func (inv *Inventory) prefix1(keys []uint64, run uint64, scores []int32) {
	var w probeWindow
	w.prime(inv, keys)
	for j, k := range keys {
		t, b := w.next(inv, keys, j)
		m := t.lookup(k, b) & run
		for gone := run &^ m; gone != 0; gone &= gone - 1 {
			scores[bits.TrailingZeros64(gone)] = int32(j)
		}
		if run = m; run == 0 {
			return
		}
	}
	for ; run != 0; run &= run - 1 {
		scores[bits.TrailingZeros64(run)] = int32(len(keys))
	}
}

// scoreBatch is how many keys Score locates and prefetches at a time.
const scoreBatch = 16

// probeWindow keeps the table and home bucket of up to two batches of scoreBatch keys:
// the batch being probed and the next one, whose home buckets were prefetched when the
// batch before it began. The prefetches do not depend on one another or on the probes,
// so the CPU keeps up to scoreBatch cache misses in flight instead of one per probe
// (memory-level parallelism), and each has a batch of probes' time to arrive. Go has no
// prefetch intrinsic: prefetch_amd64.s issues the instruction (a dropped load, the
// portable form, blocks retirement until its line arrives, so a window of them stalls
// the probes behind it), one call per batch (see prefetchLines); it writes nothing
// shared, so concurrent Score calls do not contend.
type probeWindow struct {
	tabs  [2 * scoreBatch]*table
	homes [2 * scoreBatch]uint64
}

// locate fills the window for keys[from:from+scoreBatch] and prefetches their home buckets.
func (w *probeWindow) locate(inv *Inventory, keys []uint64, from int) {
	var lines [scoreBatch]unsafe.Pointer
	n := 0
	for i := from; i < len(keys) && n < scoreBatch; i, n = i+1, n+1 {
		h := mix(keys[i])
		t := inv.tabs[h>>inv.shift].Load()
		b := t.home(h, inv.shardBits)
		w.tabs[i%(2*scoreBatch)], w.homes[i%(2*scoreBatch)] = t, b
		lines[n] = unsafe.Pointer(&t.buckets[b])
	}
	prefetchLines(&lines[0], n)
}

func (w *probeWindow) prime(inv *Inventory, keys []uint64) { w.locate(inv, keys, 0) }

// next returns key i's table and home bucket; the first key of a batch starts the
// next batch's prefetches.
func (w *probeWindow) next(inv *Inventory, keys []uint64, i int) (*table, uint64) {
	if i%scoreBatch == 0 && i+scoreBatch < len(keys) {
		w.locate(inv, keys, i+scoreBatch)
	}
	return w.tabs[i%(2*scoreBatch)], w.homes[i%(2*scoreBatch)]
}

// overlapSparse is the overlap loop of rules of more than 64 endpoints (sparse sets):
// an inline set costs one eligibility test and increment per id, a spilled one the
// popcount walk over its bitmask. A spilled set's block is a second cache miss that
// depends on the first, so instead of waiting for it the loop prefetches it and scores
// the set a few spilled keys later (deferredSpills): overlap is a sum, order-free. A key
// missing from its full home bucket is the same case (deferredRuns).
func (inv *Inventory) overlapSparse(keys []uint64, e *[maxWords]uint64, words int, scores []int32) {
	var pw probeWindow
	var later deferredSpills
	var past deferredRuns
	pw.prime(inv, keys)
	for i, k := range keys {
		t, b := pw.next(inv, keys, i)
		var set uint64
		var slot int
		if k == 0 {
			set, slot = t.probe(k, b)
		} else if set, slot = t.probeHome(k, b); slot == pastSlot {
			if past.add(t, k, b) {
				past.score(&later, e, words, scores)
			}
			continue
		}
		if isSpill(set) || slot == zeroSlot {
			later.add(t, k, slot, set, e, words, scores)
			continue
		}
		countInline(set, e, scores)
	}
	past.score(&later, e, words, scores)
	later.score(e, words, scores)
}

// deferredRuns holds the keys overlapSparse found missing from their home bucket, which
// was full: whether such a key lies further on takes the bucket's overflow bit and then
// the next bucket, two more cache misses that depend on the first (a prompt's uncached
// tail is mostly such misses at a fleet's load). Instead of waiting for them the loop
// prefetches both and resolves the key a few such keys later.
type deferredRuns struct {
	n     int
	tabs  [runBatch]*table
	keys  [runBatch]uint64
	homes [runBatch]uint64
}

// runBatch is how many such keys overlapSparse keeps in flight.
const runBatch = 8

// add queues key, missing from its full home bucket b of t, prefetching the bucket's
// overflow word and the next bucket, and reports whether the queue is full.
func (d *deferredRuns) add(t *table, key, b uint64) bool {
	next := b + 1
	if next == t.nb {
		next = 0
	}
	lines := [2]unsafe.Pointer{unsafe.Pointer(&t.ovf[b/64]), unsafe.Pointer(&t.buckets[next])}
	prefetchLines(&lines[0], len(lines))
	i := d.n & (runBatch - 1)
	d.tabs[i], d.keys[i], d.homes[i] = t, key, b
	d.n++
	return d.n == runBatch
}

// score walks on the queued keys' probe runs past their home buckets, counts what they
// find into scores (a spilled set through later) and empties the queue.
func (d *deferredRuns) score(later *deferredSpills, e *[maxWords]uint64, words int, scores []int32) {
	for i := 0; i < d.n; i++ {
		t, k, b := d.tabs[i&(runBatch-1)], d.keys[i&(runBatch-1)], d.homes[i&(runBatch-1)]
		if !t.overflowed(b) {
			continue // no insert passed the home bucket: the key is absent
		}
		if b++; b == t.nb {
			b = 0
		}
		if set, slot := t.probe(k, b); isSpill(set) {
			later.add(t, k, slot, set, e, words, scores)
		} else {
			countInline(set, e, scores)
		}
	}
	*d = deferredRuns{}
}

// spillBatch is how many spilled sets overlapSparse keeps in flight.
const spillBatch = 8

// deferredSpills holds the spilled sets overlapSparse found and prefetched but has not
// scored yet. It keeps each set's table, so a table republished meanwhile stays alive.
type deferredSpills struct {
	n     int
	tabs  [spillBatch]*table
	keys  [spillBatch]uint64
	slots [spillBatch]int
}

// add queues a spilled set (slot zeroSlot: key 0's mask), prefetching its block, and
// scores the queue into scores once it is full.
func (d *deferredSpills) add(t *table, key uint64, slot int, w uint64, e *[maxWords]uint64, words int, scores []int32) {
	if slot != zeroSlot {
		t.prefetchSpilled(w)
	}
	i := d.n & (spillBatch - 1)
	d.tabs[i], d.keys[i], d.slots[i] = t, key, slot
	if d.n++; d.n == spillBatch {
		d.score(e, words, scores)
	}
}

// countInline counts an inline set's eligible endpoints into scores.
func countInline(set uint64, e *[maxWords]uint64, scores []int32) {
	for ; set != 0; set >>= idBits {
		ep := int(set&idField) - 1
		if e[ep>>6&(maxWords-1)]&(1<<(uint(ep)&63)) != 0 {
			scores[ep]++
		}
	}
}

// score reads the queued sets (re-checked as sparseLookup does) into scores and empties
// the queue.
func (d *deferredSpills) score(e *[maxWords]uint64, words int, scores []int32) {
	var m [maxWords]uint64
	for i := 0; i < d.n; i++ {
		set, ok := d.tabs[i&(spillBatch-1)].spilledSet(d.keys[i&(spillBatch-1)], d.slots[i&(spillBatch-1)], &m)
		switch {
		case !ok:
		case !isSpill(set): // back inline since the probe
			countInline(set, e, scores)
		default:
			for w := 0; w < words; w++ {
				for x := m[w] & e[w]; x != 0; x &= x - 1 {
					scores[w*64+bits.TrailingZeros64(x)]++
				}
			}
		}
	}
	*d = deferredSpills{}
}

// prefixSparse is prefix1's running AND over sparse sets: an inline set becomes the
// words of the run it can keep (at most sparseIDs bits), a spilled one is ANDed whole.
func (inv *Inventory) prefixSparse(keys []uint64, e *[maxWords]uint64, words int, scores []int32) {
	run := *e
	var held [maxWords]uint64
	var pw probeWindow
	pw.prime(inv, keys)
	for j, k := range keys {
		t, b := pw.next(inv, keys, j)
		set, ok := t.sparseLookup(k, b, &held)
		if !isSpill(set) {
			clear(held[:words])
			if ok {
				orIDs(&held, set)
			}
		}
		left := uint64(0)
		for w := 0; w < words; w++ {
			m := uint64(0)
			if ok {
				m = held[w] & run[w]
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
