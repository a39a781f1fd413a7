package tokenize

import (
	"hash/maphash"
	"strings"
	"sync"
)

// maxCachedWord is the longest word (bytes) kept in the word cache; longer words are rare and
// would crowd out the common ones.
const maxCachedWord = 64

const (
	cacheShards       = 64
	cacheShardEntries = 4096 // a full shard is cleared and refilled
)

// wordCache maps a pre-tokenized word to its IDs. It is split into shards, each behind its own
// mutex, so concurrent encoders rarely meet; IDs live in one arena per shard (no allocation
// per entry besides the key).
type wordCache struct {
	seed   maphash.Seed
	shards [cacheShards]cacheShard
}

type cacheShard struct {
	mu  sync.Mutex
	m   map[string]uint64 // word -> offset<<32 | count into ids
	ids []uint32
	_   [64]byte // keep shards on separate cache lines
}

func newWordCache() *wordCache {
	c := &wordCache{seed: maphash.MakeSeed()}
	for i := range c.shards {
		c.shards[i].m = make(map[string]uint64, 256)
	}
	return c
}

func (c *wordCache) shard(w string) *cacheShard {
	return &c.shards[maphash.String(c.seed, w)&(cacheShards-1)]
}

// get appends the cached IDs of w to dst.
func (c *wordCache) get(dst []uint32, w string) ([]uint32, bool) {
	s := c.shard(w)
	s.mu.Lock()
	v, ok := s.m[w]
	if ok {
		off, n := uint32(v>>32), uint32(v)
		dst = append(dst, s.ids[off:off+n]...)
	}
	s.mu.Unlock()
	return dst, ok
}

func (c *wordCache) put(w string, ids []uint32) {
	s := c.shard(w)
	s.mu.Lock()
	if len(s.m) >= cacheShardEntries {
		clear(s.m)
		s.ids = s.ids[:0]
	}
	if _, ok := s.m[w]; !ok {
		s.m[strings.Clone(w)] = uint64(len(s.ids))<<32 | uint64(len(ids))
		s.ids = append(s.ids, ids...)
	}
	s.mu.Unlock()
}

// memoryBytes estimates the cache's current size.
func (c *wordCache) memoryBytes() int64 {
	var n int64
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.Lock()
		n += int64(len(s.m))*(16+8+16) + int64(cap(s.ids))*4
		for k := range s.m {
			n += int64(len(k))
		}
		s.mu.Unlock()
	}
	return n
}
