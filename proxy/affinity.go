package proxy

import (
	"sync"
	"time"
)

// affinity remembers which prefill/decode pair served a session (OpenAI `user` or
// X-Conversation-Id) so its next turn finds its KV cache; entries expire after a TTL
// and the least recently used go first beyond a bound.
type affinity struct {
	ttl  time.Duration
	max  int
	mu   sync.Mutex
	m    map[string]*affEntry
	head affEntry // sentinel of the LRU list; head.next is the most recent
}

type affEntry struct {
	key             string
	prefill, decode int
	expires         time.Time
	prev, next      *affEntry
}

func newAffinity(ttl time.Duration, max int) *affinity {
	a := &affinity{ttl: ttl, max: max, m: map[string]*affEntry{}}
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
	a.mu.Lock()
	defer a.mu.Unlock()
	e := a.m[string(key)]
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
	a.mu.Lock()
	defer a.mu.Unlock()
	if e := a.m[string(key)]; e != nil {
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
	e := &affEntry{key: string(key), prefill: prefill, decode: decode, expires: now.Add(a.ttl)}
	a.m[e.key] = e
	a.pushFront(e)
}

// len is the number of remembered sessions.
func (a *affinity) len() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.m)
}
