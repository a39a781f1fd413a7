package shard

import (
	"math/bits"
	"runtime"
	"sync/atomic"
)

// One shard's index is an open-addressing table of (key, mask) slots packed into 64-byte
// buckets (keys first, then the slots' masks packed into the words after them), probed
// bucket by bucket (linear probing).
//
// Why this layout: a bucket is one cache line, so a probe that misses costs one line, and
// the mask of a key sits in the line that holds the key. How many slots share a line
// depends on the mask width the rule needs (layoutFor): a rule of 8 endpoints packs 7
// keys and their 1-byte masks into a line (9.1 bytes per slot), one of 64 endpoints 4 keys
// and their 8-byte masks (16 bytes per slot). Narrower masks mean more slots per line,
// so shorter probe runs, fewer bytes per key, and room to run the table emptier, which
// makes growth cheaper (below). Rules of more than 64 endpoints keep the 64-endpoint
// geometry, but a slot's word holds a sparse endpoint set instead of a mask: up to four
// 16-bit endpoint ids inline, spilling to a bitmask out of line only for keys held by
// more (sparse.go).
//
// Buckets fill slot 0 up in order, so "slot j holds key 0" means "no later slot of this
// bucket is used" and a lookup stops at the first empty slot.
//
// Why keys never move (tombstones instead of backward-shift deletion): it is what makes
// readers lock-free without a seqlock. A key a reader finds stays in its slot, so the
// reader reads a mask some writer stored whole (an atomic word), never a slot half-way
// through a shift. Removing an endpoint's last bit leaves the key with an all-zero mask
// (a tombstone: it scores nothing); re-adding the key revives the same slot, another key
// may recycle it (reuse), or at a bucket's tail it is emptied again (trimTail); lookups
// re-read the key after its mask, so neither is ever taken for a live key's mask.
// Rebuilds drop the remaining tombstones.
//
// Why the bucket count is not a power of two: the memory target (<= 24 B/key at 1M keys)
// leaves no room for doubling a 16-byte-slot table. A rebuild sizes the table so that
// live keys fill the layout's rebuild load, and the next rebuild comes at maxLoad, so a
// table stays between slotBytes/0.875 and slotBytes/rebuildLoad bytes per live key (plus
// the overflow bits; a huge-page table is rounded up to whole huge pages, see
// thp_linux.go). Each rebuild re-inserts every live key, so growth costs
// 1/(maxLoad/rebuildLoad - 1) re-inserts per added key: 3.5 for 16-byte slots (rebuild
// load 0.68, the least that keeps 23.5 B/key), 1.1 for 1-byte masks (0.45, 20.3 B/key).
// The bucket comes from the key hash by multiply-shift range reduction (Lemire's
// fastrange), which needs no power of two.
const (
	bucketWords = 8 // a bucket is one 64-byte cache line
	// slotShift: a slot index is bucket<<slotShift | j, so no division finds a slot's
	// bucket; indexes with j >= the layout's slots per bucket are holes, always empty.
	slotShift = 3
	// maxLoad: a new key that would push used slots (live + tombstones) past it
	// triggers a rebuild. 7/8 keeps probe runs short with 4- to 7-slot buckets.
	maxLoadNum, maxLoadDen = 7, 8
	// shrinkLoadDen: a table whose live keys fall under 1/4 of its slots after a remove
	// or a clear is rebuilt smaller, so memory follows the inventory down too.
	shrinkLoadDen = 4
	minBuckets    = 4
	// evictScanBuckets bounds the search for a victim at the per-endpoint bound.
	evictScanBuckets = 256
)

// bucket is one cache line: kpb keys in words 0..kpb-1, then word 0 of their masks,
// mw bits each, packed into the words after (slot j's at bit j*mw from word kpb).
type bucket [bucketWords]uint64

// layout is how a table packs slots into buckets, fixed by the rule's endpoint count.
type layout struct {
	sparse bool   // slot words are sparse endpoint sets (sparse.go), not masks
	kpb    int    // slots (keys) per bucket
	mw     uint   // bits of a slot's in-bucket mask: 8, 16, 32 or 64
	lmask  uint64 // 1<<mw - 1
	// rebuildLoad: a rebuilt table holds live keys at num/den of its slots, the lowest
	// load that keeps a table under 23.5 bytes per key (20.3 for 1-byte masks, which do
	// not need all of it to grow cheaply).
	rebuildNum, rebuildDen uint64
}

// layoutFor picks the narrowest in-bucket mask that holds endpoints bits; rules of more
// than 64 endpoints get sparse sets in the 64-endpoint geometry.
func layoutFor(endpoints int) layout {
	switch {
	case endpoints <= 8:
		return layout{kpb: 7, mw: 8, lmask: 1<<8 - 1, rebuildNum: 9, rebuildDen: 20} // 9.1 B/slot
	case endpoints <= 16:
		return layout{kpb: 6, mw: 16, lmask: 1<<16 - 1, rebuildNum: 5, rebuildDen: 11} // 10.7 B/slot
	case endpoints <= 32:
		return layout{kpb: 5, mw: 32, lmask: 1<<32 - 1, rebuildNum: 6, rebuildDen: 11} // 12.8 B/slot
	case endpoints <= 64:
		return layout{kpb: 4, mw: 64, lmask: ^uint64(0), rebuildNum: 17, rebuildDen: 25} // 16 B/slot
	default:
		return layout{sparse: true, kpb: sparseSlots, mw: 64, lmask: ^uint64(0), rebuildNum: 17, rebuildDen: 25}
	}
}

// table is one shard's index, published to readers through an atomic pointer (RCU).
// Writers mutate a published table only with atomic stores of whole words, under the
// shard's mutex; a rebuild fills a fresh table privately and then publishes it. Readers
// holding the old table keep a consistent (older) view; the garbage collector frees it
// once the last reader is done, which is the grace period RCU needs.
type table struct {
	buckets []bucket
	nb      uint64 // len(buckets)
	kpb     int    // layout: slots per bucket
	mw      uint   // layout: in-bucket mask bits per slot
	lmask   uint64 // layout: 1<<mw - 1
	// sparse: slot words are endpoint sets, spilling into lists or spill (sparse.go); bw
	// is the words of a spilled set's bitmask, spilled the number of spilled sets (lists
	// and bitmasks).
	sparse  bool
	bw      int
	lists   spillArena
	spill   spillArena
	spilled atomic.Int64
	// zero is the mask of key 0 (bw words), which cannot live in a slot because 0 marks
	// an empty one. Only the table of the shard that key 0 hashes to uses it.
	zero []uint64
	// ovf has one bit per bucket, set (never cleared while the table lives) once an
	// insert found that bucket full and went on to the next. A lookup that does not find
	// its key in a full bucket without the bit can stop there: the key was never placed
	// beyond it. Misses, common at a prompt's uncached tail, then cost about one bucket
	// instead of the whole probe run. It costs one bit per bucket, so it stays in cache.
	ovf []uint64
	// retired, for a table in a mapping of its own (thp_linux.go): set once a newer table
	// replaced it, so its unmapping counts against what retireTable awaits.
	retired *atomic.Bool
}

// zeroSlot is the slot index writers use for key 0's out-of-table mask; noSlot is
// probe's for a key that is absent.
const (
	zeroSlot = -1
	noSlot   = -2
)

func newTable(nb uint64, words int, lay layout) *table {
	if nb < minBuckets {
		nb = minBuckets
	}
	t := &table{nb: nb, kpb: lay.kpb, mw: lay.mw, lmask: lay.lmask,
		sparse: lay.sparse, bw: words, zero: make([]uint64, words), ovf: make([]uint64, (nb+63)/64)}
	// Large tables live in huge pages off the Go heap (thp_linux.go).
	if hugeTable(nb, lay) {
		if b, mem, ok := mapBuckets(nb); ok {
			t.buckets = b
			t.retired = new(atomic.Bool)
			unmapWhenUnreachable(t, mem)
			return t
		}
	}
	t.buckets = make([]bucket, nb)
	return t
}

// touch has the kernel back every page of a table no reader can see yet, so that it
// does now rather than at the rebuild's first writes. populate asks for all of it in one
// system call where the kernel can (thp_linux.go); otherwise each 4 KiB page gets a
// write (a zero to a zero).
func (t *table) touch() {
	if populate(t.buckets) {
		return
	}
	for i := 0; i < len(t.buckets); i += 4096 / 64 {
		t.buckets[i][0] = 0
	}
}

// bucketsFor is the bucket count of a table rebuilt to hold live keys.
func bucketsFor(live int, lay layout) uint64 {
	slots := (uint64(live)*lay.rebuildDen + lay.rebuildNum - 1) / lay.rebuildNum
	nb := (slots + uint64(lay.kpb) - 1) / uint64(lay.kpb)
	if nb < minBuckets {
		nb = minBuckets
	}
	return roundBuckets(nb, lay)
}

// slots is the size of the slot index space (holes included): slot indexes run
// [0, slots()).
func (t *table) slots() int { return int(t.nb) << slotShift }

// capacity is the number of real slots.
func (t *table) capacity() int { return int(t.nb) * t.kpb }

// maxUsed is the number of used slots at which a new key triggers a rebuild.
func (t *table) maxUsed() int { return t.capacity() * maxLoadNum / maxLoadDen }

func (t *table) bytes() int64 {
	return int64(len(t.buckets))*64 + int64(len(t.zero)+len(t.ovf))*8 + t.lists.bytes.Load() + t.spill.bytes.Load() + 400
}

// slotOf is the slot index of bucket b's slot j.
func slotOf(b uint64, j int) int { return int(b)<<slotShift | j }

// mix spreads a key's bits over the hash: engine keys are digests already, but tests,
// the fast key of small contracts or an adversary may not be. It is a bijection
// (xorshift and odd multiply), cheap next to the cache miss that follows it.
func mix(k uint64) uint64 {
	k ^= k >> 33
	k *= 0xff51afd7ed558ccd
	k ^= k >> 33
	return k
}

// home is the first bucket of h's probe run; shift drops the bits that chose the shard.
func (t *table) home(h uint64, shardBits uint) uint64 {
	hi, _ := bits.Mul64(h<<shardBits, t.nb)
	return hi
}

// maskAt returns the word holding word 0 of slot j's mask in bk, and the mask's shift.
func (t *table) maskAt(bk *bucket, j int) (*uint64, uint) {
	o := uint(j) * t.mw
	return &bk[(t.kpb+int(o>>6))&(bucketWords-1)], o & 63
}

// lookup returns word 0 of key's mask (0 when absent). Lock-free: safe against writers.
func (t *table) lookup(key, b uint64) uint64 {
	m, _ := t.probe(key, b)
	return m
}

// probe is lookup that also returns the slot the mask was read from (zeroSlot for key 0;
// noSlot with m 0 when absent), so a sparse reader can go on to a spilled set's block
// without walking the probe run again.
func (t *table) probe(key, b uint64) (m uint64, slot int) {
	if key == 0 {
		return atomic.LoadUint64(&t.zero[0]), zeroSlot
	}
	// The load bound guarantees an empty slot, so the walk ends well before n runs
	// out; n only keeps a broken invariant from turning into a hang.
	for n := t.nb; n > 0; n-- {
		bk := &t.buckets[b]
		for j := 0; j < t.kpb; j++ {
			k := atomic.LoadUint64(&bk[j&(bucketWords-1)])
			runtime.KeepAlive(t)
			if k == key {
				// A tombstone's slot may be handed to another key (see reuse): the
				// writer stores the new key before its mask, so a mask read while the
				// key still reads as ours is ours (or the tombstone's zero).
				p, sh := t.maskAt(bk, j)
				m := atomic.LoadUint64(p) >> sh & t.lmask
				again := atomic.LoadUint64(&bk[j&(bucketWords-1)])
				runtime.KeepAlive(t) // its buckets may be a mapping unmapped with it
				if again != key {
					return 0, noSlot // our key was a tombstone, now reused or emptied: absent
				}
				return m, slotOf(b, j)
			}
			if k == 0 {
				return 0, noSlot
			}
		}
		if !t.overflowed(b) {
			return 0, noSlot
		}
		if b++; b == t.nb {
			b = 0
		}
	}
	return 0, noSlot
}

func (t *table) overflowed(b uint64) bool {
	return atomic.LoadUint64(&t.ovf[b/64])&(1<<(b%64)) != 0
}

// find returns key's slot (zeroSlot for key 0), or -1 with ok false when absent.
// Writers use it under the shard mutex; readers only through lookup's and sparseLookup's checks,
// since a tombstone's slot may pass to another key.
func (t *table) find(key, b uint64) (slot int, ok bool) {
	if key == 0 {
		return zeroSlot, true
	}
	for n := t.nb; n > 0; n-- {
		bk := &t.buckets[b]
		for j := 0; j < t.kpb; j++ {
			k := atomic.LoadUint64(&bk[j&(bucketWords-1)])
			if k == key {
				return slotOf(b, j), true
			}
			if k == 0 {
				return -1, false
			}
		}
		if !t.overflowed(b) {
			return -1, false
		}
		if b++; b == t.nb {
			b = 0
		}
	}
	return -1, false
}

// findForInsert is the writer's find and freeSlot in one walk: key's slot (ok), or else
// the slot an insert of key would take (free; -1 if the table were full), marking the
// full buckets before it as overflowed. reuse says free is a tombstone to recycle rather
// than an empty slot (see reuse). Shard mutex held: no
// other writer changes t, so plain loads of keys and masks are race-free (readers only
// load).
func (t *table) findForInsert(key, b uint64) (slot int, ok bool, free int, reuse bool) {
	if key == 0 {
		return zeroSlot, true, zeroSlot, false
	}
	searching := true // false once key is known absent: only a free slot is wanted
	tomb := -1        // the first tombstone of the run, when tombstones may be reused
	for n := t.nb; n > 0; n-- {
		bk := &t.buckets[b]
		for j := 0; j < t.kpb; j++ {
			k := bk[j&(bucketWords-1)]
			if k == 0 {
				if tomb >= 0 {
					return -1, false, tomb, true
				}
				return -1, false, slotOf(b, j), false
			}
			if searching && k == key {
				return slotOf(b, j), true, -1, false
			}
			if tomb < 0 && t.tombstone(bk, j) {
				tomb = slotOf(b, j)
			}
		}
		// The bucket is full. Key is not beyond it unless an insert overflowed it.
		if tomb >= 0 && (!searching || !t.overflowed(b)) {
			return -1, false, tomb, true
		}
		if !t.overflowed(b) {
			searching = false
			atomic.OrUint64(&t.ovf[b/64], 1<<(b%64))
		}
		if b++; b == t.nb {
			b = 0
		}
	}
	return -1, false, -1, false
}

// tombstone reports whether slot j of bucket bk (bucket b), which holds a key, has an
// all-zero mask (a sparse table: an empty set word). Writer-side (shard mutex held): plain
// loads. The in-bucket word is read in place, since the insert walk asks it of every slot
// it passes.
func (t *table) tombstone(bk *bucket, j int) bool {
	p, sh := t.maskAt(bk, j)
	return *p>>sh&t.lmask == 0
}

// freeSlot returns the first empty slot of the probe run from home bucket b, marking
// every full bucket it passes as overflowed first, so that lookups go on past them.
// Writer-side (shard mutex held, or an unpublished table). -1 if the table were full,
// which the load bound rules out.
func (t *table) freeSlot(b uint64) int {
	for n := t.nb; n > 0; n-- {
		bk := &t.buckets[b]
		// Slots fill in order, so the last one tells whether the bucket is full.
		if atomic.LoadUint64(&bk[(t.kpb-1)&(bucketWords-1)]) == 0 {
			for j := 0; j < t.kpb; j++ {
				if atomic.LoadUint64(&bk[j&(bucketWords-1)]) == 0 {
					return slotOf(b, j)
				}
			}
		}
		if !t.overflowed(b) {
			atomic.OrUint64(&t.ovf[b/64], 1<<(b%64))
		}
		if b++; b == t.nb {
			b = 0
		}
	}
	return -1
}

// word returns mask word w of slot: key 0's word w, or else slot's in-bucket bits
// shifted down (w = 0; a sparse table's set word).
func (t *table) word(slot, w int) uint64 {
	if slot == zeroSlot {
		return atomic.LoadUint64(&t.zero[w])
	}
	p, sh := t.maskAt(&t.buckets[slot>>slotShift], slot&(1<<slotShift-1))
	w0 := atomic.LoadUint64(p) >> sh & t.lmask
	runtime.KeepAlive(t)
	return w0
}

// key returns slot's key; 0 for an empty slot or a hole of the index space.
func (t *table) key(slot int) uint64 {
	if slot == zeroSlot {
		return 0
	}
	j := slot & (1<<slotShift - 1)
	if j >= t.kpb {
		return 0
	}
	k := atomic.LoadUint64(&t.buckets[slot>>slotShift][j])
	runtime.KeepAlive(t)
	return k
}

// live reports whether slot's mask (or set) holds any endpoint.
func (t *table) live(slot int) bool {
	if slot == zeroSlot {
		for w := range t.zero {
			if atomic.LoadUint64(&t.zero[w]) != 0 {
				return true
			}
		}
		return false
	}
	return t.word(slot, 0) != 0
}

// has reports whether slot's mask (or set) holds endpoint ep.
func (t *table) has(slot, ep int) bool {
	if t.sparse && slot != zeroSlot {
		return t.sparseHas(slot, ep)
	}
	return t.word(slot, ep>>6)&(1<<(uint(ep)&63)) != 0
}

// bitAt returns the word holding endpoint ep's bit of slot's mask and the bit (not for
// a sparse table's slots).
func (t *table) bitAt(slot, ep int) (*uint64, uint64) {
	if slot == zeroSlot {
		return &t.zero[ep>>6], 1 << (uint(ep) & 63)
	}
	p, sh := t.maskAt(&t.buckets[slot>>slotShift], slot&(1<<slotShift-1))
	return p, 1 << (sh + uint(ep)&63)
}

// setBit and clearBit are writer-side (shard mutex held): a load, then one atomic store
// of the whole word, so a reader sees the word before or after, never torn. Other slots'
// masks in the same word are rewritten with the values they already hold. A sparse
// table's slots take the set operations instead (sparse.go).
func (t *table) setBit(slot, ep int) {
	if t.sparse && slot != zeroSlot {
		t.sparseAdd(slot, ep)
		return
	}
	p, bit := t.bitAt(slot, ep)
	atomic.StoreUint64(p, atomic.LoadUint64(p)|bit)
}

func (t *table) clearBit(slot, ep int) {
	if t.sparse && slot != zeroSlot {
		t.sparseRemove(slot, ep)
		return
	}
	p, bit := t.bitAt(slot, ep)
	atomic.StoreUint64(p, atomic.LoadUint64(p)&^bit)
}

// claim stores key into the free slot find returned. The mask words are zero there
// (a never-used slot), and the key is stored last, so a reader that sees it sees the
// mask words a writer stored afterwards or zero, never another key's.
func (t *table) claim(slot int, key uint64) {
	atomic.StoreUint64(&t.buckets[slot>>slotShift][slot&(1<<slotShift-1)], key)
}

// reuse hands a tombstone's slot (a key no endpoint holds, mask zero) to key, held by
// endpoint ep. Why: under steady churn (every block stored matched by one evicted, an
// engine's normal state) tombstones would otherwise pile up until a rebuild re-inserted
// every live key, 3.5 re-inserts per new key; recycling them in place keeps most adds
// from ever reaching a rebuild. A tombstone's mask words are all zero, and setBit
// writes the one word ep's bit lives in.
//
// Why it is safe for lock-free readers: the key is stored before the mask, and lookup
// re-reads the key after the mask (masks, after all the words). A reader of the old key that read the new mask must
// then read the new key (sequentially consistent atomics), and reports the old key
// absent, which it was (a tombstone). A reader of the new key sees mask zero (absent,
// the state before the add) or the new mask. The one residual is a slot recycled twice
// (old key -> new key -> old key again, into the same slot) between a reader's two loads
// of the key, nanoseconds apart: that reader would take the middle key's mask.
func (t *table) reuse(slot int, key uint64, ep int) {
	atomic.StoreUint64(&t.buckets[slot>>slotShift][slot&(1<<slotShift-1)], key)
	t.setBit(slot, ep)
}

// trimTail empties slot, a tombstone, and the tombstones right before it in its bucket,
// when slot is the bucket's last used one and no insert ever overflowed the bucket, and
// returns how many slots it emptied. Why: emptied slots no longer count toward the load
// that triggers a rebuild, so churn rebuilds less. Why it is safe for readers: slots fill
// in order and no key of the probe runs through this bucket lies beyond it (the bucket
// never overflowed), so a lookup stopping at the new empty slot misses no key; a reader
// that read the old key before it went has read its zero mask, and lookup's re-read of
// the key reports it absent, which it was (sparseLookup does the same for sparse sets).
// Shard mutex held.
func (t *table) trimTail(slot int) int {
	if slot == zeroSlot {
		return 0
	}
	b := uint64(slot >> slotShift)
	j := slot & (1<<slotShift - 1)
	bk := &t.buckets[b]
	if j+1 < t.kpb && bk[(j+1)&(bucketWords-1)] != 0 {
		return 0
	}
	// Only a full bucket can have overflowed (an overflowed bucket is never trimmed), so
	// the overflow bit, a second cache miss at fleet sizes, is read only for a full one.
	if j+1 == t.kpb && t.overflowed(b) {
		return 0
	}
	n := 0
	for ; j >= 0 && bk[j] != 0 && t.tombstone(bk, j); j-- {
		atomic.StoreUint64(&bk[j], 0)
		n++
	}
	return n
}

// freeSlotPrivate is freeSlot for a table no reader can see yet: plain loads and stores.
func (t *table) freeSlotPrivate(b uint64) int {
	for {
		bk := &t.buckets[b]
		if bk[(t.kpb-1)&(bucketWords-1)] == 0 {
			for j := 0; j < t.kpb; j++ {
				if bk[j&(bucketWords-1)] == 0 {
					return slotOf(b, j)
				}
			}
		}
		t.ovf[b/64] |= 1 << (b % 64)
		if b++; b == t.nb {
			b = 0
		}
	}
}
