package ingest

// refEntry counts one engine block hash's holders on each tier: the stores announced
// and not yet removed. One hash can have several holders on a tier: vLLM does not
// de-duplicate identical blocks (two requests filling the same block each store it and
// each eviction removes one), every KV cache group of a hybrid model stores the blocks
// it keeps, and an offloading connector may announce a hash once per chunk.
type refEntry struct {
	key   uint64
	count [numMedia]uint16 // saturating: a saturated count never reaches zero again
	used  bool
}

const refWays = 8

// refTable is a bounded set-associative map engine hash -> holders per tier, so that a
// BlockRemoved reaches the inventory only when the last holder of that hash on the
// routed tiers is gone. A full set evicts round-robin: the evicted hash is forgotten
// (counted), and its later removal is applied as if it had one holder, which is what
// ingest did before counting. No allocation after the first store.
type refTable struct {
	ents    []refEntry
	mask    uint64
	cap     int
	victim  uint32
	evicted uint64 // live entries dropped from a full set
}

func newRefTable(capacity int) refTable {
	sets := 1
	for sets*refWays < capacity {
		sets <<= 1
	}
	return refTable{cap: sets * refWays, mask: uint64(sets - 1)}
}

func (t *refTable) set(k uint64) []refEntry {
	i := ((k * 0xD6E8FEB86659FD93) >> 32) & t.mask
	return t.ents[i*refWays : i*refWays+refWays]
}

func (t *refTable) find(k uint64) *refEntry {
	if t.ents == nil {
		return nil
	}
	s := t.set(k)
	for i := range s {
		if s[i].used && s[i].key == k {
			return &s[i]
		}
	}
	return nil
}

// inc records one more holder of k on tier m. It reports whether k is new on m (so the
// tier's distinct-key count grows) and, when a full set had to drop a live entry, that
// entry's holders (its tiers' counts shrink).
func (t *refTable) inc(k uint64, m Medium) (newOnTier bool, dropped Media) {
	if t.ents == nil {
		t.ents = make([]refEntry, t.cap)
	}
	s := t.set(k)
	free := -1
	for i := range s {
		if !s[i].used {
			if free < 0 {
				free = i
			}
			continue
		}
		if s[i].key == k {
			c := &s[i].count[m]
			if *c < ^uint16(0) {
				*c++
			}
			return *c == 1, 0
		}
	}
	if free < 0 {
		t.victim++
		free = int(t.victim % refWays)
		dropped = s[free].holders()
		t.evicted++
	}
	s[free] = refEntry{key: k, used: true}
	s[free].count[m] = 1
	return true, dropped
}

// dec records that one holder of k on tier m is gone. known is false when k has no
// entry (never seen, or dropped from a full set): the caller then treats it as the last
// holder. goneFromTier: m holds k no more. left: the tiers still holding k.
func (t *refTable) dec(k uint64, m Medium) (known, goneFromTier bool, left Media) {
	e := t.find(k)
	if e == nil {
		return false, true, 0
	}
	c := &e.count[m]
	switch {
	case *c == 0: // a removal with no store on this tier: nothing to take away
		return true, false, e.holders()
	case *c < ^uint16(0):
		*c--
	}
	left = e.holders()
	if left == 0 {
		*e = refEntry{}
	}
	return true, *c == 0, left
}

// holders is the set of tiers with a holder of e.
func (e *refEntry) holders() Media {
	var m Media
	for i, c := range e.count {
		if c > 0 {
			m |= 1 << i
		}
	}
	return m
}

func (t *refTable) reset() { clear(t.ents) }
