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
	// hence aligned). Eight ways rather than one line's four: a growing table meets its
	// first full set at a higher load, so it ends 4x smaller (2,000 hashes: 128 KiB
	// instead of 512), and a full-size one evicts half as often.
	refWays = 8
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
// routed tiers is gone. A full set evicts round-robin once the table has its full
// capacity: the evicted hash is forgotten (counted), and its later removal is applied
// as if it had one holder, which is what ingest did before counting.
//
// Why it grows (doubling its sets whenever a set is full below capacity) instead of
// being allocated whole: one table per endpoint at the default capacity is 2 MiB, so a
// fleet rule of 1,024 endpoints held 2 GiB of tables however few blocks its engines
// announced, and every event's lookups landed in a 2 GiB working set. Growth re-inserts
// the entries (amortised O(1) per store); nothing allocates once an endpoint's size
// has settled.
type refTable struct {
	ents    []refEntry
	mask    uint64
	sets    int // sets allocated (or to allocate at the first store)
	cap     int // capacity in entries: the table grows up to it
	victim  uint32
	evicted uint64 // live entries dropped from a full set
	sink    uint64 // touch's result, so the compiler keeps its loads
}

// refMinSets is the sets a table starts with: 8 KiB.
const refMinSets = 64

func newRefTable(capacity int) refTable {
	sets := 1
	for sets*refWays < capacity {
		sets <<= 1
	}
	first := min(sets, refMinSets)
	return refTable{cap: sets * refWays, sets: first, mask: uint64(first - 1)}
}

// grow doubles the sets and re-inserts every entry. Doubling splits each set in two, so
// no re-inserted entry meets a full set.
func (t *refTable) grow() {
	old := t.ents
	t.sets *= 2
	t.mask = uint64(t.sets - 1)
	t.ents = make([]refEntry, t.sets*refWays)
	for _, e := range old {
		if e.counts == 0 {
			continue
		}
		for s, i := t.set(e.key), 0; i < refWays; i++ {
			if s[i].counts == 0 {
				s[i] = e
				break
			}
		}
	}
}

func (t *refTable) set(k uint64) []refEntry {
	i := ((k * 0xD6E8FEB86659FD93) >> 32) & t.mask
	return t.ents[i*refWays : i*refWays+refWays : i*refWays+refWays]
}

// inc records one more holder of k on tier m. It reports whether k is new on m (so the
// tier's distinct-key count grows) and, when a full set had to drop a live entry, that
// entry's holders (its tiers' counts shrink).
func (t *refTable) inc(k uint64, m Medium) (newOnTier bool, dropped Media) {
	if t.ents == nil {
		t.ents = make([]refEntry, t.sets*refWays)
	}
	s := t.set(k)
	free := -1
	for i := range s {
		if s[i].counts == 0 {
			if free < 0 {
				free = i
			}
			continue
		}
		if s[i].key == k {
			c := s[i].count(m)
			if c < refMax {
				s[i].counts += 1 << (refBits * m)
			}
			return c == 0, 0
		}
	}
	if free < 0 && t.sets*refWays < t.cap {
		t.grow()
		return t.inc(k, m)
	}
	if free < 0 {
		t.victim++
		free = int(t.victim % refWays)
		dropped = s[free].holders()
		t.evicted++
	}
	s[free] = refEntry{key: k, counts: 1 << (refBits * m)}
	return true, dropped
}

// dec records that one holder of k on tier m is gone. known is false when k has no
// entry (never seen, or dropped from a full set): the caller then treats it as the last
// holder. goneFromTier: m holds k no more. left: the tiers still holding k.
func (t *refTable) dec(k uint64, m Medium) (known, goneFromTier bool, left Media) {
	if t.ents == nil {
		return false, true, 0
	}
	s := t.set(k)
	for i := range s {
		e := &s[i]
		if e.counts == 0 || e.key != k {
			continue
		}
		switch c := e.count(m); c {
		case 0: // a removal with no store on this tier: nothing to take away
			return true, false, e.holders()
		case refMax: // saturated: stays
		default:
			e.counts -= 1 << (refBits * m)
		}
		return true, e.count(m) == 0, e.holders()
	}
	return false, true, 0
}

// touch loads the set of every key before the caller walks them one by one: the loads
// are independent, so their cache misses overlap instead of queueing behind each
// update (Go has no prefetch instruction; a read it cannot drop does the same).
func (t *refTable) touch(keys []uint64) {
	if t.ents == nil {
		return
	}
	var x uint64
	for _, k := range keys {
		x += t.set(k)[0].counts
	}
	t.sink = x
}

// reset forgets every hash, and the table's memory with them: it grows again from
// refMinSets with the endpoint's next stores.
func (t *refTable) reset() {
	t.ents = nil
	t.sets = min(t.cap/refWays, refMinSets)
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
