package shard

// Background compaction. Under steady churn (as many removes as stores) a shard's table
// fills with tombstones and is rebuilt every second or so at fleet sizes. A rebuild under
// the shard's mutex stalls every writer of the shard for the copy, 7 ms for 390K keys
// alone and 30-85 ms measured inside a busy kvgate at 100M entries (the copying goroutine
// is descheduled while it holds the lock), which was the event lag's p99 there
// (bench/RESULTS.md, session 8). So a table nearing its trigger is compacted by a
// goroutine of its own while writers go on writing the published table:
//
//  1. under the mutex: note the table being copied and start a dirty log;
//  2. off the mutex: make the new table, fault it in, and copy every live key of the
//     published table into it, reading it as lock-free readers do (each key re-read
//     after its set, so a slot another key took meanwhile is not copied under the old key);
//  3. under the mutex: give every key the log names the set the published table holds
//     for it now (the writers' own view), then publish the new table.
//
// Writers log each key whose set they change while a compaction copies (noteDirty), so a
// key missing from the log held one set through the whole copy, and the copy read that
// set. A key in the log may have been copied torn or not at all; step 3 makes it exact.
// A sweep of the whole table (ClearEndpoint) marks the compaction stale rather than log
// every key; a stale compaction, or one whose table was replaced meanwhile (a rebuild
// under the mutex when writers ran out of room, a shrink, ClearAll), is dropped.

import (
	"runtime"
	"sync/atomic"
)

// compaction is one background compaction of a shard's table; fields under the shard's
// mutex.
type compaction struct {
	from  *table   // the published table it copies
	dirty []uint64 // keys whose set changed since it started
	stale bool     // a change too wide to log happened: drop the copy
}

// compactMinSlots is the smallest table compacted in the background. Smaller tables
// rebuild under the mutex in well under a millisecond, cheaper than a goroutine and a
// second table; tables of this size and up take about a millisecond and more. An
// inventory copies it at New (Inventory.compactMinSlots), so a test can compact every
// table of its own inventory without touching another test's.
const compactMinSlots = 1 << 14

// compactLead is how many used slots before its trigger a shard starts compacting: 1/256
// of the table. Why so few: the new table is the whole table's size again, held from the
// start to the publish, and the copy takes milliseconds against the second or so a
// shard takes to use that many slots at 1M keys/s over 100M entries (256 shards, ~2,000
// tombstones a second each). A shard that outruns its compaction goes on to the table's
// load bound (limit), then rebuilds under the mutex as before.
func compactLead(t *table, trigger int) int {
	return min(t.capacity()/256, trigger/2)
}

// limit is the used slots at which an insert rebuilds t under the mutex: the trigger, or
// while a compaction runs, the table's load bound (the compaction will publish soon).
func (sh *shardState) limit(t *table) int {
	if c := sh.compaction; c != nil && !c.stale {
		return t.maxUsed()
	}
	return sh.trigger
}

// noteDirty logs key k as changed, when a compaction runs. Under the mutex.
func (sh *shardState) noteDirty(k uint64) {
	if c := sh.compaction; c != nil && !c.stale {
		c.dirty = append(c.dirty, k)
	}
}

// startCompaction starts compacting shard s's table in the background. Under the mutex.
func (inv *Inventory) startCompaction(s int, sh *shardState) {
	sh.compaction = &compaction{from: inv.tabs[s].Load()}
	go inv.compact(s, sh, sh.compaction, bucketsFor(sh.live+1, inv.lay))
}

// compact runs compaction c of shard s into a new table of nb buckets.
func (inv *Inventory) compact(s int, sh *shardState, c *compaction, nb uint64) {
	nt := newTable(nb, inv.words, inv.lay)
	nt.touch()
	sh.copying.Store(nt)
	// Only its own: once this compaction has left the mutex, a writer may start the next.
	defer sh.copying.CompareAndSwap(nt, nil)

	n := c.from.copyLiveInto(nt, inv.shardBits, true)
	if inv.compactHook != nil {
		inv.compactHook()
	}
	inv.publishCompaction(s, sh, c, nt, n)
}

// publishCompaction replays compaction c's dirty log into nt, its copy with n slots
// claimed, and publishes nt as shard s's table, or drops it (see the top of the file).
func (inv *Inventory) publishCompaction(s int, sh *shardState, c *compaction, nt *table, n int) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.compaction = nil
	if c.stale || inv.tabs[s].Load() != c.from {
		inv.compactDrops.Add(1)
		retireTable(nt)
		return
	}
	for _, k := range c.dirty {
		if n >= nt.maxUsed() {
			// The writers outran the copy: past the new table's load bound, drop it
			// (the table is still private) and let the mutex rebuild take over.
			inv.compactDrops.Add(1)
			retireTable(nt)
			return
		}
		n += c.from.replayInto(nt, k, inv.shardBits)
	}
	inv.tabs[s].Store(nt)
	retireTable(c.from)
	sh.used = n
	sh.trigger = compactTrigger(nt, n, uint64(s)<<32|inv.rebuilds.Load())
	sh.usedGauge.Store(int64(n))
	inv.rebuilds.Add(1)
}

// copyLiveInto copies every live key of t into nt (same layout, not yet published: plain
// stores) and returns the slots it claimed there. It reads t as lock-free readers do, so
// writers may change t meanwhile (a background compaction) or not (a rebuild under the
// mutex): each key is copied only if it still reads the same after its set was read. A
// key whose set changed during the copy may be copied with a set of any moment of the
// change, or not at all, or twice (removed after its bucket was copied, and stored again
// in a bucket not copied yet); the writers logged it (see compact).
//
// yield (a background compaction, never a copy under the mutex) lets other goroutines
// run every compactYieldBuckets buckets.
func (t *table) copyLiveInto(nt *table, shardBits uint, yield bool) int {
	for i := range t.zero {
		nt.zero[i] = atomic.LoadUint64(&t.zero[i])
	}
	if !yield {
		return t.copyBuckets(nt, shardBits, 0, t.nb)
	}
	n := 0
	for lo := uint64(0); lo < t.nb; lo += compactYieldBuckets {
		n += t.copyBuckets(nt, shardBits, lo, min(lo+compactYieldBuckets, t.nb))
		runtime.Gosched()
	}
	return n
}

// compactYieldBuckets is how many buckets a background compaction copies between two
// yields: 64 KiB of table, ~30-60 us. Why yield: a copy at 100M entries takes 7-15 ms of
// a core, and the scheduler lets it keep its P that long, so with two Ps the event
// appliers shared one for the copy's length, and their batches queued (the event lag's
// p99 sat on the copies, bench/RESULTS.md, session 8). Yielding puts the copy behind
// the appliers woken meanwhile: the same CPU, spent when they are idle.
const compactYieldBuckets = 1024

// copyBuckets is copyLiveInto for t's buckets [lo, hi), key 0 aside.
func (t *table) copyBuckets(nt *table, shardBits uint, lo, hi uint64) int {
	n := 0
	var blk [maxWords]uint64 // a spilled set's words
	for bi := lo; bi < hi; bi++ {
		bk := &t.buckets[bi]
		for j := 0; j < t.kpb; j++ {
			kp := &bk[j&(bucketWords-1)]
			k := atomic.LoadUint64(kp)
			if k == 0 {
				break // slots fill in order: the rest of the bucket is empty
			}
			p, sh := t.maskAt(bk, j)
			m := atomic.LoadUint64(p) >> sh & t.lmask
			if m == 0 {
				continue
			}
			set := blk[:0]
			if t.sparse && isSpill(m) {
				src := t.spillBlock(m)
				for i := range src {
					blk[i&(maxWords-1)] = atomic.LoadUint64(&src[i])
				}
				set = blk[:len(src)]
			}
			if atomic.LoadUint64(kp) != k {
				continue // the slot passed to another key: logged
			}
			free := nt.freeSlotPrivate(nt.home(mix(k), shardBits))
			nt.putPrivate(free, k, m, set)
			n++
		}
	}
	return n
}

// putPrivate stores key k with set word (or mask) m into the empty slot free of nt, a
// table no reader can see yet; blk is a spilled set's words when m is a spill word.
func (nt *table) putPrivate(free int, k, m uint64, blk []uint64) {
	nt.buckets[free>>slotShift][free&(1<<slotShift-1)] = k
	nt.putSet(free, m, blk)
}

// replayInto gives key k in nt (not yet published) the set t holds for it now, and
// returns the slots that claimed in nt (0 or 1). Under the shard's mutex, so t's words
// are the writers' own view.
func (t *table) replayInto(nt *table, k uint64, shardBits uint) int {
	if k == 0 {
		copy(nt.zero, t.zero)
		return 0
	}
	m, _ := t.probe(k, t.home(mix(k), shardBits))
	var blk []uint64
	if t.sparse && isSpill(m) {
		blk = t.spillBlock(m)
	}
	if ns := nt.emptyCopies(k, nt.home(mix(k), shardBits)); ns >= 0 {
		if m != 0 {
			nt.putSet(ns, m, blk)
		}
		return 0
	}
	if m == 0 {
		return 0
	}
	nt.putPrivate(nt.freeSlotPrivate(nt.home(mix(k), shardBits)), k, m, blk)
	return 1
}

// emptyCopies empties the set of every slot of nt (not yet published) holding key k,
// leaving tombstones (still used slots), and returns the first such slot, or -1. Why
// every one: the copy may have copied k twice (see copyLiveInto), and a second copy left
// with a stale set would surface once the first went.
func (nt *table) emptyCopies(k, b uint64) int {
	first := -1
	for n := nt.nb; n > 0; n-- {
		bk := &nt.buckets[b]
		for j := 0; j < nt.kpb; j++ {
			switch bk[j&(bucketWords-1)] {
			case 0:
				return first // slots fill in order: the run ends here
			case k:
				ns := slotOf(b, j)
				if first < 0 {
					first = ns
				}
				nt.emptySet(ns)
			}
		}
		if nt.ovf[b/64]&(1<<(b%64)) == 0 {
			return first
		}
		if b++; b == nt.nb {
			b = 0
		}
	}
	return first
}

// emptySet empties slot ns's set in nt (not yet published), releasing a spilled block.
func (nt *table) emptySet(ns int) {
	if nt.sparse {
		p := nt.setWordAt(ns)
		if old := *p; isSpill(old) {
			nt.releaseSpill(old)
			nt.spilled.Add(-1)
		}
		*p = 0
		return
	}
	p, sh := nt.maskAt(&nt.buckets[ns>>slotShift], ns&(1<<slotShift-1))
	*p &^= nt.lmask << sh
}

// putSet stores set word (or mask) m into slot ns of nt (not yet published), whose set
// is empty; blk is a spilled set's words when m is a spill word.
func (nt *table) putSet(ns int, m uint64, blk []uint64) {
	bk := &nt.buckets[ns>>slotShift]
	if !nt.sparse {
		p, sh := nt.maskAt(bk, ns&(1<<slotShift-1))
		*p |= m << sh
		return
	}
	if isSpill(m) {
		words, sw := nt.allocSpill(isList(m))
		copy(words, blk)
		m = sw
		nt.spilled.Add(1)
	}
	*nt.setWordAt(ns) = m
}
