// Package enginesim is a stand-in for an LLM inference engine (vLLM by default, SGLang and
// TensorRT-LLM flavours) that behaves like one where a router can see it: the OpenAI HTTP API,
// a real prefix cache over the engine's own block keys, the KV-cache events that cache
// produces, and a latency model in which cached tokens are cheaper than uncached ones.
//
// It computes no logits: output tokens are deterministic words. Everything a KV-aware router
// depends on (which blocks are cached where, when they are evicted, what cached_tokens says)
// follows vLLM's block manager.
package enginesim

import (
	"errors"
	"sync"
)

// ErrTooLarge means a request needs more blocks than the whole pool holds; it can never run.
var ErrTooLarge = errors.New("enginesim: request needs more KV blocks than the pool holds")

// EventKind says what a cache event reports.
type EventKind uint8

const (
	// Stored: blocks became cached (one batch per admitted request, chained on Parent).
	Stored EventKind = iota + 1
	// Removed: cached blocks were evicted.
	Removed
	// Cleared: the whole prefix cache was reset.
	Cleared
)

// Event is one prefix-cache change, in engine terms. For Stored, Tokens holds exactly the
// tokens of the blocks in Keys (len(Keys) * BlockSize) and Parent the key of the block before
// them when HasParent.
type Event struct {
	Kind      EventKind
	Keys      []uint64
	Parent    uint64
	HasParent bool
	Tokens    []uint32
	BlockSize int
	LoRAName  string
}

// Sink receives the pool's events in order. Publish is called with the pool's lock held, so
// it must not call back into the pool; it owns nothing in evs after returning.
type Sink interface {
	Publish(evs []Event)
}

const none = -1

// block is one KV block slot. A block is "cached" when hashed is set: its key is in the
// pool's index and a later request with the same prefix can reuse it.
type block struct {
	key        uint64
	hashed     bool
	ref        int32
	prev, next int32 // free-queue links; only meaningful while inFree
	inFree     bool
}

// Pool is a fixed set of KV blocks with vLLM's prefix-cache rules:
//   - a request reuses the longest run of cached leading blocks of its prompt, capped so that
//     at least one prompt token is computed (the engine needs a token to produce logits);
//   - reused blocks gain a reference; blocks nobody references sit in a free queue in LRU
//     order, still cached, until allocation takes them from the queue's head (evicting them);
//   - a finished request frees its blocks last-block-first onto the queue's tail, so a
//     prompt's tail is evicted before its shared head.
type Pool struct {
	mu         sync.Mutex
	blockSize  int
	blocks     []block
	head, tail int32 // free queue, head = next to evict
	nfree      int
	index      map[uint64]int32 // cached key -> block
	sink       Sink
	evs        []Event // scratch batch passed to sink

	// counters (under mu)
	queries, hits uint64 // in tokens, like vllm:prefix_cache_queries/hits
}

// NewPool returns a pool of n blocks of blockSize tokens. sink may be nil.
func NewPool(n, blockSize int, sink Sink) *Pool {
	if n < 1 {
		n = 1
	}
	p := &Pool{blockSize: blockSize, blocks: make([]block, n), index: make(map[uint64]int32, n), sink: sink, head: none, tail: none}
	for i := range p.blocks {
		p.pushTail(int32(i))
	}
	return p
}

// BlockSize is the number of tokens per block.
func (p *Pool) BlockSize() int { return p.blockSize }

// NumBlocks is the pool's capacity in blocks.
func (p *Pool) NumBlocks() int { return len(p.blocks) }

func (p *Pool) pushTail(i int32) {
	b := &p.blocks[i]
	b.prev, b.next, b.inFree = p.tail, none, true
	if p.tail != none {
		p.blocks[p.tail].next = i
	} else {
		p.head = i
	}
	p.tail = i
	p.nfree++
}

func (p *Pool) unlink(i int32) {
	b := &p.blocks[i]
	if b.prev != none {
		p.blocks[b.prev].next = b.next
	} else {
		p.head = b.next
	}
	if b.next != none {
		p.blocks[b.next].prev = b.prev
	} else {
		p.tail = b.prev
	}
	b.prev, b.next, b.inFree = none, none, false
	p.nfree--
}

// Alloc is the set of blocks one running request holds, in sequence order.
type Alloc struct {
	blocks []int32
	// CachedTokens is how many leading prompt tokens were served from the cache.
	CachedTokens int
}

// hitBlocks counts the leading keys present in the cache, capped at max.
func (p *Pool) hitBlocks(keys []uint64, max int) int {
	n := 0
	for n < len(keys) && n < max {
		if _, ok := p.index[keys[n]]; !ok {
			break
		}
		n++
	}
	return n
}

// maxHit is the most prompt blocks a request may take from the cache: vLLM always computes
// at least the last prompt token.
func (p *Pool) maxHit(promptLen int) int {
	if promptLen <= 0 {
		return 0
	}
	return (promptLen - 1) / p.blockSize
}

// Probe reports how many prompt tokens would be served from the cache right now.
func (p *Pool) Probe(keys []uint64, promptLen int) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.hitBlocks(keys, p.maxHit(promptLen)) * p.blockSize
}

// Acquire admits a request whose prompt has promptLen tokens (keys are the keys of its full
// blocks, tokens its token IDs) and which will generate up to maxNew tokens. It returns
// ok=false when the free blocks do not suffice now (the caller waits for a Release), and
// ErrTooLarge when they never will. On success the new full prompt blocks are cached and
// reported as one Stored event.
func (p *Pool) Acquire(keys []uint64, tokens []uint32, maxNew int, lora string) (a *Alloc, ok bool, err error) {
	promptLen := len(tokens)
	need := (promptLen + maxNew + p.blockSize - 1) / p.blockSize
	if need < 1 {
		need = 1
	}
	if need > len(p.blocks) {
		return nil, false, ErrTooLarge
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	hit := p.hitBlocks(keys, p.maxHit(promptLen))
	// Reused blocks sitting in the free queue stop being allocatable once we reference them.
	reusedFree := 0
	for _, k := range keys[:hit] {
		if p.blocks[p.index[k]].ref == 0 {
			reusedFree++
		}
	}
	fresh := need - hit
	if fresh > p.nfree-reusedFree {
		return nil, false, nil
	}
	p.queries += uint64(promptLen)
	p.hits += uint64(hit * p.blockSize)
	a = &Alloc{blocks: make([]int32, 0, need), CachedTokens: hit * p.blockSize}
	for _, k := range keys[:hit] {
		i := p.index[k]
		b := &p.blocks[i]
		if b.ref == 0 {
			p.unlink(i)
		}
		b.ref++
		a.blocks = append(a.blocks, i)
	}
	p.evs = p.evs[:0]
	var removed []uint64
	for j := 0; j < fresh; j++ {
		i := p.head
		p.unlink(i)
		b := &p.blocks[i]
		if b.hashed {
			delete(p.index, b.key)
			b.hashed = false
			removed = append(removed, b.key)
		}
		b.ref = 1
		a.blocks = append(a.blocks, i)
	}
	if len(removed) > 0 {
		p.evs = append(p.evs, Event{Kind: Removed, Keys: removed})
	}
	// Cache the prompt's new full blocks. A key already cached by a concurrent request
	// stays with its first block (vLLM keeps one block per hash); ours stays private.
	full := promptLen / p.blockSize
	if full > len(keys) {
		full = len(keys)
	}
	var st Event
	for j := hit; j < full; j++ {
		k := keys[j]
		if _, dup := p.index[k]; dup {
			continue
		}
		b := &p.blocks[a.blocks[j]]
		b.key, b.hashed = k, true
		p.index[k] = a.blocks[j]
		if st.Kind == 0 {
			st = Event{Kind: Stored, BlockSize: p.blockSize, LoRAName: lora}
			if j > 0 {
				st.Parent, st.HasParent = keys[j-1], true
			}
		} else if keys[j-1] != st.Keys[len(st.Keys)-1] {
			// a duplicate broke the run: start a new event chained on the previous key
			p.evs = append(p.evs, st)
			st = Event{Kind: Stored, BlockSize: p.blockSize, LoRAName: lora, Parent: keys[j-1], HasParent: true}
		}
		st.Keys = append(st.Keys, k)
		st.Tokens = append(st.Tokens, tokens[j*p.blockSize:(j+1)*p.blockSize]...)
	}
	if st.Kind != 0 {
		p.evs = append(p.evs, st)
	}
	p.flush()
	return a, true, nil
}

// Release returns a finished request's blocks: last block first onto the free queue's tail.
func (p *Pool) Release(a *Alloc) {
	if a == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for j := len(a.blocks) - 1; j >= 0; j-- {
		i := a.blocks[j]
		b := &p.blocks[i]
		b.ref--
		if b.ref == 0 {
			p.pushTail(i)
		}
	}
	a.blocks = nil
}

// Reset drops every cached key (blocks in use stay allocated but uncached) and reports
// AllBlocksCleared, like vLLM's /reset_prefix_cache.
func (p *Pool) Reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.forgetLocked()
	p.evs = append(p.evs[:0], Event{Kind: Cleared})
	p.flush()
}

// forget drops every cached key without an event: what a restarted engine process
// holds (it publishes nothing about the cache it lost).
func (p *Pool) forget() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.forgetLocked()
}

func (p *Pool) forgetLocked() {
	for i := range p.blocks {
		p.blocks[i].hashed = false
	}
	clear(p.index)
}

func (p *Pool) flush() {
	if p.sink != nil && len(p.evs) > 0 {
		p.sink.Publish(p.evs)
	}
	p.evs = p.evs[:0]
}

// PoolStats is a snapshot of the pool.
type PoolStats struct {
	Blocks, Free, Cached int
	// QueryTokens and HitTokens count prompt tokens looked up and served from the cache.
	QueryTokens, HitTokens uint64
}

// Stats returns a snapshot.
func (p *Pool) Stats() PoolStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return PoolStats{Blocks: len(p.blocks), Free: p.nfree, Cached: len(p.index), QueryTokens: p.queries, HitTokens: p.hits}
}

// Cached reports whether key is cached.
func (p *Pool) Cached(key uint64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.index[key]
	return ok
}
