package shard

import (
	"math/bits"
	"sync/atomic"
)

// One shard's index is an open-addressing table of (key, mask) slots, four slots to a
// 64-byte bucket (keys first, masks after), probed bucket by bucket (linear probing).
//
// Why this layout: 16 bytes per slot is the least that holds a 64-bit key and a 64-endpoint
// mask, and a bucket is one cache line, so a probe that misses costs one line, not four.
// Buckets fill slot 0 to 3 in order and keys are never moved or erased while a table is
// published, so "slot j holds key 0" means "no later slot of this bucket is used" and a
// lookup stops at the first empty slot.
//
// Why keys never move (tombstones instead of backward-shift deletion): it is what makes
// readers lock-free without a seqlock. A key's slot, once claimed, holds that key for the
// table's whole life, so a reader that finds it reads a mask some writer stored whole
// (an atomic word), never a slot half-way through a shift. Removing an endpoint's last bit
// leaves the key with an all-zero mask (a tombstone: it scores nothing); re-adding the key
// revives the same slot. Tombstones are dropped when the table is rebuilt.
//
// Why the bucket count is not a power of two: the memory target (<= 24 B/key at 1M keys)
// leaves no room for doubling. A rebuild sizes the table so that live keys fill
// rebuildLoad of it, and the next rebuild comes at maxLoad (growth x1.29), so the table
// stays between 16/0.875 = 18.3 and 16/0.68 = 23.5 bytes per live key (plus 1/256 of that
// for the overflow bits). The gap between the two loads is the trade-off: each rebuild
// re-inserts every live key, so a steady add/remove churn pays 0.68/(0.875-0.68) = 3.5
// re-inserts per new key; 0.70 would cost 4. The bucket comes from the key hash by
// multiply-shift range reduction (Lemire's fastrange), which needs no power of two.
const (
	bucketSlots = 4
	// maxLoad: a new key that would push used slots (live + tombstones) past it
	// triggers a rebuild. 7/8 keeps probe runs short with 4-slot buckets.
	maxLoadNum, maxLoadDen = 7, 8
	// rebuildLoad: a rebuilt table holds live keys at 68% of its slots.
	rebuildLoadNum, rebuildLoadDen = 17, 25
	// shrinkLoadDen: a table whose live keys fall under 1/4 of its slots after a remove
	// or a clear is rebuilt smaller, so memory follows the inventory down too.
	shrinkLoadDen = 4
	minBuckets    = 4
	// evictScanBuckets bounds the search for a victim at the per-endpoint bound.
	evictScanBuckets = 256
)

// bucket is one cache line: four keys, then their four masks (word 0 of each mask).
type bucket struct {
	keys  [bucketSlots]uint64
	masks [bucketSlots]uint64
}

// table is one shard's index, published to readers through an atomic pointer (RCU).
// Writers mutate a published table only with atomic stores of whole words, under the
// shard's mutex; a rebuild fills a fresh table privately and then publishes it. Readers
// holding the old table keep a consistent (older) view; the garbage collector frees it
// once the last reader is done, which is the grace period RCU needs.
type table struct {
	buckets []bucket
	nb      uint64 // len(buckets)
	// ww is the number of mask words beyond word 0 (0 for rules of <= 64 endpoints).
	ww int
	// wide holds words 1..ww of slot i's mask at wide[i*ww:(i+1)*ww].
	wide []uint64
	// zero is the mask of key 0, which cannot live in a slot because 0 marks an empty
	// one. Only the table of the shard that key 0 hashes to uses it.
	zero []uint64
	// ovf has one bit per bucket, set (never cleared while the table lives) once an
	// insert found that bucket full and went on to the next. A lookup that does not find
	// its key in a full bucket without the bit can stop there: the key was never placed
	// beyond it. Misses, common at a prompt's uncached tail, then cost about one bucket
	// instead of the whole probe run (4.7 buckets at 83% load without it). It costs one
	// bit per bucket, so it stays in cache.
	ovf []uint64
}

// zeroSlot is the slot index writers use for key 0's out-of-table mask.
const zeroSlot = -1

func newTable(nb uint64, words int) *table {
	if nb < minBuckets {
		nb = minBuckets
	}
	t := &table{buckets: make([]bucket, nb), nb: nb, ww: words - 1, zero: make([]uint64, words),
		ovf: make([]uint64, (nb+63)/64)}
	if t.ww > 0 {
		t.wide = make([]uint64, int(nb)*bucketSlots*t.ww)
	}
	return t
}

// bucketsFor is the bucket count of a table rebuilt to hold live keys.
func bucketsFor(live int) uint64 {
	slots := (uint64(live)*rebuildLoadDen + rebuildLoadNum - 1) / rebuildLoadNum
	nb := (slots + bucketSlots - 1) / bucketSlots
	if nb < minBuckets {
		nb = minBuckets
	}
	return nb
}

func (t *table) slots() int { return int(t.nb) * bucketSlots }

// maxUsed is the number of used slots at which a new key triggers a rebuild.
func (t *table) maxUsed() int { return t.slots() * maxLoadNum / maxLoadDen }

func (t *table) bytes() int64 {
	return int64(len(t.buckets))*64 + int64(len(t.wide)+len(t.zero)+len(t.ovf))*8 + 120
}

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

// lookup returns word 0 of key's mask (0 when absent). Lock-free: safe against writers.
func (t *table) lookup(key, b uint64) uint64 {
	if key == 0 {
		return atomic.LoadUint64(&t.zero[0])
	}
	// The load bound guarantees an empty slot, so the walk ends well before n runs
	// out; n only keeps a broken invariant from turning into a hang.
	for n := t.nb; n > 0; n-- {
		bk := &t.buckets[b]
		for j := 0; j < bucketSlots; j++ {
			k := atomic.LoadUint64(&bk.keys[j])
			if k == key {
				// A tombstone's slot may be handed to another key (see reuse): the
				// writer stores the new key before its mask, so a mask read while the
				// key still reads as ours is ours (or the tombstone's zero).
				m := atomic.LoadUint64(&bk.masks[j])
				if atomic.LoadUint64(&bk.keys[j]) != key {
					return 0 // our key was a tombstone, now reused: it is absent
				}
				return m
			}
			if k == 0 {
				return 0
			}
		}
		if !t.overflowed(b) {
			return 0
		}
		if b++; b == t.nb {
			b = 0
		}
	}
	return 0
}

func (t *table) overflowed(b uint64) bool {
	return atomic.LoadUint64(&t.ovf[b/64])&(1<<(b%64)) != 0
}

// find returns key's slot (zeroSlot for key 0), or -1 with ok false when absent.
// Lock-free: safe against writers.
func (t *table) find(key, b uint64) (slot int, ok bool) {
	if key == 0 {
		return zeroSlot, true
	}
	for n := t.nb; n > 0; n-- {
		bk := &t.buckets[b]
		for j := 0; j < bucketSlots; j++ {
			k := atomic.LoadUint64(&bk.keys[j])
			if k == key {
				return int(b)*bucketSlots + j, true
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
// than an empty slot (tables of <= 64 endpoints only; see reuse). Shard mutex held: no
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
		for j := 0; j < bucketSlots; j++ {
			k := bk.keys[j]
			if k == 0 {
				if tomb >= 0 {
					return -1, false, tomb, true
				}
				return -1, false, int(b)*bucketSlots + j, false
			}
			if searching && k == key {
				return int(b)*bucketSlots + j, true, -1, false
			}
			if tomb < 0 && t.ww == 0 && bk.masks[j] == 0 {
				tomb = int(b)*bucketSlots + j
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

// freeSlot returns the first empty slot of the probe run from home bucket b, marking
// every full bucket it passes as overflowed first, so that lookups go on past them.
// Writer-side (shard mutex held, or an unpublished table). -1 if the table were full,
// which the load bound rules out.
func (t *table) freeSlot(b uint64) int {
	for n := t.nb; n > 0; n-- {
		bk := &t.buckets[b]
		// Slots fill in order, so the last one tells whether the bucket is full.
		if atomic.LoadUint64(&bk.keys[bucketSlots-1]) == 0 {
			for j := 0; j < bucketSlots; j++ {
				if atomic.LoadUint64(&bk.keys[j]) == 0 {
					return int(b)*bucketSlots + j
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

// word returns word w of slot's mask.
func (t *table) word(slot, w int) *uint64 {
	if slot == zeroSlot {
		return &t.zero[w]
	}
	if w == 0 {
		return &t.buckets[slot/bucketSlots].masks[slot%bucketSlots]
	}
	return &t.wide[slot*t.ww+w-1]
}

func (t *table) key(slot int) uint64 {
	if slot == zeroSlot {
		return 0
	}
	return atomic.LoadUint64(&t.buckets[slot/bucketSlots].keys[slot%bucketSlots])
}

// live reports whether any bit of slot's mask is set.
func (t *table) live(slot int) bool {
	if atomic.LoadUint64(t.word(slot, 0)) != 0 {
		return true
	}
	for w := 1; w <= t.ww; w++ {
		if atomic.LoadUint64(t.word(slot, w)) != 0 {
			return true
		}
	}
	return false
}

// has reports whether slot's mask holds endpoint ep.
func (t *table) has(slot, ep int) bool {
	return atomic.LoadUint64(t.word(slot, ep>>6))&(1<<(uint(ep)&63)) != 0
}

// setBit and clearBit are writer-side (shard mutex held): a load, then one atomic store
// of the whole word, so a reader sees the word before or after, never torn.
func (t *table) setBit(slot, ep int) {
	p := t.word(slot, ep>>6)
	atomic.StoreUint64(p, atomic.LoadUint64(p)|1<<(uint(ep)&63))
}

func (t *table) clearBit(slot, ep int) {
	p := t.word(slot, ep>>6)
	atomic.StoreUint64(p, atomic.LoadUint64(p)&^(1<<(uint(ep)&63)))
}

// claim stores key into the free slot find returned. The mask words are zero there
// (a never-used slot), and the key is stored last, so a reader that sees it sees the
// mask words a writer stored afterwards or zero, never another key's.
func (t *table) claim(slot int, key uint64) {
	atomic.StoreUint64(&t.buckets[slot/bucketSlots].keys[slot%bucketSlots], key)
}

// reuse hands a tombstone's slot (a key no endpoint holds, mask zero) to key, held by
// endpoint ep. Why: under steady churn (every block stored matched by one evicted, an
// engine's normal state) tombstones would otherwise pile up until a rebuild re-inserted
// every live key, 3.5 re-inserts per new key; recycling them in place keeps most adds
// from ever reaching a rebuild. Only for tables of <= 64 endpoints (one mask word).
//
// Why it is safe for lock-free readers: the key is stored before the mask, and lookup
// re-reads the key after the mask. A reader of the old key that read the new mask must
// then read the new key (sequentially consistent atomics), and reports the old key
// absent, which it was (a tombstone). A reader of the new key sees mask zero (absent,
// the state before the add) or the new mask. The one residual is a slot recycled twice
// (old key -> new key -> old key again, into the same slot) between a reader's two loads
// of the key, nanoseconds apart: that reader would take the middle key's mask.
func (t *table) reuse(slot int, key uint64, ep int) {
	bk := &t.buckets[slot/bucketSlots]
	atomic.StoreUint64(&bk.keys[slot%bucketSlots], key)
	atomic.StoreUint64(&bk.masks[slot%bucketSlots], 1<<(uint(ep)&63))
}

// trimTail empties slot, a tombstone, and the tombstones right before it in its bucket,
// when slot is the bucket's last used one and no insert ever overflowed the bucket, and
// returns how many slots it emptied. Why: emptied slots no longer count toward the load
// that triggers a rebuild, so churn rebuilds less. Why it is safe for readers: slots fill
// in order and no key of the probe runs through this bucket lies beyond it (the bucket
// never overflowed), so a lookup stopping at the new empty slot misses no key; a reader
// that read the old key before it went has read its zero mask, and lookup's re-read of
// the key reports it absent, which it was. Tables of <= 64 endpoints only (see reuse).
// Shard mutex held.
func (t *table) trimTail(slot int) int {
	if t.ww != 0 || slot == zeroSlot {
		return 0
	}
	b := uint64(slot / bucketSlots)
	j := slot % bucketSlots
	bk := &t.buckets[b]
	if (j+1 < bucketSlots && bk.keys[j+1] != 0) || t.overflowed(b) {
		return 0
	}
	n := 0
	for ; j >= 0 && bk.keys[j] != 0 && bk.masks[j] == 0; j-- {
		atomic.StoreUint64(&bk.keys[j], 0)
		n++
	}
	return n
}

// rebuildInto copies every live key of t into the unpublished table nt and returns the
// number copied. Writer-side: t's slots change only under the shard mutex the caller
// holds, so plain loads of them are race-free, and nt is private until published, so
// plain stores into it are too.
func (t *table) rebuildInto(nt *table, shardBits uint) int {
	n := 0
	copy(nt.zero, t.zero)
	ww := t.ww
	for bi := range t.buckets {
		bk := &t.buckets[bi]
		for j := 0; j < bucketSlots; j++ {
			k := bk.keys[j]
			if k == 0 {
				break // slots fill in order: the rest of the bucket is empty
			}
			slot := bi*bucketSlots + j
			m := bk.masks[j]
			var wide []uint64
			if ww > 0 {
				wide = t.wide[slot*ww : slot*ww+ww]
				if m == 0 && allZero(wide) {
					continue
				}
			} else if m == 0 {
				continue
			}
			free := nt.freeSlotPrivate(nt.home(mix(k), shardBits))
			nb := &nt.buckets[free/bucketSlots]
			nb.keys[free%bucketSlots] = k
			nb.masks[free%bucketSlots] = m
			if ww > 0 {
				copy(nt.wide[free*ww:free*ww+ww], wide)
			}
			n++
		}
	}
	return n
}

// freeSlotPrivate is freeSlot for a table no reader can see yet: plain loads and stores.
func (t *table) freeSlotPrivate(b uint64) int {
	for {
		bk := &t.buckets[b]
		if bk.keys[bucketSlots-1] == 0 {
			for j := 0; j < bucketSlots; j++ {
				if bk.keys[j] == 0 {
					return int(b)*bucketSlots + j
				}
			}
		}
		t.ovf[b/64] |= 1 << (b % 64)
		if b++; b == t.nb {
			b = 0
		}
	}
}

func allZero(ws []uint64) bool {
	for _, w := range ws {
		if w != 0 {
			return false
		}
	}
	return true
}
