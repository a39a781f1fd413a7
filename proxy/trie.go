package proxy

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/hashcore"
	"github.com/kvgate/kvgate/shard"
)

// The mode-1 prefix trie: what kvgate itself sent to each prefill endpoint, as the
// chain of block keys of every prompt it routed there (trieKeys: the rule's engine keys or
// kvgate's fast keys).
//
// Why it exists beside the inventory: a prefill engine publishes a prompt's blocks only
// once it has computed them, so for the length of a prefill (and any event lag) the
// inventory does not know where that prefix is going. Requests that share it and arrive
// meanwhile, the usual burst of one system prompt, would all miss KV-Exact and spread
// over the pool by load, each prefilling the same prefix again. The trie remembers the
// decision the moment it is made.
//
// Why an inventory is a trie here: block keys are chained, so one key names its whole
// prefix and the keys of a prompt are a path from the root; the leading run of a
// prompt's keys an endpoint holds (shard.Prefix) is the longest common prefix with what
// was sent there. Memory is bounded per endpoint (-pd-prefix-trie-keys): at the bound an
// older key of the endpoint makes room.
//
// Its place in the ladder: after KV-Exact (the engines' own word on what they hold),
// before the load tier: DESIGN's "KV-Exact (tier 1.5)" between session affinity and the
// trie. It answers only when KV-Exact found no endpoint holding enough of the prompt
// (kv-miss no_worker or shallow), and its pick must be under the load bound.
//
// Mode 3 uses the same inventory as its pending entries (-kv-pending-ttl): there the
// engines' events are the record, and what kvgate sent only has to bridge the prefill and
// the event lag, so entries live for one to two TTLs: records go to the current
// generation, scoring reads both, and each TTL the older generation is emptied and
// becomes the current one.
type prefixTrie struct {
	// ttl > 0: prev is the older generation, scored beside inv; turned is when the
	// generations last turned (unix nanos).
	ttl    time.Duration
	prev   atomic.Pointer[shard.Inventory]
	cur    atomic.Pointer[shard.Inventory]
	turned atomic.Int64
	mu     sync.Mutex
}

func newPrefixTrie(endpoints, maxKeys int, ttl time.Duration) (*prefixTrie, error) {
	cfg := shard.Config{Endpoints: endpoints, MaxKeysPerEndpoint: maxKeys}
	inv, err := shard.New(cfg)
	if err != nil {
		return nil, err
	}
	t := &prefixTrie{ttl: ttl}
	t.cur.Store(inv)
	if ttl > 0 {
		old, err := shard.New(cfg)
		if err != nil {
			return nil, err
		}
		t.prev.Store(old)
		t.turned.Store(time.Now().UnixNano())
	}
	return t, nil
}

// add records keys as sent to ep, turning the generations when a TTL has passed. mask
// and scores are scratch (the trie's endpoints long).
//
// A follow-up turn re-sends its earlier turns, whose keys the current generation holds
// for ep already, and Add finds each of those held and changes nothing, after taking its
// shard's lock. A lock-free Prefix score over the current generation skips that leading
// run first, so Add sees only the keys past it: the same inventory afterwards.
func (t *prefixTrie) add(ep int, keys []uint64, mask shard.Mask, scores []int32) {
	if t.ttl > 0 {
		if now := time.Now().UnixNano(); now-t.turned.Load() >= int64(t.ttl) {
			t.mu.Lock()
			if age := now - t.turned.Load(); age >= int64(t.ttl) {
				old := t.prev.Load()
				old.ClearAll()
				if age >= 2*int64(t.ttl) {
					t.cur.Load().ClearAll() // idle for two TTLs: both generations expired
				} else {
					t.prev.Store(t.cur.Load())
					t.cur.Store(old)
				}
				t.turned.Store(now)
			}
			t.mu.Unlock()
		}
	}
	cur := t.cur.Load()
	clear(mask)
	mask.Set(ep)
	cur.Score(keys, mask, shard.Prefix, scores)
	if held := int(scores[ep]); held < len(keys) {
		cur.Add(ep, keys[held:])
	}
}

// clearEndpoint forgets what kvgate sent to ep (it left the fleet; its slot is reused).
func (t *prefixTrie) clearEndpoint(ep int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.cur.Load().ClearEndpoint(ep)
	if p := t.prev.Load(); p != nil {
		p.ClearEndpoint(ep)
	}
}

// best scores keys' leading run per eligible endpoint into scores and returns the
// deepest, over the generations still within their time: without a turn (no traffic) the
// older generation stops counting one TTL after the last turn and the current one after
// two, so no entry answers for more than two TTLs.
func (t *prefixTrie) best(keys []uint64, el shard.Mask, scores, tmp []int32) int {
	cur, prev := t.live()
	if cur == nil {
		clear(scores)
		return -1
	}
	best, _ := cur.Score(keys, el, shard.Prefix, scores)
	if p := prev; p != nil {
		p.Score(keys, el, shard.Prefix, tmp)
		for i := range scores {
			if tmp[i] > scores[i] {
				scores[i] = tmp[i]
				if best < 0 || scores[i] > scores[best] {
					best = i
				}
			}
		}
	}
	return best
}

// live is the generations still within their time (see best).
func (t *prefixTrie) live() (cur, prev *shard.Inventory) {
	cur, prev = t.cur.Load(), t.prev.Load()
	if t.ttl > 0 {
		switch age := time.Now().UnixNano() - t.turned.Load(); {
		case age >= 2*int64(t.ttl):
			return nil, nil
		case age >= int64(t.ttl):
			prev = nil
		}
	}
	return cur, prev
}

// held reports in tmp which eligible endpoints hold key (either generation).
func held(cur, prev *shard.Inventory, key []uint64, el shard.Mask, tmp, tmp2 []int32) bool {
	any := false
	if best, _ := cur.Score(key, el, shard.Overlap, tmp); best >= 0 && tmp[best] > 0 {
		any = true
	}
	if prev != nil {
		if best, _ := prev.Score(key, el, shard.Overlap, tmp2); best >= 0 && tmp2[best] > 0 {
			any = true
			for i, v := range tmp2 {
				tmp[i] |= v
			}
		}
	}
	return any
}

// score raises matched[i] to the depth of the prompt kvgate sent endpoint i, for the
// endpoints holding the deepest prefix sent past what the inventory already shows
// (matched holds the inventory's counts on entry). Chained keys make that a binary search:
// key j names blocks 0..j, and kvgate records a prompt's keys from where the chosen
// endpoint's reported blocks end (trieRecord), so along a prompt "some endpoint was sent
// key j" holds from the deepest reported block up to the deepest sent one and not after:
// log2(blocks) lookups instead of one per block.
func (t *prefixTrie) score(keys []uint64, el shard.Mask, tmp, tmp2, matched []int32) {
	cur, prev := t.live()
	if cur == nil {
		return
	}
	from := 0
	for i, m := range matched {
		if el.Has(i) {
			from = max(from, int(m))
		}
	}
	lo, hi := from, len(keys)
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if held(cur, prev, keys[mid:mid+1], el, tmp, tmp2) {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	if lo == from || !held(cur, prev, keys[lo-1:lo], el, tmp, tmp2) {
		return
	}
	for i, v := range tmp {
		if v > 0 && el.Has(i) && int32(lo) > matched[i] {
			matched[i] = int32(lo)
		}
	}
}

// keys and memory of both generations, for /metrics.
func (t *prefixTrie) stats() (keys int, bytes int64) {
	for _, inv := range [2]*shard.Inventory{t.cur.Load(), t.prev.Load()} {
		if inv != nil {
			keys += inv.Len()
			bytes += inv.MemoryBytes()
		}
	}
	return keys, bytes
}

// trieKeys returns the keys the trie records and scores the request's prompt by: the
// rule's engine keys when every eligible endpoint is keyed by them (KV-Exact hashed them
// already, often through the chain memo), else kvgate's fast keys, hashed here when
// KV-Exact did not need them. Either chain names a prefix by its last key, which is all
// the trie needs; the two never collide in practice (64-bit keys of unrelated hashes),
// so a request keyed one way only misses what was recorded the other way, which happens
// only while the eligible endpoints' contracts change (an endpoint that fails parity and
// falls back to fast keys, or the only endpoints of another contract excluded): its
// pending entries then go unseen for a TTL. Empty when the prompt was never tokenized (an
// earlier kv-miss) or holds no full block.
func (k *kvRouter) trieKeys(st *reqState) []uint64 {
	if st.trieEngine {
		return st.keys
	}
	if len(st.fastKeys) == 0 && len(st.tokens) >= k.blockSize {
		var exp *hashcore.Extras
		if st.ex.LoRAName != "" || st.ex.CacheSalt != "" {
			exp = &st.ex
		}
		st.fastKeys = hashcore.Keys(k.fast, st.fastKeys[:0], st.tokens, exp)
	}
	return st.fastKeys
}

// trieRoute is the ladder's trie tier: after a KV-Exact miss for want of a holder, the
// eligible prefill endpoint that was sent the longest leading run of the prompt's
// blocks, if that run is deep enough (-kv-min-match-tokens) and the endpoint is under
// its load bound.
func (k *kvRouter) trieRoute(st *reqState, el shard.Mask, d *decision) {
	if d.route != RouteMissNoWorker && d.route != RouteMissShallow {
		return
	}
	keys := k.trieKeys(st)
	if len(keys) == 0 {
		return
	}
	el = k.ranks.expand(el, st.slotEl)
	n := k.ranks.cands // the trie knows candidates; tier slots' scratch lies past them
	best := k.trie.best(keys, el, st.scores2[:n], st.scores3[:n])
	if best < 0 || st.scores2[best] == 0 {
		return
	}
	if st.scores2[best] < k.minBlocks || !k.slotLoads.Under(best, k.slotLoads.Bound(el, k.s.cfg.KV.LoadFactor)) {
		return
	}
	// predicted stays 0: the trie is kvgate's memory, not an engine's report, and must
	// not feed the predicted-versus-delivered parity evidence.
	k.pick(d, best)
	d.route = RoutePrefixTrie
}

// trieRecord remembers that the request's prompt went to endpoint ep, past the blocks
// the engine itself reported holding (st.scores: an engine that holds n of a prompt's
// chained blocks holds, as a rule, its first n), so a conversation's next turn adds only
// its new blocks.
// Mode 1's trie records whole prompts: its tier scores the leading run (best).
func (k *kvRouter) trieRecord(st *reqState, ep int) { // ep: the inventory slot
	keys := k.trieKeys(st)
	from := 0
	if k.trie.ttl > 0 {
		from = min(int(st.scores[ep]), len(keys))
	}
	if from < len(keys) {
		n := k.ranks.cands
		k.trie.add(ep, keys[from:], st.recMask, st.scores3[:n])
	}
}
