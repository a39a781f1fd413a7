package proxy

import (
	"github.com/kvgate/kvgate/hashcore"
	"github.com/kvgate/kvgate/shard"
)

// The mode-1 prefix trie: what kvgate itself sent to each prefill endpoint, as the
// chain of kvgate's fast block keys of every prompt it routed there.
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
type prefixTrie struct {
	inv *shard.Inventory
}

func newPrefixTrie(endpoints, maxKeys int) (*prefixTrie, error) {
	inv, err := shard.New(shard.Config{Endpoints: endpoints, MaxKeysPerEndpoint: maxKeys})
	if err != nil {
		return nil, err
	}
	return &prefixTrie{inv: inv}, nil
}

// trieKeys returns the request's fast keys, hashing them when KV-Exact did not need
// them (every endpoint matched on engine keys). Empty when the prompt was never
// tokenized (an earlier kv-miss) or holds no full block.
func (k *kvRouter) trieKeys(st *reqState) []uint64 {
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
	s := k.s
	best, _ := k.trie.inv.Score(keys, el, shard.Prefix, st.scores2)
	if best < 0 || st.scores2[best] == 0 {
		return
	}
	if st.scores2[best] < k.minBlocks || !s.loads.Under(best, s.loads.Bound(el, s.cfg.LoadFactor)) {
		return
	}
	// predicted stays 0: the trie is kvgate's memory, not an engine's report, and must
	// not feed the predicted-versus-delivered parity evidence.
	d.ep, d.route = best, RoutePrefixTrie
}

// trieRecord remembers that the request's prompt went to prefill endpoint ep. Blocks ep
// was already sent are no-ops for the inventory, so a conversation's next turn adds only
// its new blocks.
func (k *kvRouter) trieRecord(st *reqState, ep int) {
	if keys := k.trieKeys(st); len(keys) > 0 {
		k.trie.inv.Add(ep, keys)
	}
}
