package shard

import (
	"math/bits"
	"runtime"
	"sync/atomic"
	"unsafe"
)

// Rules of more than 64 endpoints (a fleet: hundreds to 1,024 engines) use sparse slots.
// A block is typically held by a few engines of such a fleet, so a bitmask per key (128
// bytes at 1,024 endpoints) would spend nearly all its bits on zeros. A sparse slot keeps
// the key and one 64-bit set word in the bucket, exactly where a 64-endpoint rule keeps
// its mask (4 slots per cache line, 16 bytes per slot, the same load bands and growth):
//
//   - up to sparseIDs endpoint ids, 16 bits each, stored as id+1, packed from the low
//     field up with no holes (so a zero field ends the set and 0 is the empty set);
//   - or, once a key is held by more than sparseIDs endpoints, a spill word: spillTag
//     in the top field, then a 16-bit generation and a 32-bit block index into the
//     table's spill arena, where the key's endpoint bitmask lives (Endpoints/64 words).
//     A spilled set that falls to unspillAt endpoints goes back inline, freeing the block
//     (one below sparseIDs, so a key whose holders flap around four does not take and
//     free a block on every change).
//
// Why readers stay lock-free: the set word is one atomic word in the bucket, so a reader
// of an inline set gets it whole, and the key re-check after it (as table.lookup does)
// rules out the word of a key that recycled the slot. A spilled set's words are read
// after the set word, then the set word is read again: the writer changes the set word
// before it frees the block (unspill) and a block is handed out again only with its
// generation bumped, so an unchanged set word (index and generation) means the words
// read are this key's block, each word before or after a concurrent bit store, never
// another key's. A changed one sends the reader round again (the set moved between
// inline and spilled under it); a reader that loses spillRetries rounds in a row reports
// the key absent, a transient miss, never a wrong set. The residual is a generation
// wrapping (65,536 hand-outs of one block) between a reader's two loads, nanoseconds
// apart, the same order as table.reuse's.
//
// Why blocks live in chunks that never move: the arena grows by publishing a new chunk
// (twice the last one), so readers never see a block relocated, and growth needs no
// table rebuild; a rebuild compacts the spilled sets into the new table's own arena.
const (
	sparseIDs    = 4
	sparseSlots  = 4 // slots a bucket (layoutFor), each set word whole (64 bits)
	idBits       = 16
	idField      = 1<<idBits - 1
	spillTag     = uint64(idField) << (64 - idBits) // top field all ones: the set is spilled
	unspillAt    = sparseIDs - 1                    // a spilled set this small goes back inline
	spillRetries = 4

	spillBaseShift = 4 // chunk c holds 16<<c blocks
	spillChunks    = 32
)

// An inline id (endpoint+1) must never fill a field with ones, or a set of four would
// read as a spill word: this fails to compile if MaxEndpoints outgrows 16-bit ids.
var _ [idField - 1 - MaxEndpoints]struct{}

func isSpill(w uint64) bool { return w&spillTag == spillTag }

func spillWord(idx uint32, gen uint16) uint64 {
	return spillTag | uint64(gen)<<32 | uint64(idx)
}

// inlineLen is the number of ids in an inline set word.
func inlineLen(w uint64) int { return (bits.Len64(w) + idBits - 1) / idBits }

// inlineHas reports whether an inline set word holds endpoint ep.
func inlineHas(w uint64, ep int) bool {
	id := uint64(ep + 1)
	for ; w != 0; w >>= idBits {
		if w&idField == id {
			return true
		}
	}
	return false
}

// spillArena is one table's store of spilled endpoint bitmasks. Readers index chunks
// through atomic pointers; the rest is writer-side, under the shard mutex (or private to
// an unpublished table).
type spillArena struct {
	chunks [spillChunks]atomic.Pointer[spillChunk]
	n      uint32   // blocks handed out from chunks so far (free ones included)
	free   []uint32 // blocks to hand out again
	gens   []uint16 // generation of each block's last hand-out
	bytes  atomic.Int64
}

type spillChunk struct{ w []uint64 }

// spillLoc maps a block index to its chunk and the block's position in it.
func spillLoc(idx uint32) (c, off int) {
	q := uint64(idx)>>spillBaseShift + 1
	c = bits.Len64(q) - 1
	off = int(uint64(idx) - (uint64(1)<<c-1)<<spillBaseShift)
	return c, off
}

// block returns the words of block idx (bw words per block); the chunk must exist.
func (a *spillArena) block(idx uint32, bw int) []uint64 {
	c, off := spillLoc(idx)
	ch := a.chunks[c&(spillChunks-1)].Load()
	return ch.w[off*bw : off*bw+bw]
}

// alloc hands out a cleared block and the spill word naming it. Writer-side.
func (a *spillArena) alloc(bw int) (idx uint32, w uint64) {
	if n := len(a.free); n > 0 {
		idx = a.free[n-1]
		a.free = a.free[:n-1]
	} else {
		idx = a.n
		a.n++
		if c, off := spillLoc(idx); off == 0 {
			blocks := 1 << spillBaseShift << c
			a.chunks[c].Store(&spillChunk{w: make([]uint64, blocks*bw)})
			// The words, plus the generation and free-list entries the blocks will need.
			a.bytes.Add(int64(blocks*bw)*8 + int64(blocks)*6 + 32)
		}
		a.gens = append(a.gens, 0)
	}
	a.gens[idx]++
	// A recycled block still holds its last owner's bits; that owner's readers re-check
	// its set word, which no longer names this block, so clearing cannot mislead them.
	for i, blk := 0, a.block(idx, bw); i < bw; i++ {
		atomic.StoreUint64(&blk[i], 0)
	}
	return idx, spillWord(idx, a.gens[idx])
}

// release returns a block no set word names any more. Writer-side.
func (a *spillArena) release(w uint64) { a.free = append(a.free, uint32(w)) }

// setWordAt returns slot's set word (a sparse table's in-bucket word; never key 0).
func (t *table) setWordAt(slot int) *uint64 {
	return &t.buckets[slot>>slotShift][(t.kpb+slot&(1<<slotShift-1))&(bucketWords-1)]
}

// sparseHas reports whether slot's set holds ep. Writers call it under the shard mutex;
// lock-free readers (Keys) get sparseLookup's guarantee for the set word: a spilled
// set's bit is taken only if the set word still names the same block afterwards.
func (t *table) sparseHas(slot, ep int) bool {
	p := t.setWordAt(slot)
	for try := 0; try < spillRetries; try++ {
		w := atomic.LoadUint64(p)
		runtime.KeepAlive(t)
		if !isSpill(w) {
			return inlineHas(w, ep)
		}
		blk := t.spill.block(uint32(w), t.bw)
		has := atomic.LoadUint64(&blk[ep>>6])&(1<<(uint(ep)&63)) != 0
		again := atomic.LoadUint64(p)
		runtime.KeepAlive(t) // its buckets may be a mapping unmapped with it
		if again == w {
			return has
		}
	}
	return false
}

// sparseAdd adds ep, not held, to slot's set, spilling a full inline set. Writer-side.
func (t *table) sparseAdd(slot, ep int) {
	p := t.setWordAt(slot)
	w := atomic.LoadUint64(p)
	if isSpill(w) {
		q := &t.spill.block(uint32(w), t.bw)[ep>>6]
		atomic.StoreUint64(q, atomic.LoadUint64(q)|1<<(uint(ep)&63))
		return
	}
	if n := inlineLen(w); n < sparseIDs {
		atomic.StoreUint64(p, w|uint64(ep+1)<<(n*idBits))
		return
	}
	// Fill the block before the set word names it: a reader that sees the spill word
	// sees the block's bits.
	idx, sw := t.spill.alloc(t.bw)
	blk := t.spill.block(idx, t.bw)
	for x := w; x != 0; x >>= idBits {
		e := int(x&idField) - 1
		atomic.StoreUint64(&blk[e>>6], blk[e>>6]|1<<(uint(e)&63))
	}
	atomic.StoreUint64(&blk[ep>>6], blk[ep>>6]|1<<(uint(ep)&63))
	atomic.StoreUint64(p, sw)
	t.spilled.Add(1)
}

// sparseRemove removes ep, held, from slot's set; a spilled set left with unspillAt
// endpoints or fewer goes back inline. Writer-side.
func (t *table) sparseRemove(slot, ep int) {
	p := t.setWordAt(slot)
	w := atomic.LoadUint64(p)
	if !isSpill(w) {
		// Move the last id into ep's field, so the set stays packed from the low field.
		n := inlineLen(w)
		last := (n - 1) * idBits
		lastID := w >> last & idField
		for f := 0; f < n*idBits; f += idBits {
			if w>>f&idField == uint64(ep+1) {
				w = w&^(idField<<f) | lastID<<f
				break
			}
		}
		atomic.StoreUint64(p, w&^(idField<<last))
		return
	}
	blk := t.spill.block(uint32(w), t.bw)
	q := &blk[ep>>6]
	atomic.StoreUint64(q, atomic.LoadUint64(q)&^(1<<(uint(ep)&63)))
	n := 0
	for _, x := range blk {
		n += bits.OnesCount64(x)
	}
	if n > unspillAt {
		return
	}
	in := uint64(0)
	f := 0
	for i, x := range blk {
		for ; x != 0; x &= x - 1 {
			in |= uint64(i*64+bits.TrailingZeros64(x)+1) << f
			f += idBits
		}
	}
	atomic.StoreUint64(p, in) // before release: the block's next owner bumps its generation
	t.spill.release(w)
	t.spilled.Add(-1)
}

// sparseLookup reads key's endpoint set for a reader: it returns the inline set word,
// or a spill word with the set's bitmask read into m (key 0's mask always comes that
// way), and whether key is present with a non-empty set. Lock-free (see the top of
// this file for the argument).
func (t *table) sparseLookup(key, b uint64, m *[maxWords]uint64) (uint64, bool) {
	// A sparse table's in-bucket word is the set word, so probe (and its key re-check)
	// serves inline sets, the common case, as it serves masks.
	w, slot := t.probe(key, b)
	if !isSpill(w) && slot != zeroSlot {
		return w, w != 0
	}
	return t.spilledSet(key, slot, m)
}

// pastSlot is probeHome's slot for a key its home bucket, full, does not hold: the key
// may lie further on the probe run, if an insert ever passed the bucket (overflowed).
const pastSlot = -3

// probeHome is probe's first step for a sparse table's reader (key not 0), over the home
// bucket b alone: key's set word and slot, noSlot when the key is absent, or pastSlot
// when the bucket is full without it. Lock-free as probe is: the set word counts only if
// the key still reads as ours after it. A sparse table's bucket has sparseSlots slots,
// slot j's set word whole in word sparseSlots+j: the walk has constant bounds and no
// mask arithmetic.
func (t *table) probeHome(key, b uint64) (set uint64, slot int) {
	bk := &t.buckets[b]
	for j := 0; j < sparseSlots; j++ {
		k := atomic.LoadUint64(&bk[j])
		if k == key {
			w := atomic.LoadUint64(&bk[sparseSlots+j])
			again := atomic.LoadUint64(&bk[j])
			runtime.KeepAlive(t) // its buckets may be a mapping unmapped with it
			if again != key {
				return 0, noSlot // a tombstone's slot since reused or emptied: absent
			}
			return w, slotOf(b, j)
		}
		if k == 0 {
			runtime.KeepAlive(t)
			return 0, noSlot
		}
	}
	runtime.KeepAlive(t)
	return 0, pastSlot
}

// spilledSet reads the bitmask of key's spilled set in slot (probe found its spill word
// there; zeroSlot: key 0's mask) into m, returning the spill word, or the set word if
// the set went back inline meanwhile, and whether key is present with a non-empty set.
// Lock-free: the block's words count only if the set word still names the block after
// them, and the key re-check rules out a slot another key recycled.
func (t *table) spilledSet(key uint64, slot int, m *[maxWords]uint64) (uint64, bool) {
	if slot == zeroSlot {
		any := uint64(0)
		for i := 0; i < t.bw; i++ {
			m[i&(maxWords-1)] = atomic.LoadUint64(&t.zero[i])
			any |= m[i&(maxWords-1)]
		}
		return spillTag, any != 0
	}
	kp := &t.buckets[slot>>slotShift][slot&(1<<slotShift-1)]
	p := t.setWordAt(slot)
	for try := 0; try < spillRetries; try++ {
		w := atomic.LoadUint64(p)
		if isSpill(w) {
			blk := t.spill.block(uint32(w), t.bw)
			for i := range blk {
				m[i&(maxWords-1)] = atomic.LoadUint64(&blk[i])
			}
			if atomic.LoadUint64(p) != w {
				continue // the set moved under us: read it again
			}
		}
		again := atomic.LoadUint64(kp)
		runtime.KeepAlive(t) // its buckets may be a mapping unmapped with it
		if again != key {
			return 0, false // our key was a tombstone, now reused or emptied: absent
		}
		return w, w != 0
	}
	return 0, false
}

// prefetchSpilled prefetches the bitmask block a spill word w of t names.
func (t *table) prefetchSpilled(w uint64) {
	blk := t.spill.block(uint32(w), t.bw)
	for i := 0; i < len(blk); i += bucketWords {
		prefetch(unsafe.Pointer(&blk[i]))
	}
}
