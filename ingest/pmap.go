package ingest

import "github.com/kvgate/kvgate/hashcore"

// blockEntry is what kvgate remembers about one block an engine announced: the rule's
// full digest (to continue the chain when a later event names it as parent), kvgate's
// fast key and digest (to index, and to remove on BlockRemoved, in re-hash mode).
type blockEntry struct {
	key   uint64 // the engine's block hash
	fkey  uint64 // kvgate's fast key
	cd    hashcore.Digest
	fd    hashcore.Digest
	used  bool
	hasC  bool // cd is valid
	hasF  bool // fkey/fd are valid
	level int8 // TensorRT-LLM cache level (0 = GPU); ZeroMQ engines: 1 = held on unrouted tiers only
}

const blockWays = 4

// blockMap is a bounded set-associative map engine-hash -> blockEntry. A full set evicts
// round-robin: a forgotten block only costs a later chain its parent (counted as an
// orphan) or leaves a stale key to the inventory's own bound. No allocation after the
// first insert.
type blockMap struct {
	ents   []blockEntry
	mask   uint64
	cap    int
	victim uint32
	n      int
}

func newBlockMap(capacity int) blockMap {
	if capacity < blockWays {
		capacity = blockWays
	}
	sets := 1
	for sets*blockWays < capacity {
		sets <<= 1
	}
	return blockMap{cap: sets * blockWays, mask: uint64(sets - 1)}
}

func (m *blockMap) set(k uint64) []blockEntry {
	i := ((k * 0x9E3779B97F4A7C15) >> 29) & m.mask
	return m.ents[i*blockWays : i*blockWays+blockWays]
}

func (m *blockMap) get(k uint64) *blockEntry {
	if m.ents == nil {
		return nil
	}
	s := m.set(k)
	for i := range s {
		if s[i].used && s[i].key == k {
			return &s[i]
		}
	}
	return nil
}

// put returns the entry for k, cleared when new (evicting a neighbour if its set is full).
func (m *blockMap) put(k uint64) *blockEntry {
	if m.ents == nil {
		m.ents = make([]blockEntry, m.cap)
	}
	s := m.set(k)
	free := -1
	for i := range s {
		if s[i].used {
			if s[i].key == k {
				return &s[i]
			}
		} else if free < 0 {
			free = i
		}
	}
	if free < 0 {
		m.victim++
		free = int(m.victim % blockWays)
		m.n--
	}
	m.n++
	s[free] = blockEntry{key: k, used: true}
	return &s[free]
}

func (m *blockMap) del(k uint64) {
	if e := m.get(k); e != nil {
		*e = blockEntry{}
		m.n--
	}
}

func (m *blockMap) reset() {
	clear(m.ents)
	m.n = 0
}
