package ingest

// refEntry counts one engine block hash's holders on each tier: the stores announced
// and not yet removed. One hash can have several holders on a tier: vLLM does not
// de-duplicate identical blocks (two requests filling the same block each store it and
// each eviction removes one), every KV cache group of a hybrid model stores the blocks
// it keeps, and an offloading connector may announce a hash once per chunk.
//
// The counts are refBits-bit fields of one word, one per tier, saturating: a saturated
// count never reaches zero again. An entry whose counts are all zero is free.
type refEntry struct {
	key    uint64
	counts uint64
}

const (
	refBits = 12
	refMax  = 1<<refBits - 1
	// refWays entries of 16 bytes: two adjacent 64-byte cache lines per set (the
	// second comes with the first's adjacent-line prefetch; tables are allocated whole,
	// hence aligned). The first entry is the set's header (its key field is the set's
	// spill, see refTable), in the same line as the first ways, so a lookup that stops
	// at its home set reads no other memory; the other refSlots are the set's ways.
	// Seven ways rather than one line's three: fewer full sets, fewer probes past them.
	refWays  = 8
	refSlots = refWays - 1
)

func (e *refEntry) count(m Medium) uint64 { return e.counts >> (refBits * m) & refMax }

// holders is the set of tiers with a holder of e.
func (e *refEntry) holders() Media {
	var s Media
	for m := Medium(0); m < numMedia; m++ {
		if e.count(m) != 0 {
			s |= 1 << m
		}
	}
	return s
}

// refTable is a bounded set-associative map engine hash -> holders per tier, so that a
// BlockRemoved reaches the inventory only when the last holder of that hash on the
// routed tiers is gone. A hash lives in its home set or, when that set is full, in one of
// the next few (linear probing over sets): spill counts, per set, the live entries
// stored past it whose probe went through it, so a lookup stops at the first set on its
// way with no spill (one set, nearly always). At full capacity, a hash that finds no
// free slot within refMaxProbe sets evicts round-robin from its home set: the evicted
// hash is forgotten (counted), and its later removal is applied as if it had one
// holder, which is what ingest did before counting. A rank that keeps singles
// (rankState.singles) has entries only for hashes with a second holder: under churn
// its table stays empty and unallocated.
//
// Why it grows (doubling its sets once its entries pass half its slots) instead of
// being allocated whole: one table per endpoint at the default capacity is 2 MiB, so a
// fleet rule of 1,024 endpoints held 2 GiB of tables however few blocks its engines
// announced, and every event's lookups landed in a 2 GiB working set. Why by load and
// not at the first full set, as it did: under churn every store is a fresh draw, so
// sooner or later one meets a full set at any size where sets average more than a
// fraction of an entry: 2,000 churning hashes grew a table to 4,096 sets (512 KiB, 6%
// full) over about 250k stores, re-allocating all the way (1,024 such endpoints: 512
// MiB, most of kvgate's heap, and two thirds of what it allocated while churning).
// Growth re-inserts the entries (amortised O(1) per store); nothing allocates once an
// endpoint's size has settled.
type refTable struct {
	ents    []refEntry // sets of refWays: a header (spill) and refSlots ways
	mask    uint64
	sets    int // sets allocated (or to allocate at the first store)
	live    int // entries in use
	cap     int // capacity in entries: the table grows up to it
	victim  uint32
	evicted uint64 // live entries dropped from a full set
	sink    uint64 // touch's result, so the compiler keeps its loads
}

// refMinSets is the sets a table starts with: 8 KiB.
const refMinSets = 64

// refMaxProbe bounds how many sets past its home a store looks for a free slot before
// it grows the table (or, at capacity, evicts): a lookup walks at most that far.
const refMaxProbe = 8

func newRefTable(capacity int) refTable {
	sets := 1 // the sets of capacity 16-byte entries, headers included: the memory bound
	for sets*refWays < capacity {
		sets <<= 1
	}
	first := min(sets, refMinSets)
	return refTable{cap: sets * refSlots, sets: first, mask: uint64(first - 1)}
}

func (t *refTable) alloc() {
	t.ents = make([]refEntry, t.sets*refWays)
	t.live = 0
}

// slots is the ways of the table as allocated (or as it will be).
func (t *refTable) slots() int { return t.sets * refSlots }

// spill is set i's count of live entries stored past it whose probe passed through it.
func (t *refTable) spill(i uint64) *uint64 { return &t.ents[i*refWays].key }

// grow doubles the sets and re-inserts every entry.
func (t *refTable) grow() {
	old := t.ents
	t.sets *= 2
	t.mask = uint64(t.sets - 1)
	t.alloc()
	for _, e := range old {
		if e.counts != 0 { // a header's counts are 0
			t.place(e, t.sets) // a table at most a quarter full has a free slot
		}
	}
}

func (t *refTable) home(k uint64) uint64 { return ((k * 0xD6E8FEB86659FD93) >> 32) & t.mask }

// set is set i's ways.
func (t *refTable) set(i uint64) []refEntry {
	return t.ents[i*refWays+1 : i*refWays+refWays : i*refWays+refWays]
}

// locate finds k's entry: way j of set i.
func (t *refTable) locate(k uint64) (i uint64, j int, ok bool) {
	if t.live == 0 {
		return 0, 0, false // (an empty table: the common case where ranks hold hashes once)
	}
	i = t.home(k)
	for d := 0; d < t.sets; d++ {
		s := t.set(i)
		for j := range s {
			if s[j].key == k && s[j].counts != 0 {
				return i, j, true
			}
		}
		if *t.spill(i) == 0 {
			break
		}
		i = (i + 1) & t.mask
	}
	return 0, 0, false
}

// find returns k's entry, or nil.
func (t *refTable) find(k uint64) *refEntry {
	i, j, ok := t.locate(k)
	if !ok {
		return nil
	}
	return &t.set(i)[j]
}

// place stores e (a key not in the table) in the first free slot within limit sets of
// its home, counting it in the spill of the sets it passes; false when there is none.
func (t *refTable) place(e refEntry, limit int) bool {
	h := t.home(e.key)
	i := h
	for d := 0; d < limit; d++ {
		s := t.set(i)
		for j := range s {
			if s[j].counts == 0 {
				s[j] = e
				t.live++
				for p := h; p != i; p = (p + 1) & t.mask {
					*t.spill(p)++
				}
				return true
			}
		}
		i = (i + 1) & t.mask
	}
	return false
}

// free empties the entry in slot j of set i, taking it off the spill of the sets its
// probe passed.
func (t *refTable) free(i uint64, j int) {
	s := t.set(i)
	for p := t.home(s[j].key); p != i; p = (p + 1) & t.mask {
		*t.spill(p)--
	}
	s[j] = refEntry{}
	t.live--
}

// inc records one more holder of k on tier m. It reports whether k is new on m (so the
// tier's distinct-key count grows) and, when a full set had to drop a live entry, that
// entry's holders (its tiers' counts shrink).
func (t *refTable) inc(k uint64, m Medium) (newOnTier bool, dropped Media) {
	if t.ents == nil {
		t.alloc()
	}
	if e := t.find(k); e != nil {
		c := e.count(m)
		if c < refMax {
			e.counts += 1 << (refBits * m)
		}
		return c == 0, 0
	}
	e := refEntry{key: k, counts: 1 << (refBits * m)}
	canGrow := t.slots() < t.cap
	if canGrow && 2*(t.live+1) > t.slots() {
		t.grow()
	}
	for !t.place(e, min(refMaxProbe, t.sets)) {
		if canGrow = t.slots() < t.cap; canGrow {
			t.grow()
			continue
		}
		// Full: evict from the home set, round-robin.
		h := t.home(k)
		t.victim++
		j := int(t.victim % refSlots)
		dropped = t.set(h)[j].holders()
		t.evicted++
		t.free(h, j)
	}
	return true, dropped
}

// dec records that one holder of k on tier m is gone. known is false when k has no
// entry (never seen, or dropped from a full set): the caller then treats it as the last
// holder. goneFromTier: m holds k no more. left: the tiers still holding k.
func (t *refTable) dec(k uint64, m Medium) (known, goneFromTier bool, left Media) {
	i, j, ok := t.locate(k)
	if !ok {
		return false, true, 0
	}
	e := &t.set(i)[j]
	switch c := e.count(m); c {
	case 0: // a removal with no store on this tier: nothing to take away
		return true, false, e.holders()
	case refMax: // saturated: stays
	default:
		e.counts -= 1 << (refBits * m)
	}
	gone, left := e.count(m) == 0, e.holders()
	if e.counts == 0 {
		t.free(i, j)
	}
	return true, gone, left
}

// dropSingle frees k's entry when it counts exactly one holder, on tier m, and reports
// whether it did: that hash is then held once on m, which the caller records elsewhere
// (rankState.singles).
func (t *refTable) dropSingle(k uint64, m Medium) bool {
	i, j, ok := t.locate(k)
	if !ok || t.set(i)[j].counts != 1<<(refBits*m) {
		return false
	}
	t.free(i, j)
	return true
}

// touch loads the set of every key before the caller walks them one by one: the loads
// are independent, so their cache misses overlap instead of queueing behind each
// update (Go has no prefetch instruction; a read it cannot drop does the same).
func (t *refTable) touch(keys []uint64) {
	if t.live == 0 {
		return
	}
	var x uint64
	for _, k := range keys {
		x += *t.spill(t.home(k)) // the header and the first ways: one line
	}
	t.sink = x
}

// reset forgets every hash, and the table's memory with them: it grows again from
// refMinSets with the endpoint's next stores.
func (t *refTable) reset() {
	t.ents, t.live = nil, 0
	t.sets = min(t.cap/refSlots, refMinSets)
	t.mask = uint64(t.sets - 1)
}

// countTiers adds, per tier, the hashes the table holds there to n.
func (t *refTable) countTiers(n *[numMedia]int64) {
	for i := range t.ents {
		if t.ents[i].counts == 0 {
			continue
		}
		for m := Medium(0); m < numMedia; m++ {
			if t.ents[i].count(m) != 0 {
				n[m]++
			}
		}
	}
}
