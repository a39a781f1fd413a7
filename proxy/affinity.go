package proxy

import (
	"math/rand/v2"
	"sync"
	"time"

	"github.com/zeebo/xxh3"
)

// affinity remembers which prefill/decode pair served a session (OpenAI `user` or
// X-Conversation-Id) so its next turn finds its KV cache; entries expire after a TTL
// and the least recently used go first beyond a bound.
//
// A session is remembered by its key's 128-bit hash, never its bytes: the key is the
// client's to choose (a `user` field may be megabytes long), and up to max sessions
// live for a TTL each, so a stored key would let any client hold max times its body
// size. The hash is seeded per process (not a keyed MAC, but a client sees neither
// seed nor hash); whatever two keys share an entry, it only picks endpoints: a
// session's next turn lands on another pair, no answer goes astray.
type affinity struct {
	ttl  time.Duration
	max  int
	seed uint64
	mu   sync.Mutex
	m    map[xxh3.Uint128]*affEntry
	head affEntry // sentinel of the LRU list; head.next is the most recent
}

type affEntry struct {
	key             xxh3.Uint128
	prefill, decode int
	expires         time.Time
	prev, next      *affEntry
}

func newAffinity(ttl time.Duration, max int) *affinity {
	a := &affinity{ttl: ttl, max: max, seed: rand.Uint64(), m: map[xxh3.Uint128]*affEntry{}}
	a.head.prev, a.head.next = &a.head, &a.head
	return a
}

func (a *affinity) unlink(e *affEntry) { e.prev.next, e.next.prev = e.next, e.prev }

func (a *affinity) pushFront(e *affEntry) {
	e.prev, e.next = &a.head, a.head.next
	a.head.next.prev = e
	a.head.next = e
}

// get returns the remembered pair for key; ok is false when absent or expired.
func (a *affinity) get(key []byte, now time.Time) (prefill, decode int, ok bool) {
	if a.max == 0 || len(key) == 0 {
		return 0, 0, false
	}
	h := xxh3.Hash128Seed(key, a.seed)
	a.mu.Lock()
	defer a.mu.Unlock()
	e := a.m[h]
	if e == nil {
		return 0, 0, false
	}
	if now.After(e.expires) {
		a.unlink(e)
		delete(a.m, e.key)
		return 0, 0, false
	}
	a.unlink(e)
	a.pushFront(e)
	e.expires = now.Add(a.ttl)
	return e.prefill, e.decode, true
}

// put remembers the pair for key, evicting the least recently used beyond max.
func (a *affinity) put(key []byte, prefill, decode int, now time.Time) {
	if a.max == 0 || len(key) == 0 {
		return
	}
	h := xxh3.Hash128Seed(key, a.seed)
	a.mu.Lock()
	defer a.mu.Unlock()
	if e := a.m[h]; e != nil {
		e.prefill, e.decode, e.expires = prefill, decode, now.Add(a.ttl)
		a.unlink(e)
		a.pushFront(e)
		return
	}
	for len(a.m) >= a.max {
		old := a.head.prev
		a.unlink(old)
		delete(a.m, old.key)
	}
	e := &affEntry{key: h, prefill: prefill, decode: decode, expires: now.Add(a.ttl)}
	a.m[e.key] = e
	a.pushFront(e)
}

// forget drops the sessions pinned to slot on either leg: its endpoint left the fleet,
// and the slot may go to another endpoint, which the sessions would otherwise follow
// for a TTL past KV-Exact. A fleet change is rare; the walk holds the lock once.
func (a *affinity) forget(slot int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for e := a.head.next; e != &a.head; {
		next := e.next
		if e.prefill == slot || e.decode == slot {
			a.unlink(e)
			delete(a.m, e.key)
		}
		e = next
	}
}

// len is the number of remembered sessions.
func (a *affinity) len() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.m)
}
