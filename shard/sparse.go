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
//     in the top field, then a 16-bit generation and a 32-bit block index into one of
//     the table's two arenas: up to listIDs endpoints, a list block (listWords words of
//     16-bit fields, each an id+1 or 0, holes allowed); more, a bitmask block
//     (Endpoints/64 words). Why two: in a fleet most spilled sets are a few holders
//     past sparseIDs (hot prefixes cached by 5-8 engines), and a bitmask spends 128
//     bytes at 1,024 endpoints where a list spends 16 (at 100M entries, 260 MB of
//     bitmask blocks against ~35 MB).
//     A set that falls one below its form's capacity goes back to the smaller form,
//     freeing its block: a bitmask at relistAt endpoints becomes a list, a list at
//     unspillAt goes back inline (so a key whose holders flap around a capacity does
//     not take and free a block on every change).
//
// Why readers stay lock-free: the set word is one atomic word in the bucket, so a reader
// of an inline set gets it whole, and the key re-check after it (as table.lookup does)
// rules out the word of a key that recycled the slot. A spilled set's words are read
// after the set word, then the set word is read again: the writer changes the set word
// before it frees the block (unspill) and a block is handed out again only with its
// generation bumped, so an unchanged set word (index and generation) means the words
// read are this key's block, each word before or after a concurrent bit store, never
// another key's. A list changes as a bitmask does, one id per store: an add fills an
// empty field, a remove empties the id's field (the holes are why a list is not packed
// as an inline set is: moving an id between two words would take two stores, and a
// reader between them could miss an id held throughout). A changed set word sends the
// reader round again (the set moved to another form or block under it); a reader that
// loses spillRetries rounds in a row reports the key absent, a transient miss, never a
// wrong set. The residual is a generation wrapping (65,536 hand-outs of one block)
// between a reader's two loads, nanoseconds apart, the same order as table.reuse's.
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

	listIDs   = 8               // ids in a list block
	listWords = listIDs / 4     // 16-bit ids, four a word
	listBit   = uint32(1) << 31 // in a spill word's index: a list block
	relistAt  = listIDs - 1     // a bitmask set this small goes back to a list
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

// orIDs sets in m the bit of every endpoint whose id+1 fills a field of w: an inline set
// word, or a word of a list block (whose zero fields are holes, skipped).
func orIDs(m *[maxWords]uint64, w uint64) {
	for ; w != 0; w >>= idBits {
		if f := w & idField; f != 0 {
			e := int(f) - 1
			m[e>>6&(maxWords-1)] |= 1 << (uint(e) & 63)
		}
	}
}

// isList reports whether spill word w names a list block (else a bitmask block).
func isList(w uint64) bool { return uint32(w)&listBit != 0 }

// spillBlock returns the words of the block spill word w names: a list's listWords or a
// bitmask's bw.
func (t *table) spillBlock(w uint64) []uint64 {
	if isList(w) {
		return t.lists.block(uint32(w)&^listBit, listWords)
	}
	return t.spill.block(uint32(w), t.bw)
}

// allocSpill hands out a cleared block, a list or a bitmask, and the spill word naming
// it. Writer-side.
func (t *table) allocSpill(list bool) ([]uint64, uint64) {
	if list {
		idx, w := t.lists.alloc(listWords)
		return t.lists.block(idx, listWords), w | uint64(listBit)
	}
	idx, w := t.spill.alloc(t.bw)
	return t.spill.block(idx, t.bw), w
}

// releaseSpill frees the block spill word w names, which no set word names any more.
// Writer-side.
func (t *table) releaseSpill(w uint64) {
	if isList(w) {
		t.lists.release(w &^ uint64(listBit))
		return
	}
	t.spill.release(w)
}

// spillArena is one table's store of spilled endpoint sets (lists or bitmasks). Readers
// index chunks through atomic pointers; the rest is writer-side, under the shard mutex
// (or private to an unpublished table).
type spillArena struct {
	chunks [spillChunks]atomic.Pointer[spillChunk]
	n      uint32   // blocks handed out from chunks so far (free ones included)
	free   []uint32 // blocks to hand out again
	gens   []uint16 // generation of each block's last hand-out
	bytes  atomic.Int64
}

// spillChunk is one chunk of an arena's blocks. Chunks of spillMapBytes and up are
// mappings off the Go heap (thp_linux.go), unmapped once the chunk is unreachable: at
// 100M entries over 1,024 endpoints the arenas hold ~260 MB, which on the heap doubled
// the collector's goal (a heap the size of the live index's spill plus as much garbage)
// for words that hold no pointers. mapped says which.
type spillChunk struct {
	w      []uint64
	mapped bool
}

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
			a.chunks[c].Store(newSpillChunk(blocks * bw))
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
// set's words are taken only if the set word still names the same block afterwards.
func (t *table) sparseHas(slot, ep int) bool {
	p := t.setWordAt(slot)
	for try := 0; try < spillRetries; try++ {
		w := atomic.LoadUint64(p)
		runtime.KeepAlive(t)
		if !isSpill(w) {
			return inlineHas(w, ep)
		}
		blk := t.spillBlock(w)
		var has bool
		if isList(w) {
			has = inlineHas(atomic.LoadUint64(&blk[0]), ep) || inlineHas(atomic.LoadUint64(&blk[1]), ep)
		} else {
			has = atomic.LoadUint64(&blk[ep>>6])&(1<<(uint(ep)&63)) != 0
		}
		again := atomic.LoadUint64(p)
		runtime.KeepAlive(t) // its buckets may be a mapping unmapped with it
		if again == w {
			return has
		}
	}
	return false
}

// idList is a spilled set's ids (id+1 fields), gathered by a writer to move the set to
// another form.
type idList struct {
	n   int
	ids [listIDs + 1]uint64
}

// addWord appends the ids of an inline word or a list block's word (skipping holes).
func (l *idList) addWord(w uint64) {
	for ; w != 0; w >>= idBits {
		if f := w & idField; f != 0 && l.n < len(l.ids) {
			l.ids[l.n] = f
			l.n++
		}
	}
}

// word packs ids [from, from+4) into a word, from the low field up.
func (l *idList) word(from int) uint64 {
	w := uint64(0)
	for i := from; i < min(from+sparseIDs, l.n); i++ {
		w |= l.ids[i] << ((i - from) * idBits)
	}
	return w
}

// respill moves the set of set word *p (w, spilled) to the ids of l in another form:
// inline up to unspillAt, a list up to listIDs, else a bitmask. Writer-side: the new
// form is filled before the set word names it, and the old block freed after.
func (t *table) respill(p *uint64, w uint64, l *idList) {
	var nw uint64
	switch {
	case l.n <= unspillAt:
		nw = l.word(0)
		t.spilled.Add(-1)
	case l.n <= listIDs:
		var blk []uint64
		blk, nw = t.allocSpill(true)
		atomic.StoreUint64(&blk[0], l.word(0))
		atomic.StoreUint64(&blk[1], l.word(sparseIDs))
	default:
		var blk []uint64
		blk, nw = t.allocSpill(false)
		for _, id := range l.ids[:l.n] {
			e := int(id) - 1
			atomic.StoreUint64(&blk[e>>6], blk[e>>6]|1<<(uint(e)&63))
		}
	}
	atomic.StoreUint64(p, nw) // before release: the block's next owner bumps its generation
	t.releaseSpill(w)
}

// listField finds the first field of list block blk holding f (an id+1, or 0: an empty
// field): its word and shift, ok false when no field does.
func listField(blk []uint64, f uint64) (i int, sh uint, ok bool) {
	for i := range blk[:listWords] {
		for sh := uint(0); sh < 64; sh += idBits {
			if blk[i]>>sh&idField == f {
				return i, sh, true
			}
		}
	}
	return 0, 0, false
}

// sparseAdd adds ep, not held, to slot's set, spilling a full inline set to a list and
// a full list to a bitmask. Writer-side.
func (t *table) sparseAdd(slot, ep int) {
	p := t.setWordAt(slot)
	w := atomic.LoadUint64(p)
	if isSpill(w) {
		blk := t.spillBlock(w)
		if !isList(w) {
			q := &blk[ep>>6]
			atomic.StoreUint64(q, atomic.LoadUint64(q)|1<<(uint(ep)&63))
			return
		}
		if i, sh, ok := listField(blk, 0); ok {
			atomic.StoreUint64(&blk[i], blk[i]|uint64(ep+1)<<sh)
			return
		}
		var l idList // full: to a bitmask
		l.addWord(blk[0])
		l.addWord(blk[1])
		l.ids[l.n] = uint64(ep + 1)
		l.n++
		t.respill(p, w, &l)
		return
	}
	if n := inlineLen(w); n < sparseIDs {
		atomic.StoreUint64(p, w|uint64(ep+1)<<(n*idBits))
		return
	}
	// Fill the block before the set word names it: a reader that sees the spill word
	// sees the block's ids.
	blk, sw := t.allocSpill(true)
	atomic.StoreUint64(&blk[0], w)
	atomic.StoreUint64(&blk[1], uint64(ep+1))
	atomic.StoreUint64(p, sw)
	t.spilled.Add(1)
}

// sparseRemove removes ep, held, from slot's set; a set one below its form's capacity
// goes to the smaller form (respill). Writer-side.
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
	blk := t.spillBlock(w)
	var l idList
	if isList(w) {
		if i, sh, ok := listField(blk, uint64(ep+1)); ok {
			atomic.StoreUint64(&blk[i], blk[i]&^(idField<<sh))
		}
		l.addWord(blk[0])
		l.addWord(blk[1])
		if l.n > unspillAt {
			return
		}
		t.respill(p, w, &l)
		return
	}
	q := &blk[ep>>6]
	atomic.StoreUint64(q, atomic.LoadUint64(q)&^(1<<(uint(ep)&63)))
	n := 0
	for _, x := range blk {
		n += bits.OnesCount64(x)
	}
	if n > relistAt {
		return
	}
	for i, x := range blk {
		for ; x != 0; x &= x - 1 {
			l.ids[l.n] = uint64(i*64 + bits.TrailingZeros64(x) + 1)
			l.n++
		}
	}
	t.respill(p, w, &l)
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
			blk := t.spillBlock(w)
			if isList(w) {
				clear(m[:t.bw])
				orIDs(m, atomic.LoadUint64(&blk[0]))
				orIDs(m, atomic.LoadUint64(&blk[1]))
			} else {
				for i := range blk {
					m[i&(maxWords-1)] = atomic.LoadUint64(&blk[i])
				}
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

// prefetchSpilled prefetches the block a spill word w of t names.
func (t *table) prefetchSpilled(w uint64) {
	blk := t.spillBlock(w)
	for i := 0; i < len(blk); i += bucketWords {
		prefetch(unsafe.Pointer(&blk[i]))
	}
}
