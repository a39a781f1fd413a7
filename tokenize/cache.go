package tokenize

import (
	"hash/maphash"
	"math/rand/v2"
	"strings"
	"sync/atomic"
)

// maxCachedWord is the longest word (bytes) kept in the word cache; longer words are rare and
// would crowd out the common ones.
const maxCachedWord = 64

// The word cache holds cacheSets*cacheWays entries.
const (
	cacheWays = 4
	cacheSets = 1 << 15 // a power of two
)

// wordCache maps a pre-tokenized word to its IDs. It is set-associative: a word's hash picks a
// set of four slots, each an atomic pointer to an immutable entry, so readers take no lock
// and writers just replace an entry (a full set evicts a random one). Shared by all
// encoders of a tokenizer.
type wordCache struct {
	seed  maphash.Seed
	slots []atomic.Pointer[cacheEntry]
}

type cacheEntry struct {
	word string
	ids  []uint32
}

func newWordCache() *wordCache {
	return &wordCache{seed: maphash.MakeSeed(), slots: make([]atomic.Pointer[cacheEntry], cacheSets*cacheWays)}
}

func (c *wordCache) set(w string) (uint64, []atomic.Pointer[cacheEntry]) {
	h := maphash.String(c.seed, w)
	i := (h & (cacheSets - 1)) * cacheWays
	return h, c.slots[i : i+cacheWays : i+cacheWays]
}

// get appends the cached IDs of w to dst.
func (c *wordCache) get(dst []uint32, w string) ([]uint32, bool) {
	_, set := c.set(w)
	for i := range set {
		if e := set[i].Load(); e != nil && e.word == w {
			return append(dst, e.ids...), true
		}
	}
	return dst, false
}

func (c *wordCache) put(w string, ids []uint32) {
	_, set := c.set(w)
	e := &cacheEntry{word: strings.Clone(w), ids: append([]uint32(nil), ids...)}
	for i := range set {
		if set[i].CompareAndSwap(nil, e) {
			return
		}
	}
	// A random victim: two hot words that share a set soon settle in different ways (a
	// victim picked by hash would make them evict each other forever).
	set[rand.Uint32()%cacheWays].Store(e)
}

// memoryBytes estimates the cache's current size.
func (c *wordCache) memoryBytes() int64 {
	n := int64(len(c.slots)) * 8
	for i := range c.slots {
		if e := c.slots[i].Load(); e != nil {
			n += 48 + int64(len(e.word)) + 4*int64(cap(e.ids))
		}
	}
	return n
}
